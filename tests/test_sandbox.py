"""Verifiers under a time limit (``tasks/sandbox.py``), and property-based tests of every verifier and of the
config parser."""

from __future__ import annotations

import importlib.util
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from tests.conftest import examples
from hypothesis import strategies as st

from gspo_bench.config import ConfigError, load_config, parse_sets
from gspo_bench.tasks import load_task
from gspo_bench.tasks.sandbox import VerifierSandbox
from gspo_bench.tasks.verifiers import VERIFIERS

HAS_MATH = importlib.util.find_spec("math_verify") is not None
LIMIT = 1.0
HUGE = ["9**9**9**9", "\\boxed{9^{9^{9^{9}}}}"]  # math-verify spends seconds (or forever) on these


def test_math_verify_past_its_limit_scores_zero_counts_and_stays_quiet(capfd):
    if not HAS_MATH:
        pytest.skip("math-verify is not installed (pip install 'gspo-bench[math]')")
    box = VerifierSandbox("math_verify", {}, LIMIT)
    box.score(["\\boxed{1}"], ["1"])  # worker up, imports done
    t0 = time.perf_counter()
    rewards, late = box.score(HUGE + ["\\boxed{2}", "$\\frac{1}{2}$"], ["1", "1", "2", "0.5"])
    took = time.perf_counter() - t0
    assert rewards == [0.0, 0.0, 1.0, 1.0] and late == 2 and box.timeouts == 2
    # two limits, two fresh workers, two quick answers: far from math-verify's own 5 s per call
    assert took < 2 * LIMIT + 3.0
    captured = capfd.readouterr()
    assert "9^{9" not in captured.err + captured.out and "9**9" not in captured.err + captured.out


def test_a_slow_verifier_in_a_run_is_a_zero_and_a_verify_timeouts_metric(mixed_task, tracking_uri, monkeypatch):
    import mlflow

    from gspo_bench.train.runner import run
    from gspo_bench.tasks import verifiers
    from tests.conftest import tiny_overrides

    def sometimes_slow(completion: str, answer: str) -> float:
        if len(completion) % 5 == 0:
            time.sleep(30)  # far past the limit: only the sandbox can stop it
        return float(len(completion) % 2 == 0)

    monkeypatch.setitem(verifiers.VERIFIERS, "test_even_length", sometimes_slow)  # the forked worker sees it
    o = tiny_overrides(mixed_task, tracking_uri, rollout={"verify_timeout": 0.2},
                       train={"steps": 1, "eval_samples": 0}, tracking={"experiment": "slow-verifier"})
    t0 = time.perf_counter()
    [res] = run(load_config("smoke", overrides={**o, "algos": ["grpo"]}), log=lambda *a, **k: None)
    assert res.status == "FINISHED" and time.perf_counter() - t0 < 300
    timeouts = mlflow.MlflowClient(tracking_uri).get_metric_history(res.run_id, "verify/timeouts")
    assert timeouts and timeouts[0].value >= 1  # 16 completions, a fifth of them slow, give at least one


def test_a_hang_mid_batch_zeroes_that_completion_only(monkeypatch):
    from gspo_bench.tasks import sandbox, verifiers

    def hangs_on_h(completion: str, answer: str) -> float:
        if completion == "h":
            time.sleep(60)  # far past the limit: only the sandbox can stop it
        return float(completion == answer)

    monkeypatch.setitem(verifiers.VERIFIERS, "test_hangs_on_h", hangs_on_h)  # the forked worker sees it
    monkeypatch.setattr(sandbox, "CHUNK", 3)  # batches of 3 inside one call, the buffer reused
    box = VerifierSandbox("test_hangs_on_h", {}, 0.3)
    completions = ["1", "2", "x", "h", "5", "6", "h", "8"]
    answers = ["1", "0", "x", "h", "5", "0", "h", "8"]
    t0 = time.perf_counter()
    rewards, late = box.score(completions, answers)
    # every reward before, between and after the two hangs is the verifier's own; each hang is a 0
    assert rewards == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0] and late == 2 and box.timeouts == 2
    assert time.perf_counter() - t0 < 2 * 0.3 + 5.0
    assert box.score(["7"], ["7"]) == ([1.0], 0)  # a fresh worker serves the next call


def test_a_verifier_raising_on_a_malformed_answer_is_an_error_naming_it():
    box = VerifierSandbox("countdown", {}, LIMIT)
    with pytest.raises(ValueError, match="countdown.*not-an-answer"):
        box.score(["1+1"], ["not-an-answer"])
    assert box.score(["12*3+5"], ["12 5 3|41"]) == ([1.0], 0)  # the worker still serves


def test_timeout_zero_calls_in_process_and_a_bad_limit_is_refused():
    assert VerifierSandbox("exact", {}, 0).score(["42", "41"], ["42", "42"]) == ([1.0, 0.0], 0)
    for bad in (-1, "1s"):
        with pytest.raises(ValueError, match="timeout"):
            VerifierSandbox("exact", {}, bad)
    with pytest.raises(ConfigError, match="rollout.verify_timeout"):
        load_config("smoke", overrides={"rollout": {"verify_timeout": -0.5}})


