"""``bench``: the analytic FLOP count, the matmul probe, and the command end to end (gspo_bench.bench.throughput)."""

from __future__ import annotations

import json

import pytest
import torch

from gspo_bench.cli.main import main
from gspo_bench.bench.throughput import active_matmul_params, bench_device, matmul_gflops, model_flops, peak_dtype
from gspo_bench.config import ConfigError
from gspo_bench.models import build_builtin


@pytest.fixture(scope="module")
def dense():
    return build_builtin("tiny-dense", 0)[0]


@pytest.fixture(scope="module")
def moe():
    return build_builtin("tiny-moe", 0)[0]


def attention_weights(cfg) -> int:
    """q (Hq*D x H), k and v (Hkv*D x H), o (H x Hq*D), per layer."""
    H, D = cfg.hidden_size, cfg.head_dim
    q = cfg.num_attention_heads * D * H
    kv = 2 * cfg.num_key_value_heads * D * H
    o = H * cfg.num_attention_heads * D
    return q + kv + o


def test_active_matmul_params_dense_by_hand(dense):
    cfg = dense.config
    H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    assert (H, I, L, V, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads) == (128, 512, 4, 99, 32, 4, 2)
    mlp = 3 * H * I  # gate, up, down
    want = L * (attention_weights(cfg) + mlp) + V * H  # + the LM head (tied, counted once; embedding lookup is free)
    assert want == 4 * (128 * 128 + 64 * 128 + 64 * 128 + 128 * 128 + 3 * 128 * 512) + 99 * 128 == 995_712
    assert active_matmul_params(dense) == want


def test_active_matmul_params_moe_by_hand(moe):
    cfg = moe.config
    H, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    E, k, Im = cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    assert (E, k, Im) == (8, 2, 128)
    router = E * H
    experts = (E * 2 * Im * H + E * H * Im) * k // E  # gate_up (E, 2I, H) and down (E, H, I), k of E used
    want = L * (attention_weights(cfg) + router + experts) + V * H
    assert want == 4 * (128 * 128 + 2 * 64 * 128 + 128 * 128 + 8 * 128 + (8 * 256 * 128 + 8 * 128 * 128) * 2 // 8) + 99 * 128
    assert active_matmul_params(moe) == want
    # fewer than the total: the unused experts do not count
    total_matrices = sum(p.numel() for n, p in moe.named_parameters() if p.ndim >= 2 and "embed" not in n) + V * H
    assert want < total_matrices


@pytest.mark.parametrize("tokens, context", [(1, 1), (1000, 37.5), (128 * 70, 60.0)])
def test_model_flops_by_hand(dense, moe, tokens, context):
    for model, active in ((dense, 995_712), (moe, active_matmul_params(moe))):
        cfg = model.config
        attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context
        assert attn == 4 * 4 * 4 * 32 * context
        assert model_flops(model, tokens, context) == pytest.approx(tokens * (2 * active + attn), rel=1e-12)


def test_model_flops_is_linear_in_tokens(dense):
    assert model_flops(dense, 0, 50.0) == 0
    assert model_flops(dense, 30, 10.0) == pytest.approx(3 * model_flops(dense, 10, 10.0))


def test_matmul_gflops_positive():
    g = matmul_gflops(n=128, repeats=2)
    assert isinstance(g, float) and g > 0


def test_the_bench_device_follows_train_accelerator():
    assert bench_device("cpu") == torch.device("cpu")
    assert bench_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="train.accelerator='tpu': bench measures on cpu or a CUDA GPU"):
        bench_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="train.accelerator=gpu but torch .* sees no CUDA GPU"):
            bench_device("gpu")
    # what MFU is against: the GPU's bf16 tensor-core rate, the CPU's float32 rate
    assert peak_dtype(torch.device("cuda")) == torch.bfloat16 and peak_dtype(torch.device("cpu")) == torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU where there is none")
