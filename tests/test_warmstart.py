"""The warm start: supervised steps raise pass@1, the checkpoint is cached by key and reloaded."""

from __future__ import annotations

import pytest

from gspo_bench.config import ModelConfig, WarmStartConfig
from gspo_bench.tasks import load_task
from gspo_bench.train.warmstart import cache_key, greedy_pass1, sft_batch, warm_start
from gspo_bench.models import build_builtin


def test_sft_batch_labels_only_the_completion():
    _, tok = build_builtin("tiny-dense", 0)
    b = sft_batch(tok, ["1+2=", "10+20="], ["3", "30"], "cpu")
    ids, labels = b["input_ids"], b["labels"]
    # row 0: "1+2=" (4 prompt tokens) then "3" and eos; the rest is padding
    assert labels[0, :4].tolist() == [-100] * 4
    assert tok.decode(labels[0, 4:6]) == "3" + tok.eos_token
    assert labels[0, 6:].eq(-100).all() and b["attention_mask"][0].sum() == 6
    assert tok.decode(ids[1, :6]) == "10+20=" and labels[1, 6:9].tolist() == ids[1, 6:9].tolist()


def test_warm_start_learns_caches_and_reloads(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path))
    task = load_task("arith", 0)
    ws_cfg = WarmStartConfig(target_pass1=1.0, max_steps=60, eval_every=30, eval_prompts=32, lr=3e-3)
    model_cfg = ModelConfig("tiny-dense")
    first = warm_start(task, model_cfg, ws_cfg, 0, 8, progress=False, log=lambda *a: None)
    assert not first.cached and first.steps == 60 and (first.path / "warmstart.json").is_file()
    assert first.path.parent == tmp_path / "warmstart"
    # the supervised steps moved the weights: the loss on train data is far below the random model's
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(first.path)
    random, tok = build_builtin("tiny-dense", 0)
    rows = task.train.select(range(64))
    batch = sft_batch(tok, list(rows["prompt"]), list(rows["target"]), "cpu")
    assert trained(**batch).loss < 0.8 * random(**batch).loss
    again = warm_start(task, model_cfg, ws_cfg, 0, 8, progress=False, log=lambda *a: None)
    assert again.cached and again.path == first.path and again.pass1 == first.pass1
    assert again.pass1 == greedy_pass1(trained, tok, task, len(task.eval), 8)


def test_cache_key_depends_on_seed_model_and_config():
    task = load_task("arith", 0)
    base = cache_key(task, ModelConfig("tiny-dense"), WarmStartConfig(), 0)
    assert base == cache_key(task, ModelConfig("tiny-dense"), WarmStartConfig(), 0)
    assert base != cache_key(task, ModelConfig("tiny-dense"), WarmStartConfig(), 1)
    assert base != cache_key(task, ModelConfig("tiny-moe"), WarmStartConfig(), 0)
    assert base != cache_key(task, ModelConfig("tiny-dense"), WarmStartConfig(target_pass1=0.2), 0)


def test_a_builtin_model_that_is_never_warm_started_skips_the_fine_tune(tmp_path, monkeypatch):
    """qwen3-0.6b-arch: warmstart.enabled is read as false (one cache entry either way), no supervised step is
    taken, and the checkpoint written is the random model's. The model itself is stood in for by tiny-dense:
    the 0.6B one is built in test_models.py."""
    import json

    import gspo_bench.train.warmstart as wsm
    from gspo_bench.tasks import Task

    def no_fine_tune(*a, **k):
        raise AssertionError("finetune was called")

    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(wsm, "finetune", no_fine_tune)
    monkeypatch.setattr(wsm, "load_base", lambda model_cfg, seed: build_builtin("tiny-dense", seed))
    on, off = WarmStartConfig(), WarmStartConfig(enabled=False)
    assert wsm.for_model(on, "qwen3-0.6b-arch") == off and wsm.for_model(on, "tiny-dense") is on
    assert wsm.for_model(on, "./some/checkpoint") is on
    full = load_task("arith", 0)
    task = Task(full.spec, full.train, full.eval.select(range(8)))  # the final greedy check stays cheap
    arch = ModelConfig("qwen3-0.6b-arch")
    assert cache_key(task, arch, on, 0) == cache_key(task, arch, off, 0)
    assert cache_key(task, ModelConfig("tiny-dense"), on, 0) != cache_key(task, ModelConfig("tiny-dense"), off, 0)
    ws = warm_start(task, arch, on, 0, 4, progress=False, log=lambda *a: None)
    assert ws.steps == 0 and not ws.cached
    assert json.loads((ws.path / "warmstart.json").read_text())["enabled"] is False