# -- properties: every verifier, any completion ---------------------------------------------------------------
def _answers() -> dict[str, list[str]]:
    arith, pad, countdown = (load_task(n, 0) for n in ("arith", "arith_scratchpad", "countdown"))
    take = lambda t: list(t.eval.select(range(8))["answer"])  # noqa: E731
    out = {"exact": take(arith), "last_line": take(arith), "scratchpad": take(pad), "countdown": take(countdown),
           "gsm8k": ["Natalia sold 48 clips <<48/2=24>>\n#### 72", "#### 1,000", "#### -3", "#### 0.5"]}
    if HAS_MATH:
        out["math_verify"] = ["72", "\\frac{1}{2}", "#### 1,000", "x^2"]
    return out


ANSWERS = _answers()
BOXES = {name: VerifierSandbox(name, {}, LIMIT) for name in ANSWERS}
# text a model could emit, and text built to hurt: digits and operators in long runs, nesting, big powers
COMPLETIONS = st.one_of(
    st.text(max_size=200),
    st.text(alphabet="0123456789+-*/^()=.,#\\{}$ boxed\n", max_size=400),
    st.builds(lambda d, n: "(" * n + d + ")" * n, st.text("0123456789", min_size=1, max_size=5),
              st.integers(0, 3000)),
    st.builds(lambda a, b: f"{a}**{b}**{b}", st.integers(2, 99), st.integers(2, 99)),
    st.sampled_from(HUGE),
)


def test_every_registered_verifier_is_covered():
    assert set(VERIFIERS) - {"test_even_length"} <= set(ANSWERS) | ({"math_verify"} if not HAS_MATH else set())


# math_verify's parser runs into the time limit on most hostile texts (about a second each), so it gets fewer
# examples than the verifiers that answer in microseconds
SLOW = {"math_verify"}


def _scores_in_0_1_within_the_limit(name, completions, pick):
    answers = ANSWERS[name]
    t0 = time.perf_counter()
    rewards, late = BOXES[name].score(completions, [answers[pick % len(answers)]] * len(completions))
    took = time.perf_counter() - t0
    assert len(rewards) == len(completions) and all(0.0 <= r <= 1.0 for r in rewards)
    assert 0 <= late <= len(completions)
    # each completion at most the limit, plus a fresh worker (a fork) after each timeout
    assert took < LIMIT * len(completions) + 2.0 * (late + 1)


@pytest.mark.parametrize("name", sorted(set(ANSWERS) - SLOW))
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completions=st.lists(COMPLETIONS, min_size=1, max_size=6), pick=st.integers(0, 7))
def test_any_completion_scores_in_0_1_within_the_limit(name, completions, pick):
    _scores_in_0_1_within_the_limit(name, completions, pick)


@pytest.mark.parametrize("name", sorted(set(ANSWERS) & SLOW))
@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 1-2 s each
@given(completions=st.lists(COMPLETIONS, min_size=1, max_size=6), pick=st.integers(0, 7))
def test_any_completion_scores_in_0_1_within_the_limit_slow_verifiers(name, completions, pick):
    _scores_in_0_1_within_the_limit(name, completions, pick)


# -- properties: the config parser says ConfigError or builds a config, nothing else --------------------------
KEYS = ["train.lr", "train.steps", "train.checkpoint_every", "rollout.temperature", "rollout.group_size",
        "rollout.verify_timeout", "loss.eps_low", "loss.eps_high", "seeds", "algos", "task", "model.name",
        "rollout.engine", "collapse.window", "nosuch.field", "train", "", "train.nosuch"]
VALUES = st.one_of(st.text(max_size=30), st.sampled_from(["null", "true", "[0, 1]", "{a: 1}", "-1", "1e309",
                                                          "nan", "!!python/object:os.system", "'x", "[", "0x10"]),
                   st.floats(allow_nan=True).map(str), st.integers(-10**20, 10**20).map(str))


@settings(max_examples=examples(300), deadline=None)
@example(items=["train.lr=\x1f\n"])  # found by CI: a raw newline once split the error across lines
@example(items=["train.lr=\n"])
@example(items=["tra\nin.lr=1"])
@given(items=st.lists(st.tuples(st.sampled_from(KEYS), VALUES).map(lambda kv: f"{kv[0]}={kv[1]}")
                      | st.text(max_size=40), max_size=4))
def test_any_set_items_give_a_config_or_one_config_error(items):
    try:
        cfg = load_config("smoke", overrides=parse_sets(items))
    except ConfigError as e:
        assert str(e) and "\n" not in str(e).strip()
    else:
        assert cfg.train.steps > 0 and cfg.rollout.group_size >= 2


JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(), st.text(max_size=10)),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                       max_leaves=8)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides=st.dictionaries(st.sampled_from(["train", "rollout", "loss", "collapse", "model", "seeds", "algos",
                                                  "tracking", "warmstart", "moe", "junk"]), JSONISH, max_size=3))
def test_any_override_tree_gives_a_config_or_one_config_error(overrides):
    try:
        load_config("smoke", overrides=overrides)
    except ConfigError as e:
        assert str(e)
