"""The held-out evaluation (gspo_bench.algorithms.evaluation): a step-0 result reused by the runs of one seed."""

from __future__ import annotations

import pytest
import torch

from gspo_bench.algorithms import evaluation
from gspo_bench.config import load_config
from gspo_bench.rollout.draws import StreamDraws
from gspo_bench.rollout.evaluation import Evaluator
from gspo_bench.train import runner
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides


def _runs(mixed_task, tracking_uri, algos, experiment):
    cfg = load_config("smoke", overrides={**tiny_overrides(mixed_task, tracking_uri), "algos": algos,
                                          "tracking": {"tracking_uri": tracking_uri, "experiment": experiment}})
    return {r.algo: r for r in run(cfg, log=lambda *a: None)}


def test_a_reused_start_eval_leaves_the_run_exactly_as_without_it(mixed_task, tracking_uri, monkeypatch):
    evaluated, shared = [], []
    orig = Evaluator.evaluate
    monkeypatch.setattr(Evaluator, "evaluate", lambda self, data, policy, rows, step=0: evaluated.append(len(rows["prompt"]))
                        or orig(self, data, policy, rows, step))

    class Seen(evaluation.StartEvals):  # the runner's, one per seed: kept here to look into
        def __init__(self, source):
            super().__init__(source)
            shared.append(self)

    monkeypatch.setattr(runner, "StartEvals", Seen)
    both = _runs(mixed_task, tracking_uri, ["grpo", "dapo"], "start-eval-shared")
    assert all(r.status == "FINISHED" for r in both.values())
    # 3 evaluations per run (steps 0, 1, 2) of 8 prompts in one batch; dapo's step 0 came from grpo's
    # (its rollout settings differ, those of its evaluation do not)
    assert len(evaluated) == 5
    [cache] = shared  # one seed, one cache, holding one evaluation
    assert len(cache.done) == 1
    assert both["dapo"].eval_log[0] == both["grpo"].eval_log[0]
    # 2 samples per prompt: pass@1 from them (the sampled pass@1), the default's pass@4 left out
    last = both["grpo"].eval_log[-1][1]
    assert last["eval/pass_at_1"] == pytest.approx(last["eval/pass1_sampled"]) and "eval/pass_at_4" not in last
    # the reused evaluation's 8 x (1 greedy + 2 sampled) completions were not generated again
    assert both["dapo"].completions["eval"] == both["grpo"].completions["eval"] - 8 * 3
    # dapo alone, nothing cached: every metric of every step is the same, to the digit (the sampled eval
    # and the training rollouts drew from the random state the reused evaluation restored)
    alone = _runs(mixed_task, tracking_uri, ["dapo"], "start-eval-alone")["dapo"]
    assert len(evaluated) == 8
    assert alone.eval_log == both["dapo"].eval_log
    assert alone.completions["eval"] == both["grpo"].completions["eval"]
    for step in ("first", "last"):
        assert _untimed(getattr(alone, step)) == _untimed(getattr(both["dapo"], step))


def _untimed(metrics: dict) -> dict:
    # wall times and rates differ from run to run; every other metric must not
    kept = {k: v for k, v in metrics.items() if not k.startswith(("time/", "throughput/"))}
    assert "reward/mean" in kept and "train/loss" in kept
    return kept


class _DM:
    """What ``StartEvals.key`` reads from a datamodule."""

    def __init__(self, spec="arith", samples=2):
        self.task = type("T", (), {"spec": spec})()
        self.s = type("S", (), {"engine": "auto", "max_new_tokens": 8, "temperature": 1.0, "verify_timeout": 1.0,
                                "dynamic_sampling": False, "seeding": "stream"})()
        self.rank, self.world, self.seed = 0, 1, 0
        self.draws = StreamDraws()  # its stream starts from torch's state at the first look
        self.evaluator = Evaluator({"prompt": ["1+1="], "answer": ["2"]}, self.s, samples=samples)


def test_the_start_eval_key_changes_with_source_rows_settings_and_random_state():
    shared = evaluation.StartEvals("/cache/warmstart/arith-tiny-dense-s0")
    torch.manual_seed(0)
    key = shared.key(_DM())
    torch.manual_seed(0)
    assert shared.key(_DM()) == key
    torch.manual_seed(0)
    assert shared.key(_DM(samples=3)) != key
    torch.manual_seed(0)
    assert shared.key(_DM(spec="other")) != key
    torch.manual_seed(0)
    dm = _DM()
    dm.s.temperature = 0.7
    assert shared.key(dm) != key
    torch.manual_seed(0)
    dm = _DM()
    dm.s.dynamic_sampling = True  # a training-only setting (DAPO's): the same evaluation
    assert shared.key(dm) == key
    torch.manual_seed(1)
    assert shared.key(_DM()) != key
    torch.manual_seed(0)
    dm = _DM()
    dm.evaluator.rows = {"prompt": ["1+1="], "answer": ["3"]}
    assert shared.key(dm) != key
    torch.manual_seed(0)  # another warm start: other weights
    assert evaluation.StartEvals("/cache/warmstart/arith-tiny-dense-s1").key(_DM()) != key