def test_no_steps_when_the_target_is_already_met(tmp_path, monkeypatch, mixed_task):
    """A model that already scores the target (as a real hub model may) is not fine-tuned at all."""
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path))
    task = load_task(mixed_task, 0)
    model, tok = build_builtin("tiny-dense", 0)
    start = greedy_pass1(model, tok, task, 32, 6)
    assert start > 0  # the even-length verifier pays random weights something
    ws = warm_start(task, ModelConfig("tiny-dense"), WarmStartConfig(target_pass1=start / 2, eval_prompts=32),
                    0, 6, progress=False, log=lambda *a: None)
    assert ws.steps == 0 and not ws.cached


def test_an_overshoot_is_undone_and_retried_with_a_smaller_lr(monkeypatch):
    """Scripted checks 0.1, 0.3, 0.5 (past 0.4 + 0.03: undone), 0.35, 0.42: the run goes back to the 0.3 state,
    continues at lr x 0.3 with checks every 3 steps instead of 10, and stops at 0.42, inside the band."""
    import torch

    import gspo_bench.train.warmstart as wsm

    checks = iter([0.1, 0.3, 0.5, 0.35, 0.42])
    monkeypatch.setattr(wsm, "greedy_pass1", lambda *a, **k: next(checks))
    lrs, states = [], {}
    real_step = torch.optim.AdamW.step

    def record(self, *a, **k):
        lrs.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", record)
    real_snapshot = wsm._snapshot

    def keep(model, opt, score):
        snap = real_snapshot(model, opt, score)
        states[score] = snap["model"]
        return snap

    monkeypatch.setattr(wsm, "_snapshot", keep)
    task = load_task("arith", 0)
    model, tok = build_builtin("tiny-dense", 0)
    cfg = WarmStartConfig(target_pass1=0.4, tolerance=0.03, backoff=0.3, eval_every=10, lr=3e-3, batch_size=8)
    real_restore, restored = wsm._restore, []
    monkeypatch.setattr(wsm, "_restore", lambda m, o, snap: (restored.append(snap["score"]), real_restore(m, o, snap)))
    score, steps = wsm.finetune(model, tok, task, cfg, 0, 8, progress=False)
    assert (score, steps) == (0.42, 26)
    # checks at steps 10 (0.3), 20 (0.5: undone back to the 0.3 state), 23 (0.35), 26 (0.42: stop)
    assert restored == [0.3]
    assert lrs[:20] == [3e-3] * 20 and lrs[20:] == [pytest.approx(9e-4)] * 6
    assert set(states) == {0.1, 0.3, 0.35}


def test_with_no_backoff_left_the_check_past_the_band_is_accepted(monkeypatch):
    import gspo_bench.train.warmstart as wsm

    checks = iter([0.1, 0.9])
    monkeypatch.setattr(wsm, "greedy_pass1", lambda *a, **k: next(checks))
    model, tok = build_builtin("tiny-dense", 0)
    cfg = WarmStartConfig(target_pass1=0.4, max_backoffs=0, eval_every=5, batch_size=8)
    assert wsm.finetune(model, tok, load_task("arith", 0), cfg, 0, 8, progress=False) == (0.9, 5)


