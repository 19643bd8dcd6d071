"""The warm start: supervised steps raise pass@1, the checkpoint is cached by key and reloaded."""

from __future__ import annotations

from gspo_bench.config import ModelConfig, WarmStartConfig
from gspo_bench.tasks import load_task
from gspo_bench.warmstart import cache_key, greedy_pass1, sft_batch, warm_start
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