def test_bench_on_a_gpu_where_there_is_none_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--set", "train.accelerator=gpu", "--json", "b.json"]) == 2
    errors = [line for line in capsys.readouterr().out.splitlines() if "error" in line]
    assert len(errors) == 1 and "sees no CUDA GPU" in errors[0]
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "cache").exists()


def test_median_time_waits_for_the_device(monkeypatch):
    """Each timed call is fenced by a synchronize on both sides (on a CPU a no-op, counted here)."""
    from gspo_bench.bench import throughput

    fences = []
    monkeypatch.setattr(throughput, "synchronize", lambda device: fences.append(device.type))
    sec, outs = throughput.median_time(lambda: 7, warmup=1, repeats=3, device=torch.device("cuda"))
    assert outs == [7, 7, 7] and sec >= 0 and fences == ["cuda"] * 6


def test_a_comparison_page_says_whether_huge_pages_were_asked_for(monkeypatch):
    from gspo_bench.bench import throughput

    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    assert throughput.huge_pages_on() and "ran under them too" in throughput.huge_pages_note()
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert not throughput.huge_pages_on() and "as its users run it" in throughput.huge_pages_note()


# ----------------------------------------------------------------------------- the command


def test_bench_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--max-new-tokens", "8", "--repeats", "1", "--warmup", "0", "--rl-steps", "1",
            "--scaling", "4,8", "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "bench.md"),
            "--figure", str(tmp_path / "s.png")]
    assert main(argv) == 0
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["model"] == "tiny-dense" and d["params"] > 0 and d["active_matmul_params"] == 995_712
    assert d["matmul_gflops"] > 0
    c = d["config"]
    assert (c["prompts"], c["group_size"], c["max_new_tokens"], c["minibatches"], c["algo"]) == (16, 8, 8, 4, "grpo")
    assert c["reference_comparable"] is False  # 8 new tokens, not the reference's 64
    # the preset has no warm start: only the random model is saved in the cache
    assert (tmp_path / "cache" / "warmstart").is_dir()

    gen = d["generation"]
    for k in ("fast", "hf"):
        assert gen[k]["seconds"] > 0 and gen[k]["tokens"] > 0 and gen[k]["tokens_per_s"] > 0
        assert gen[k]["tokens"] <= 128 * 8
        assert gen[k]["completions_per_s"] == pytest.approx(128 / gen[k]["seconds"])
    assert gen["speedup"] == pytest.approx(gen["hf"]["seconds"] / gen["fast"]["seconds"])
    # the page says how torch's allocator ran transformers' side (cli/pages.py leaves a comparison without)
    assert "no huge pages asked for, so the other implementation ran as its users run it" in d["notes"]
    assert "- no huge pages asked for" in (tmp_path / "bench.md").read_text()
    # the compiled decode step (dense model): its own row, the time spent compiling, and its ratio
    assert list(gen) == ["fast", "compiled", "hf", "speedup", "compiled_speedup"]
    assert gen["compiled"]["seconds"] > 0 and 0 < gen["compiled"]["tokens"] <= 128 * 8
    assert gen["compiled"]["compile_s"] >= 0
    assert gen["compiled_speedup"] == pytest.approx(gen["hf"]["seconds"] / gen["compiled"]["seconds"])

    tr = d["training"]
    for k in ("packed", "hf"):
        assert tr[k]["seconds"] > 0 and tr[k]["tokens_per_s"] > 0 and tr[k]["mfu"] > 0
        assert tr[k]["tokens"] <= tr[k]["padded_tokens"]
    assert tr["speedup"] == pytest.approx(tr["hf"]["seconds"] / tr["packed"]["seconds"])

    rl = d["rl_step"]
    for k in ("fast", "hf"):
        assert rl[k]["seconds"] > 0 and rl[k]["completions_per_s"] > 0 and rl[k]["mfu"] > 0
        assert rl[k]["completions"] == 128 and rl[k]["steps"] == 1
        assert rl[k]["gen_s"] > 0 and rl[k]["train_s"] > 0
    assert rl["fast"]["engine"] == "fast" and rl["fast"]["old_logp_source"] == "rollout"
    assert rl["fast"]["forward"] == "auto"
    assert rl["hf"]["engine"] == "hf" and rl["hf"]["old_logp_source"] == "recompute" and rl["hf"]["forward"] == "hf"
    assert rl["speedup"] == pytest.approx(rl["hf"]["seconds"] / rl["fast"]["seconds"])

    assert [s["max_new_tokens"] for s in d["scaling"]] == [4, 8]
    for s in d["scaling"]:
        assert s["engine"] == "fast" and s["seconds"] > 0 and 0 < s["tokens"] <= 128 * s["max_new_tokens"]
        assert s["seconds_per_1k_tokens"] == pytest.approx(1000 * s["seconds"] / s["tokens"])

    md = (tmp_path / "bench.md").read_text()
    assert "(a) rollout generation" in md and "(b) training" in md and "(c) full RL step" in md
    assert "`python -m gspo_bench " + " ".join(argv) + "`" in md
    assert "![rollout time against max_new_tokens](s.png)" in md
    assert "x reference" in md and "| fast | fast | rollout |" in md and "| compiled |" in md
    png = tmp_path / "s.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_bench_one_path_one_model(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    small = tmp_path / "small.yaml"
    small.write_text("rollout:\n  prompts_per_step: 4\n  group_size: 2\ntrain:\n  minibatches: 2\n")
    argv = ["bench", "--model", "tiny-moe", "--config", str(small), "--paths", "fast", "--max-new-tokens", "4",
            "--repeats", "1", "--warmup", "0", "--rl-steps", "1", "--scaling", "none", "--json", "b.json",
            "--figure", "s.png", "--set", "rollout.moe_kernel=batched"]
    assert main(argv) == 0
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["model"] == "tiny-moe" and d["config"]["moe_kernel"] == "batched"
    assert d["active_matmul_params"] == active_matmul_params(build_builtin("tiny-moe", 0)[0]) != 995_712
    assert (d["config"]["prompts"], d["config"]["group_size"], d["config"]["minibatches"]) == (4, 2, 2)
    assert list(d["generation"]) == ["fast"] and list(d["training"]) == ["packed"] and list(d["rl_step"]) == ["fast"]
    assert d["rl_step"]["fast"]["engine"] == "fast" and d["rl_step"]["fast"]["completions"] == 4 * 2
    assert d["scaling"] == [] and not (tmp_path / "s.png").exists()  # no scaling curve, no figure


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--algo", "nope"], "nope"),
        (["--paths", "fast,gpu"], "gpu"),
        (["--scaling", "abc"], "abc"),
        (["--repeats", "0"], "--repeats"),
        (["--rl-steps", "0"], "--rl-steps"),
        (["--warmup", "-1"], "--warmup"),
        (["--scaling", "8,0"], "--scaling"),
        (["--preset", "huge"], "huge"),
    ],
)
def test_bench_bad_input_is_one_line_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    code = main(["bench", "--json", str(tmp_path / "b.json"), *argv])
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    errors = [line for line in lines if "error" in line]
    assert code == 2
    assert len(errors) == 1 and needle in errors[0], lines
    # besides the error, at most the "bench preset=..." header the command prints before validating
    assert all(line.startswith("bench preset=") for line in lines if line not in errors), lines
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("mode", [[], ["--engines", "fast"], ["--whole"], ["--vs", "trl"], ["--presets", "smoke"],
                                  ["--memory", "none"], ["--async", "0"], ["--suite-ray"]])
def test_every_bench_mode_names_a_model_it_cannot_find_in_one_line_exit_2(mode, tmp_path, monkeypatch, capsys):
    # a typo in the model (moe-016b for moe-0.16b) used to end in a traceback, or in a table of failed children
    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    code = main(["bench", *mode, "--set", "model.name=moe-016b", "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "model 'moe-016b' not found" in lines[0] and "moe-0.16b" in lines[0]  # the built-ins, for the typo
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "cache").exists()