def test_warm_start_config_rejects_bad_band_settings():
    from gspo_bench.config import ConfigError

    for bad in ({"tolerance": -0.1}, {"backoff": 0.0}, {"backoff": 1.0}, {"max_backoffs": -1}, {"max_backoffs": 1.5},
                {"eval_prompts": 0}, {"eval_prompts": True}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            WarmStartConfig(**bad)
    assert WarmStartConfig().eval_prompts is None  # default: the whole eval split


def test_the_cache_key_changed_with_the_stop_rule(monkeypatch):
    """Version 3 (accepted on the dev split) must not reuse a version-2 checkpoint accepted on the eval split."""
    import gspo_bench.train.warmstart as wsm

    task = load_task("arith", 0)
    key = cache_key(task, ModelConfig("tiny-dense"), WarmStartConfig(), 0)
    assert wsm.CACHE_VERSION == 3
    monkeypatch.setattr(wsm, "CACHE_VERSION", 2)
    assert cache_key(task, ModelConfig("tiny-dense"), WarmStartConfig(), 0) != key


def test_the_dev_split_is_held_out_of_training_and_disjoint_from_eval(monkeypatch):
    import datasets

    import gspo_bench.train.warmstart as wsm

    task = load_task("arith", 0)  # 1,024 eval prompts, 8,976 train rows
    sft, dev = wsm.dev_split(task)
    assert len(dev) == 1024 and len(sft) == len(task.train) - 1024
    assert not set(dev["prompt"]) & set(task.eval["prompt"]) and not set(dev["prompt"]) & set(sft["prompt"])
    assert list(dev["prompt"]) == list(task.train["prompt"][-1024:])  # the train split's last rows
    # a task whose splits share prompts: the shared ones leave the dev split
    shared = task.eval["prompt"][:3]
    train = datasets.Dataset.from_dict({"prompt": [f"{i}+0=" for i in range(37)] + shared,
                                        "answer": ["0"] * 40, "target": ["0"] * 40})
    odd = type(task)(task.spec, train, task.eval)
    sft, dev = wsm.dev_split(odd)
    assert len(sft) == 30 and list(dev["prompt"]) == [f"{i}+0=" for i in range(30, 37)]
    # the fine-tune checks its stop on the dev split and never trains on it
    seen, checked = set(), []
    real_sft = wsm.sft_batch

    def record(tok, prompts, targets, device):
        seen.update(prompts)
        return real_sft(tok, prompts, targets, device)

    monkeypatch.setattr(wsm, "sft_batch", record)
    scores = iter([0.1, 0.2, 0.41])
    monkeypatch.setattr(wsm, "greedy_pass1", lambda *a, rows=None, **k: (checked.append(rows), next(scores))[1])
    model, tok = build_builtin("tiny-dense", 0)
    cfg = WarmStartConfig(target_pass1=0.4, eval_every=5, batch_size=64)
    assert wsm.finetune(model, tok, task, cfg, 0, 8, progress=False) == (0.41, 10)
    dev_prompts = wsm.dev_split(task)[1]["prompt"]
    assert len(checked) == 3 and all(list(rows["prompt"]) == list(dev_prompts) for rows in checked)
    assert len(seen) > 300 and not seen & set(dev_prompts)  # 640 rows drawn, none from the dev split


def test_warmstart_command_reports_the_band(tmp_path, monkeypatch):
    """`warmstart --seeds 2`: one row per seed, min/mean/max per model, Markdown with command and commit;
    a second call loads the cached checkpoints instead of training again."""
    from gspo_bench.cli.main import main

    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    args = ["warmstart", "--preset", "smoke", "--seeds", "2", "--no-progress", "--set", "warmstart.max_steps=20",
            "--set", "warmstart.eval_every=10", "--set", "warmstart.target_pass1=0.9"]
    assert main(args + ["--markdown", "band.md"]) == 0
    text = (tmp_path / "band.md").read_text()
    assert "| tiny-dense | 0 |" in text and "| tiny-dense | 1 |" in text and "python -m gspo_bench warmstart" in text
    # both stopped at max_steps below the 90 % target: counted in the summary row
    assert "| tiny-dense | 2 |" in text and text.rstrip().endswith("| 2 |")
    cached = list((tmp_path / "cache" / "warmstart").iterdir())
    assert len(cached) == 2
    assert main(args) == 0 and len(list((tmp_path / "cache" / "warmstart").iterdir())) == 2
    assert main(["warmstart", "--seeds", "0"]) == 2


def _warm_start_in_a_process(cache: str, out: str) -> None:
    import json
    import os

    os.environ["GSPO_BENCH_CACHE"] = cache
    task = load_task("arith", 0)
    ws_cfg = WarmStartConfig(target_pass1=1.0, max_steps=20, eval_every=10, eval_prompts=16, lr=3e-3)
    got = warm_start(task, ModelConfig("tiny-dense"), ws_cfg, 0, 8, progress=False, log=lambda *a: None)
    with open(out, "w") as fh:
        json.dump({"cached": got.cached, "path": str(got.path)}, fh)


def test_processes_started_together_fine_tune_once_and_the_others_load_it(tmp_path):
    # the ranks of a torchrun job reach the warm start at the same moment: one fine-tunes, the others wait
    import json
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_warm_start_in_a_process, args=(str(tmp_path / "cache"), str(tmp_path / f"{i}.json")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    got = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert sorted(g["cached"] for g in got) == [False, True] and got[0]["path"] == got[1]["path"]


def test_a_task_of_one_prompt_keeps_a_dev_split_of_its_own_rows():
    """guess: every row is "guess 1-16:" with its own secret, so no row's prompt differs from the eval split's;
    the dev split keeps its held-out train rows rather than none (a warm start checked on nothing would never
    stop), still apart from the rows it trains on."""
    from gspo_bench.tasks import load_task
    from gspo_bench.train.warmstart import dev_split

    task = load_task("guess", 0)
    sft, dev = dev_split(task)
    assert len(dev) == min(len(task.eval), len(task.train) // 4) and len(sft) + len(dev) == len(task.train)
    assert list(dev["answer"]) == list(task.train["answer"])[-len(dev):]
