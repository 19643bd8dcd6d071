"""``bench --engines``: the engines side by side, through the command line (a tiny batch), and the crossover
between the fast engine and vLLM computed by hand."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gspo_bench.bench.engines import crossover_params, markdown

ROOT = Path(__file__).resolve().parent.parent


def _result(model: str, params: float, fast_over_vllm: float) -> dict:
    return {"model": model, "params": params, "machine": "m", "notes": [], "rl_step": {},
            "config": {"prompts": 4, "group_size": 4, "max_new_tokens": 32, "temperature": 1.0,
                       "dtype": "float32", "threads": 2, "algo": "grpo"},
            "generation": {"fast_over_vllm": fast_over_vllm}}


def test_the_crossover_interpolates_log_linearly_between_the_bracketing_models():
    # fast 2x ahead at 1 M, vLLM 2x ahead at 100 M: log-ratios +ln2 and -ln2 cross half way in log params, 10 M
    res = [_result("a", 1e6, 2.0), _result("b", 1e8, 0.5)]
    assert crossover_params(res) == pytest.approx(1e7, rel=1e-9)
    # 4x ahead then 0.5x: t = ln4 / (ln4 + ln2) = 2/3 of the way from 1e6 to 1e8 in log10: 10 ** (6 + 4/3)
    assert crossover_params([_result("a", 1e6, 4.0), _result("b", 1e8, 0.5)]) == pytest.approx(10 ** (6 + 4 / 3))
    assert crossover_params([_result("a", 1e6, 2.0), _result("b", 1e8, 1.5)]) is None  # the fast engine wins both
    assert crossover_params([_result("tiny-moe", 1e6, 2.0), _result("b", 1e8, 0.5)]) is None  # MoE not counted
    assert "about **10 M parameters**" in markdown(res, "cmd", "abc")


@pytest.mark.slow
def test_bench_engines_measures_each_engine_and_writes_its_tables(vllm_ready, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GSPO_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "bench", "--engines", "fast,hf,vllm", "--model",
                           "tiny-dense", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2",
                           "--max-new-tokens", "4", "--rl-steps", "0", "--repeats", "1", "--warmup", "0",
                           "--json", "e.json", "--markdown", "e.md"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [res] = json.loads((tmp_path / "e.json").read_text())
    assert res["model"] == "tiny-dense" and res["config"]["prompts"] == 2 and res["config"]["group_size"] == 2
    gen = res["generation"]
    for engine in ("fast", "hf", "vllm"):
        # 4 completions of at most 4 tokens each, and a rate that is that count over the measured seconds
        assert 0 < gen[engine]["tokens"] <= 16 and gen[engine]["completions_per_s"] == pytest.approx(
            4 / gen[engine]["seconds"])
    assert gen["vllm"]["startup_s"] > 0 and gen["vllm"]["weight_sync_s"] > 0
    assert gen["fast_over_vllm"] == pytest.approx(gen["fast"]["tokens_per_s"] / gen["vllm"]["tokens_per_s"])
    text = (tmp_path / "e.md").read_text()
    assert text.startswith("# Rollout engines side by side") and "python -m gspo_bench bench --engines" in text
    assert "| vllm |" in text and not math.isnan(gen["fast_over_vllm"])


def test_an_unknown_engine_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "bench", "--engines", "fast,sglang"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1 and "sglang" in out and "vllm" in out, out


def test_the_tables_say_which_kernel_ran_a_moe_models_experts():
    from gspo_bench.bench.engines import experts_kernel
    from gspo_bench.models import build_builtin

    moe, _ = build_builtin("tiny-moe", 0)
    dense, _ = build_builtin("tiny-dense", 0)
    cpu = torch.device("cpu")
    # auto on a CPU is grouped_mm (tiny-moe's widths are multiples of 4 floats); a named kernel is kept
    assert experts_kernel(moe, "auto", cpu, "float32") == "grouped"
    assert experts_kernel(moe, "loop", cpu, "bfloat16") == "loop"
    assert experts_kernel(dense, "auto", cpu, "float32") is None
    res = _result("tiny-moe", 1e6, 2.0)
    res["config"].update(experts_by="grouped", moe_kernel="auto")
    text = markdown([res, _result("tiny-dense", 1e6, 2.0)], "cmd", "abc")
    assert "2 threads; the experts run by `grouped` (`rollout.moe_kernel: auto`)." in text
    assert text.count("experts run by") == 1


def test_the_kernels_are_timed_in_rounds_that_take_them_in_turn(monkeypatch):
    import gspo_bench.bench.engines as eng
    from gspo_bench.models import build_builtin

    moe, tok = build_builtin("tiny-moe", 0)
    order = []
    real = eng.generate

    def recording(engine, *a, moe_kernel, **k):
        order.append(moe_kernel)
        return real(engine, *a, moe_kernel=moe_kernel, **k)

    monkeypatch.setattr(eng, "generate", recording)
    out = eng.bench_moe_kernels(moe, tok, ["1+2=", "3+4="], 6, 1.0, ("loop", "auto"), 1, 3, torch.device("cpu"),
                                "float32")
    # one warm-up per kernel, then three rounds of one rollout per kernel, in turn
    assert order == ["loop", "auto"] + ["loop", "auto"] * 3
    assert out["loop"]["runs_by"] == "loop" and out["auto"]["runs_by"] == "grouped"
    for v in out.values():
        assert v["min_s"] <= v["seconds"] <= v["max_s"] and v["repeats"] == 3
        assert 0 < v["tokens"] <= 12 and v["tokens_per_s"] == pytest.approx(v["tokens"] / v["seconds"])


@pytest.mark.parametrize("argv, words", [
    (["--engines", "fast", "--moe-kernels", "loop,fused"], ("fused", "batched")),
    (["--moe-kernels", "loop"], ("--engines",)),
])
def test_a_bad_moe_kernels_flag_is_one_line_exit_2(tmp_path, argv, words):
    proc = subprocess.run([sys.executable, "-m", "gspo_bench", "bench", *argv], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1 and all(w in out for w in words), out