# -- unbiased pass@k ---------------------------------------------------------------------------------------------
def test_pass_at_k_is_the_unbiased_estimator_by_hand():
    from gspo_bench.rollout.evaluation import pass_at_k

    # n = 4 samples, c = 1 correct: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6; pass@4 = 1 (the one is drawn)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    # n = 5, c = 2, k = 3: the draws of 3 with no correct one: C(3,3) = 1 of C(5,3) = 10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    # by enumeration: the fraction of k-subsets of the n samples holding a correct one
    from itertools import combinations

    samples = [1, 0, 1, 0, 0, 0]
    for k in range(1, 7):
        subsets = list(combinations(samples, k))
        assert pass_at_k(6, 2, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_the_evaluator_logs_pass_at_k_from_its_samples():
    import torch

    from gspo_bench.config import RolloutConfig
    from gspo_bench.rollout.engine import Generation
    from gspo_bench.rollout.evaluation import Evaluator

    class Data:  # two prompts, 4 samples each: prompt a has 1 correct sample, prompt b 3
        def play(self, *args, **kw):  # a single-turn task: no episodes to play
            return None

        def generate(self, model, prompts, **kw):
            return Generation(None, None, 0, None, None, list(prompts))

        def loader_generator(self):
            return None

        def score(self, texts, answers):
            if len(texts) == 2:  # the greedy pass: a wrong, b right
                return torch.tensor([0.0, 1.0])
            return torch.tensor([1.0, 0.0, 0.0, 0.0] + [1.0, 1.0, 0.0, 1.0])

    rows = {"prompt": ["a", "b"], "answer": ["1", "2"]}
    ev = Evaluator(rows, RolloutConfig(max_new_tokens=4), samples=4, ks=(1, 2, 4, 8))
    assert ev.ks == (1, 2, 4)  # pass@8 has no estimate from 4 samples
    m = ev.run(Data(), None)
    assert m["eval/pass1"] == 0.5 and m["eval/pass1_sampled"] == pytest.approx(4 / 8)
    # per prompt 1 - C(4 - c, k) / C(4, k), averaged: k=1 (1/4 + 3/4) / 2; k=2 (1/2 + 1) / 2; k=4 (1 + 1) / 2
    assert m["eval/pass_at_1"] == pytest.approx(0.5) and m["eval/pass_at_2"] == pytest.approx(0.75)
    assert m["eval/pass_at_4"] == 1.0 and "eval/pass_at_8" not in m
    # mean@k: each prompt's mean reward over its first k samples, averaged over prompts:
    # k=1 (1 + 1) / 2; k=2 (1/2 + 1) / 2; k=4 (1/4 + 3/4) / 2 = the mean reward
    assert m["eval/mean_at_1"] == 1.0 and m["eval/mean_at_2"] == pytest.approx(0.75)
    assert m["eval/mean_at_4"] == pytest.approx(0.5) == m["eval/reward_mean"] and "eval/mean_at_8" not in m
    assert set(Evaluator(rows, RolloutConfig(max_new_tokens=4), samples=0, ks=(1, 4)).run(Data(), None)) == {
        "eval/pass1", "eval/pass1_even", "eval/pass1_odd"}


def test_the_evaluator_logs_greedy_pass1_on_the_two_halves_of_its_rows():
    import torch

    from gspo_bench.config import RolloutConfig
    from gspo_bench.rollout.evaluation import Evaluator

    hits = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0, "e": 0.0}

    class Data:  # greedy only; prompts a, c, e sit at even indices (0, 2, 4), b and d at odd ones
        def play(self, *args, **kw):  # a single-turn task: no episodes to play
            return None

        def generate(self, model, prompts, **kw):
            from gspo_bench.rollout.engine import Generation

            return Generation(None, None, 0, None, None, list(prompts))

        def loader_generator(self):
            return None

        def score(self, texts, answers):
            return torch.tensor([hits[t] for t in texts])

    rows = {"prompt": list("abcde"), "answer": list("12345")}
    for batch_size in (1, 2, 5):  # the halves do not depend on how the rows are batched
        m = Evaluator(rows, RolloutConfig(max_new_tokens=4), batch_size=batch_size).run(Data(), None)
        # all: 3 of 5; even (a, c, e): 2 of 3; odd (b, d): 1 of 2
        assert m["eval/pass1"] == pytest.approx(3 / 5)
        assert m["eval/pass1_even"] == pytest.approx(2 / 3) and m["eval/pass1_odd"] == pytest.approx(1 / 2)
    # one row has no halves to compare
    one = {"prompt": ["a"], "answer": ["1"]}
    assert set(Evaluator(one, RolloutConfig(max_new_tokens=4)).run(Data(), None)) == {"eval/pass1"}
