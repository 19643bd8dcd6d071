"""The functional Qwen3 / Qwen3-MoE forward (gspo_bench.rollout.fastlm) against transformers' modules."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import torch.nn.functional as F
import transformers

from gspo_bench.rollout import fastlm
from gspo_bench.rollout.engine import forward_response, response_logp
from gspo_bench.models import build_builtin
from tests.conftest import sharpen

PAD, EOS, VOCAB = 0, 2, 99


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe", "tiny-dense-sharp", "tiny-moe-sharp"])
def qwen(request):
    model, tok = build_builtin(request.param.removesuffix("-sharp"), 0)
    if request.param.endswith("-sharp"):
        sharpen(model)
    return model.eval()


def ragged_batch(seed: int, prompt_lens, resp_lens, T: int):
    """Rollout layout by hand: left-padded prompts of ``prompt_lens``, responses of ``resp_lens`` tokens
    (ending on eos when shorter than T), pad and mask 0 after each response."""
    g = torch.Generator().manual_seed(seed)
    B, P = len(prompt_lens), max(prompt_lens)
    ids = torch.full((B, P + T), PAD, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for b, (pl, n) in enumerate(zip(prompt_lens, resp_lens)):
        ids[b, P - pl:P] = torch.randint(3, VOCAB, (pl,), generator=g)
        attn[b, P - pl:P] = 1
        r = torch.randint(3, VOCAB, (n,), generator=g)
        if n < T:
            r[-1] = EOS
        ids[b, P:P + n] = r
        attn[b, P:P + n] = 1
    return ids, attn, P


# prompts of 3, 7, 1 and 5 tokens (P = 7); responses of 6 (no eos), 2, 1 (eos first) and 4 tokens
PROMPT_LENS, RESP_LENS, T = [3, 7, 1, 5], [6, 2, 1, 4], 6


def logp_row_by_row(model, ids, attn, P, temperature):
    """Log-probs of each response token from a plain forward of that row's real tokens alone (no padding)."""
    B, T_ = ids.shape[0], ids.shape[1] - P
    out = torch.zeros(B, T_)
    for b in range(B):
        real = attn[b].bool()
        seq = ids[b][real]
        n_prompt = int(attn[b, :P].sum())
        n_resp = int(attn[b, P:].sum())
        logits = model(input_ids=seq[None]).logits[0].float() / temperature
        lsm = torch.log_softmax(logits, -1)
        for t in range(n_resp):
            out[b, t] = lsm[n_prompt - 1 + t, seq[n_prompt + t]]
    return out


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logp_and_entropy_equal_transformers(qwen, temperature):
    ids, attn, P = ragged_batch(0, PROMPT_LENS, RESP_LENS, T)
    mask = attn[:, P:].float()
    with torch.no_grad():
        got, ent, hidden = fastlm.packed_response_logp(qwen, ids, attn, P, temperature, with_entropy=True)
        want, want_ent, _ = forward_response(qwen, ids, attn, P, temperature, with_entropy=True)
    assert hidden is None
    assert got.shape == ent.shape == (4, T)
    assert got.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(got, want * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, want_ent * mask, atol=1e-5, rtol=1e-5)
    # outside the response mask: exactly zero, not merely small
    assert (got[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    assert (got[mask == 1] < 0).all()
    assert (ent[mask == 1] > 0).all() and (ent[mask == 1] <= math.log(VOCAB) + 1e-5).all()


def test_packed_logp_equals_each_row_run_alone(qwen):
    # independent of forward_response's position-id handling: every row unpadded, one at a time
    ids, attn, P = ragged_batch(1, PROMPT_LENS, RESP_LENS, T)
    with torch.no_grad():
        got, ent, _ = fastlm.packed_response_logp(qwen, ids, attn, P, 0.7)
        want = logp_row_by_row(qwen, ids, attn, P, 0.7)
    assert ent is None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_temperature_scales_logits_before_the_softmax(qwen):
    ids, attn, P = ragged_batch(2, PROMPT_LENS, RESP_LENS, T)
    with torch.no_grad():
        lp1, _, _ = fastlm.packed_response_logp(qwen, ids, attn, P, 1.0)
        lp07, _, _ = fastlm.packed_response_logp(qwen, ids, attn, P, 0.7)
        logits = qwen(input_ids=ids, attention_mask=attn,
                      position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, P - 1:-1].float()
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, ids[:, P:, None])[..., 0] * attn[:, P:]
    torch.testing.assert_close(lp07, want, atol=1e-5, rtol=1e-5)
    m = attn[:, P:].bool()
    assert (lp07[m] - lp1[m]).abs().min() > 1e-4  # the temperature really changed something


def test_response_logp_packed_and_hf_agree(qwen):
    ids, attn, P = ragged_batch(3, PROMPT_LENS, RESP_LENS, T)
    with torch.no_grad():
        a, ea = response_logp(qwen, ids, attn, P, 0.7, with_entropy=True, forward="packed")
        b, eb = response_logp(qwen, ids, attn, P, 0.7, with_entropy=True, forward="hf")
        c, ec = response_logp(qwen, ids, attn, P, 0.7, with_entropy=False, forward="auto")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ea, eb, atol=1e-5, rtol=1e-5)
    assert torch.equal(c, a) and ec is None  # auto picks the packed path for Qwen3
    assert (b[attn[:, P:] == 0] == 0).all()


def test_no_padding_batch(qwen):
    # every prompt full-length and every response full-length: packed == padded, nothing to skip
    ids, attn, P = ragged_batch(4, [4, 4], [3, 3], 3)
    with torch.no_grad():
        got, _, _ = fastlm.packed_response_logp(qwen, ids, attn, P)
        want, _, _ = forward_response(qwen, ids, attn, P)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name, sharp", [("tiny-dense", False), ("tiny-moe", False), ("tiny-dense", True),
                                         ("tiny-moe", True)])
def test_gradients_equal_transformers(name, sharp):
    model, _ = build_builtin(name, 1)
    if sharp:
        sharpen(model)
    model.train()
    ids, attn, P = ragged_batch(5, PROMPT_LENS, RESP_LENS, T)
    mask = attn[:, P:].float()
    params = dict(model.named_parameters())

    def grads(fn):
        model.zero_grad(set_to_none=True)
        logp = fn()
        (logp * mask).sum().backward()
        return {n: (torch.zeros_like(p) if p.grad is None else p.grad.clone()) for n, p in params.items()}

    g_packed = grads(lambda: fastlm.packed_response_logp(model, ids, attn, P, 0.7)[0])
    g_hf = grads(lambda: forward_response(model, ids, attn, P, 0.7)[0])
    assert len(params) > 10
    nonzero = 0
    for n in params:
        scale = g_hf[n].abs().max().item()
        nonzero += scale > 0
        err = (g_packed[n] - g_hf[n]).abs().max().item()
        assert err <= 1e-4 * scale + 1e-7, (n, err, scale)
    # every weight takes part (the tied embedding / LM head, every layer, the routers and experts)
    assert nonzero == len(params)


def grouped_batch(seed: int):
    """Groups of rows sharing a prompt (as a rollout's G samples do) in shuffled order, plus a lone row."""
    ids, attn, P = ragged_batch(seed, [3, 7, 1, 5, 3, 7, 1, 3], [6, 2, 1, 4, 3, 5, 2, 1], T)
    for b, a in ((4, 0), (5, 1), (6, 2), (7, 0)):  # rows 4 and 7 repeat row 0's prompt, 5 row 1's, 6 row 2's
        ids[b, :P], attn[b, :P] = ids[a, :P], attn[a, :P]
    return ids, attn, P


def test_prompt_owners_point_at_each_groups_first_row():
    ids, attn, P = grouped_batch(6)
    assert fastlm.prompt_owners(ids, attn, P).tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    # what sits under the padding does not matter; one real token more does
    ids2, attn2 = ids.clone(), attn.clone()
    assert attn[4, 0] == 0
    ids2[4, 0] = 77
    assert fastlm.prompt_owners(ids2, attn2, P).tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    attn2[7, P - 4] = 1
    assert fastlm.prompt_owners(ids2, attn2, P).tolist() == [0, 1, 2, 3, 0, 1, 2, 7]


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_shared_prompts_give_the_same_logp_and_gradients(name):
    model, _ = build_builtin(name, 2)
    sharpen(model)
    model.train()
    ids, attn, P = grouped_batch(7)
    mask = attn[:, P:].float()
    params = dict(model.named_parameters())

    def run(share):
        model.zero_grad(set_to_none=True)
        logp, ent, _ = fastlm.packed_response_logp(model, ids, attn, P, 0.7, with_entropy=True, share_prompts=share)
        (logp * mask * torch.arange(1, T + 1)).sum().backward()
        return logp.detach(), ent, {n: (torch.zeros_like(p) if p.grad is None else p.grad.clone())
                                    for n, p in params.items()}

    lp_s, ent_s, g_s = run(True)
    lp, ent, g = run(False)
    torch.testing.assert_close(lp_s, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_s, ent, atol=1e-5, rtol=1e-5)
    assert (lp_s[mask == 0] == 0).all() and (lp_s[mask == 1] < 0).all()
    for n in params:
        scale = g[n].abs().max().item()
        assert (g_s[n] - g[n]).abs().max().item() <= 1e-4 * scale + 1e-7, n
    # and against transformers' own padded forward
    with torch.no_grad():
        want, _, _ = forward_response(model, ids, attn, P, 0.7)
    torch.testing.assert_close(lp_s, want * mask, atol=1e-5, rtol=1e-5)


def test_shared_prompts_really_compute_each_prompt_once(monkeypatch):
    model, _ = build_builtin("tiny-dense", 0)
    ids, attn, P = grouped_batch(8)
    seen, real_embed = [], fastlm.embed
    # the tokens the layers run on: what the embedding looks up
    monkeypatch.setattr(fastlm, "embed", lambda m, i: seen.append(i.shape[0]) or real_embed(m, i))
    with torch.no_grad():
        fastlm.packed_response_logp(model, ids, attn, P, share_prompts=False)
        fastlm.packed_response_logp(model, ids, attn, P, share_prompts=True)
    resp = int(attn[:, P:].sum())
    # unshared: every real cell; shared: the four distinct prompts (3 + 7 + 1 + 5 tokens) and every response
    assert seen == [int(attn.sum()), 16 + resp]


# ----------------------------------------------------------------------------- building blocks


def test_layer_refs_are_the_parameters_themselves(qwen):
    refs = fastlm.layer_refs(qwen)
    assert len(refs) == qwen.config.num_hidden_layers
    for ref, layer in zip(refs, qwen.model.layers):
        assert ref.q[0] is layer.self_attn.q_proj.weight
        assert ref.o[0] is layer.self_attn.o_proj.weight
        assert ref.ln1 is layer.input_layernorm.weight and ref.kn is layer.self_attn.k_norm.weight
        assert ref.head_dim == 32
        if hasattr(layer.mlp, "experts"):
            assert ref.dense is None and ref.mlp is layer.mlp
        else:
            assert ref.dense[2] is layer.mlp.down_proj.weight


@pytest.mark.parametrize("kernel", ["auto", *fastlm.EXPERT_KERNELS])
def test_moe_mlp_by_hand(kernel):
    model, _ = build_builtin("tiny-moe", 0)
    mlp = model.model.layers[1].mlp
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = fastlm.moe_mlp(mlp, x, kernel)
        # token by token: softmax router, top-2, renormalise, weighted sum of SwiGLU experts
        want = torch.zeros_like(x)
        gate_up, down = mlp.experts.gate_up_proj, mlp.experts.down_proj
        for i in range(7):
            p = torch.softmax(mlp.gate.weight @ x[i], -1)
            top = torch.topk(p, 2)
            w = top.values / top.values.sum()
            for wi, e in zip(w, top.indices):
                gu = gate_up[e] @ x[i]
                gate, up = gu[:128], gu[128:]
                want[i] += wi * (down[e] @ (F.silu(gate) * up))
        hf = mlp(x[None])
        hf = hf[0] if isinstance(hf, tuple) else hf
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, hf[0], atol=1e-5, rtol=1e-5)


def uneven_tokens(n: int, seed: int) -> torch.Tensor:
    """n tokens close to one direction, so routing is lopsided: a few experts take most rows, others none."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(128, generator=g) + 0.3 * torch.randn(n, 128, generator=g)


def kernel_value_and_grads(mlp, x0: torch.Tensor, kernel: str) -> list[torch.Tensor]:
    """moe_mlp's output and the gradients of a fixed linear function of it w.r.t. x, both expert weights and
    the router."""
    mlp.zero_grad()
    x = x0.clone().requires_grad_(True)
    y = fastlm.moe_mlp(mlp, x, kernel)
    (y.float() * torch.linspace(-1, 1, y.numel(), device=y.device).view_as(y)).sum().backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in (mlp.experts.gate_up_proj, mlp.experts.down_proj,
                                                            mlp.gate.weight)]


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """max |got - want| <= tol * max |want|: a rounding error relative to the tensor's own scale (a sum over
    rows in another order moves every entry by about the same absolute amount)."""
    err, scale = float((got.float() - want.float()).abs().max()), float(want.float().abs().max())
    assert err <= tol * scale, f"max error {err:.3g} > {tol} x scale {scale:.3g}"


# float32: summation order only; bfloat16: a few units of its 2^-8 rounding
KERNEL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["grouped", "batched"])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_moe_kernels_equal_the_loop_in_value_and_gradient(n, kernel, dtype):
    """grouped and batched against the per-expert loop: same output, same gradients w.r.t. x, both expert
    weights and the router, on lopsided loads (experts with no rows beside experts with most) and in bf16,
    as a bf16 sampler runs it."""
    model, _ = build_builtin("tiny-moe", 0)
    mlp = model.model.layers[2].mlp.to(dtype)
    x0 = uneven_tokens(n, n).to(dtype)
    counts = torch.bincount(mlp.gate(x0)[2].flatten(), minlength=8)
    assert (counts == 0).any() and (n == 1 or counts.max() > 2 * counts.float().mean())
    got, want = kernel_value_and_grads(mlp, x0, kernel), kernel_value_and_grads(mlp, x0, "loop")
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_close_to_scale(a, b, KERNEL_TOL[dtype])
    assert want[2].abs().sum() > 0 and want[4].abs().sum() > 0
    assert (want[2].flatten(1).abs().sum(1)[counts == 0] == 0).all()  # an expert with no rows gets no gradient


def test_moe_kernels_agree_under_autocast():
    """bf16-mixed training: float32 weights and residual stream, matmuls in bfloat16. The loop and batched
    autocast through F.linear / bmm; grouped_mm does not autocast, so the kernel casts its operands itself."""
    model, _ = build_builtin("tiny-moe", 0)
    mlp = model.model.layers[2].mlp
    x0 = uneven_tokens(64, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fastlm.compute_dtype(x0) == torch.bfloat16
        runs = {k: kernel_value_and_grads(mlp, x0, k) for k in fastlm.EXPERT_KERNELS}
    for k in ("grouped", "batched"):
        for a, b in zip(runs[k], runs["loop"]):
            assert_close_to_scale(a, b, KERNEL_TOL[torch.bfloat16])
    assert runs["loop"][2].dtype == torch.float32  # master weights keep float32 gradients


@pytest.mark.parametrize("device, dtype, capability, widths, want", [
    ("cpu", torch.float32, None, (128, 128), "grouped"),
    ("cpu", torch.bfloat16, None, (512, 256), "grouped"),
    ("cpu", torch.float32, None, (130, 128), "batched"),  # rows of 520 bytes: not a multiple of 16
    ("cuda", torch.bfloat16, (9, 0), (512, 256), "grouped"),  # H100 / H200: CUTLASS grouped GEMM
    ("cuda", torch.bfloat16, (10, 0), (512, 256), "grouped"),  # B200
    ("cuda", torch.bfloat16, (8, 0), (512, 256), "batched"),  # A100: grouped_mm would loop on the host
    ("cuda", torch.bfloat16, (12, 0), (512, 256), "batched"),
    ("cuda", torch.float32, (9, 0), (512, 256), "batched"),
    ("cuda", torch.float16, (9, 0), (512, 256), "batched"),
    ("cuda", torch.bfloat16, (9, 0), (512, 260), "batched"),
    ("mps", torch.bfloat16, None, (512, 256), "batched"),
])
def test_auto_picks_grouped_only_where_grouped_mm_has_a_kernel(device, dtype, capability, widths, want):
    assert fastlm.pick_moe_kernel(device, dtype, capability, widths) == want


def test_moe_kernel_names_match_the_config_choices():
    from gspo_bench.config.names import MOE_KERNELS

    assert set(MOE_KERNELS) == {"auto", *fastlm.EXPERT_KERNELS}
    x = torch.zeros(2, 128)
    assert fastlm.resolve_moe_kernel("auto", x, 128, 128) == "grouped"  # torch 2.13 on CPU
    assert fastlm.resolve_moe_kernel("loop", x, 128, 128) == "loop"
    with pytest.raises(ValueError, match="moe kernel 'fused' is not allowed"):
        fastlm.resolve_moe_kernel("fused", x, 128, 128)


@pytest.mark.parametrize("kernel", list(fastlm.EXPERT_KERNELS))
def test_the_engine_and_the_packed_forward_run_the_kernel_asked_for(kernel, monkeypatch):
    """``rollout.moe_kernel`` reaches every MoE layer of both paths: the fast engine's prefill and decode steps
    and the packed training forward call that kernel and no other, and give the loop's tokens and log-probs."""
    from gspo_bench.rollout.fastgen import decode

    model, _ = build_builtin("tiny-moe", 0)
    model.eval()
    calls = dict.fromkeys(fastlm.EXPERT_KERNELS, 0)

    def counting(name, fn):
        def run(*args):
            calls[name] += 1
            return fn(*args)
        return run

    for name, fn in list(fastlm.EXPERT_KERNELS.items()):
        monkeypatch.setitem(fastlm.EXPERT_KERNELS, name, counting(name, fn))
    ids, attn, P = ragged_batch(3, PROMPT_LENS, RESP_LENS, T)
    out = {}
    for k in dict.fromkeys((kernel, "loop")):
        tokens, _ = decode(model, ids[:, :P], attn[:, :P], max_new_tokens=5, eos_ids=[EOS], greedy=True,
                           moe_kernel=k)
        logp, _, _ = fastlm.packed_response_logp(model, ids, attn, P, moe_kernel=k)
        out[k] = tokens, logp
        if k == kernel:
            layers = len(model.model.layers)
            assert calls[kernel] >= layers * (1 + 1 + tokens.shape[1] - 1)  # prefill, packed pass, decode steps
            assert sum(calls.values()) == calls[kernel]
    assert torch.equal(out[kernel][0], out["loop"][0])
    torch.testing.assert_close(out[kernel][1], out["loop"][1], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n", [1, 64, 4096])
def test_on_a_gpu_the_moe_kernels_equal_the_loop_in_bf16(n):
    """On CUDA in bfloat16, the moe-0.16b expert shapes (32 experts of width 256, top-8, hidden 512): batched,
    and grouped where ``auto`` picks it (compute capability 9.x / 10.x), against the loop, value and gradients."""
    model, _ = build_builtin("moe-0.16b", 0)
    mlp = model.model.layers[0].mlp.to("cuda", torch.bfloat16)
    x0 = uneven_tokens(n, n).repeat(1, 4).to("cuda", torch.bfloat16)  # hidden 512
    auto = fastlm.resolve_moe_kernel("auto", x0, 512, 256)
    cap = torch.cuda.get_device_capability()
    assert auto == ("grouped" if cap[0] in (9, 10) else "batched")
    want = kernel_value_and_grads(mlp, x0, "loop")
    for kernel in dict.fromkeys(("batched", auto)):
        for a, b in zip(kernel_value_and_grads(mlp, x0, kernel), want):
            assert_close_to_scale(a, b, KERNEL_TOL[torch.bfloat16])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fastlm.resolve_moe_kernel("auto", x0.float(), 512, 256) == auto  # bf16-mixed training


def test_rope_by_hand():
    model, _ = build_builtin("tiny-dense", 0)
    pos = torch.tensor([0, 3, 7, 100])
    cos, sin_rot = fastlm.rope(model, pos, torch.float32)
    assert cos.shape == sin_rot.shape == (4, 1, 32)
    theta, d = 10000.0, 32
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None]  # (4, 16)
    torch.testing.assert_close(cos[:, 0].double(), torch.cat([ang.cos(), ang.cos()], -1), atol=1e-5, rtol=0)
    torch.testing.assert_close(sin_rot[:, 0].double(), torch.cat([-ang.sin(), ang.sin()], -1), atol=1e-5, rtol=0)
    # _rotate(x) is x * cos + rotate_half(x) * sin with rotate_half([a, b]) = [-b, a]
    x = torch.randn(4, 2, 32)
    a, b = x[..., :16], x[..., 16:]
    c, s = ang.cos().float()[:, None], ang.sin().float()[:, None]
    want = torch.cat([a * c - b * s, b * c + a * s], -1)
    torch.testing.assert_close(fastlm._rotate(x, cos, sin_rot), want, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- unsupported models


def tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   pad_token_id=PAD, bos_token_id=1, eos_token_id=EOS)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def tiny_gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def sliding_qwen3():
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=3,
                                   use_sliding_window=True,
                                   layer_types=["full_attention", "sliding_attention"], max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def test_unsupported_reason_for_the_builtins_is_none(qwen):
    assert fastlm.unsupported_reason(qwen) is None
    assert fastlm.supports(qwen)


@pytest.mark.parametrize("make, needle", [(tiny_llama, "llama"), (tiny_gpt2, "gpt2"), (sliding_qwen3, "sliding")])
def test_unsupported_reason_names_the_problem(make, needle):
    model = make()
    reason = fastlm.unsupported_reason(model)
    assert isinstance(reason, str) and needle in reason
    assert not fastlm.supports(model)


def test_sliding_window_really_differs_from_full_attention():
    # the reason for refusing it: the packed forward (full attention) would compute another function
    model = sliding_qwen3()
    ids, attn, P = ragged_batch(6, [5, 2], [4, 4], 4)
    with torch.no_grad():
        packed, _, _ = fastlm.packed_response_logp(model, ids, attn, P)
        hf, _, _ = forward_response(model, ids, attn, P)
    assert (packed - hf).abs().max() > 1e-4


@pytest.mark.parametrize("make", [tiny_llama, sliding_qwen3])
def test_response_logp_auto_falls_back_to_transformers(make):
    model = make()
    ids, attn, P = ragged_batch(7, PROMPT_LENS, RESP_LENS, T)
    with torch.no_grad():
        logp, ent = response_logp(model, ids, attn, P, 0.7, with_entropy=True, forward="auto")
        if make is tiny_llama:  # full attention: each row alone, unpadded, gives the same numbers
            torch.testing.assert_close(logp, logp_row_by_row(model, ids, attn, P, 0.7), atol=1e-5, rtol=1e-5)
        want, want_ent, _ = forward_response(model, ids, attn, P, 0.7, with_entropy=True)
    mask = attn[:, P:].float()
    torch.testing.assert_close(logp, want * mask, atol=0, rtol=0)
    torch.testing.assert_close(ent, want_ent * mask, atol=0, rtol=0)
    assert (logp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    with pytest.raises(ValueError, match="train.forward=hf"):
        response_logp(model, ids, attn, P, forward="packed")


def test_qwen3_moe_with_a_sliding_window_is_refused():
    # qwen3_moe has no layer_types: transformers applies config.sliding_window to every layer
    cfg = transformers.Qwen3MoeConfig(vocab_size=99, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                      num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=16, use_sliding_window=True, sliding_window=3,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    assert "sliding" in fastlm.unsupported_reason(model)
    ids = torch.randint(3, 99, (1, 10))
    attn = torch.ones_like(ids)
    with torch.no_grad():  # and refusing is right: full attention computes another function here
        packed, _, _ = fastlm.packed_response_logp(model, ids, attn, 5)
        hf, _, _ = forward_response(model, ids, attn, 5)
        assert (packed - hf).abs().max() > 1e-3
        logp, _ = response_logp(model, ids, attn, 5, forward="auto")
    torch.testing.assert_close(logp, hf, atol=0, rtol=0)


# ----------------------------------------------------------------------------- training memory


def param_grads(model, fn, weights=None):
    """(log-probs, {name: grad}) of sum(log-probs x weights) for the forward ``fn``."""
    model.zero_grad(set_to_none=True)
    logp = fn()
    w = torch.arange(1, logp.numel() + 1, dtype=logp.dtype).view_as(logp) if weights is None else weights
    (logp * w).sum().backward()
    return logp.detach(), {n: (torch.zeros_like(p) if p.grad is None else p.grad.clone())
                           for n, p in model.named_parameters()}


def assert_grads_close(got, want, rtol):
    for n, g in want.items():
        scale = g.abs().max().item()
        assert (got[n] - g).abs().max().item() <= rtol * scale + 1e-7, n


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_chunked_lm_head_gives_the_same_logp_entropy_and_gradients(name):
    """``logit_chunk_tokens``: chunks that do not divide the N = 19 response tokens, and one larger than N, against
    the whole (N, V) logits; the tied embedding / LM head's gradient included."""
    model, _ = build_builtin(name, 4)
    model = sharpen(model).train()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids, attn, P = ragged_batch(9, PROMPT_LENS, RESP_LENS, T)

    def run(chunk):
        ent = []

        def fwd():
            lp, e, _ = fastlm.packed_response_logp(model, ids, attn, P, 0.7, with_entropy=True,
                                                   logit_chunk_tokens=chunk)
            ent.append(e)
            return lp
        lp, g = param_grads(model, fwd)
        return lp, ent[0], g

    want_lp, want_ent, want = run(0)
    for chunk in (1, 4, 4096):
        lp, ent, got = run(chunk)
        torch.testing.assert_close(lp, want_lp, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ent, want_ent, atol=1e-6, rtol=1e-6)
        assert_grads_close(got, want, 1e-5)


def test_chunked_lm_head_under_bf16_autocast():
    """``train.precision: bf16-mixed``: the chunked head computes what the unchunked one does under autocast."""
    model, _ = build_builtin("tiny-dense", 5)
    model = sharpen(model).train()
    ids, attn, P = ragged_batch(10, PROMPT_LENS, RESP_LENS, T)
    runs = {}
    for chunk in (0, 4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs[chunk] = param_grads(model, lambda: fastlm.packed_response_logp(
                model, ids, attn, P, 0.7, logit_chunk_tokens=chunk)[0])
    torch.testing.assert_close(runs[4][0], runs[0][0], atol=1e-6, rtol=1e-6)
    assert_grads_close(runs[4][1], runs[0][1], 2e-2)  # bf16 partial sums of grad W round per chunk


def big_vocab_qwen3(vocab: int = 4096):
    cfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).train()


def test_packed_training_step_never_holds_tokens_by_vocabulary():
    """320 response tokens x 4096 vocabulary: with chunks of 16 tokens no tensor of the forward or the backward is
    larger than the head's weight (V, H = 32) or a chunk's logits, a tenth of (N, V); all at once, the logits are
    (N, V)."""
    from tests.test_lm_head import LargestTensor

    model = big_vocab_qwen3()
    ids, attn, P = ragged_batch(11, [5] * 8, [40] * 8, 40)
    n, v = int(attn[:, P:].sum()), model.config.vocab_size
    most = {}
    for chunk in (0, 16):
        with LargestTensor() as seen:
            param_grads(model, lambda: fastlm.packed_response_logp(model, ids, attn, P, with_entropy=True,
                                                                   logit_chunk_tokens=chunk)[0])
        most[chunk] = seen.most
    assert n == 320 and most[0] >= n * v and most[16] <= max(16 * v, v * 32) <= n * v / 10


# ----------------------------------------------------------------------------- activation checkpointing


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_activation_checkpointing_gives_the_same_gradients(name, monkeypatch):
    model, _ = build_builtin(name, 6)
    model = sharpen(model).train()
    ids, attn, P = ragged_batch(12, PROMPT_LENS, RESP_LENS, T)
    calls = []
    layer_forward = fastlm.layer_forward
    monkeypatch.setattr(fastlm, "layer_forward", lambda *a: calls.append(1) or layer_forward(*a))
    runs = {}
    for ck in (False, True, "selective"):
        calls.clear()
        runs[ck] = param_grads(model, lambda: fastlm.packed_response_logp(
            model, ids, attn, P, 0.7, share_prompts=True, checkpoint_layers=ck)[0])
        runs[ck] += (len(calls),)
    layers = model.config.num_hidden_layers
    for ck in (True, "selective"):
        torch.testing.assert_close(runs[ck][0], runs[False][0], atol=0, rtol=0)
        assert_grads_close(runs[ck][1], runs[False][1], 1e-6)
        assert (runs[False][2], runs[ck][2]) == (layers, 2 * layers)  # each layer ran again in the backward
    with torch.no_grad():  # no backward to come: nothing is recomputed
        calls.clear()
        fastlm.packed_response_logp(model, ids, attn, P, checkpoint_layers=True)
    assert len(calls) == layers


@pytest.mark.parametrize("chunk", [0, 4])
def test_a_tied_embedding_s_rows_read_gradient_leaves_every_gradient_bit_for_bit_unchanged(monkeypatch, chunk):
    """The packed forward reads a tied embedding through ``core.embedding.tied_lookup``: every parameter's
    gradient equals the one through the module's own ``nn.Embedding``, exactly, with the LM head's logits
    whole (0) or in chunks of 4 tokens."""
    model, _ = build_builtin("tiny-dense", 2)
    sharpen(model)
    model.train()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the built-in models are
    ids, attn, P = grouped_batch(3)
    mask = attn[:, P:].float()
    grads = []
    for plain in (True, False):
        if plain:
            monkeypatch.setattr(fastlm, "embed", lambda m, i: fastlm._base(m).embed_tokens(i))
        else:
            monkeypatch.undo()
        model.zero_grad(set_to_none=True)
        logp, ent, _ = fastlm.packed_response_logp(model, ids, attn, P, with_entropy=True, share_prompts=True,
                                                   logit_chunk_tokens=chunk, entropy_grad=True)
        ((logp * mask).sum() + (ent * mask).sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    plain, rows = grads
    assert plain.keys() == rows.keys()
    for n in plain:
        assert not rows[n].is_sparse and torch.equal(rows[n], plain[n]), n


class NewTensors(TorchDispatchMode):
    """The shapes of the dense tensors every operator under it writes new: in-place operators (``*_``), views
    and sparse tensors (a sparse gradient holds only its rows) excluded."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.layout == torch.strided and not func.is_view and \
                not func.__name__.split(".")[0].endswith("_"):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("name, checkpoint, chunk", [("tiny-dense", c, k) for c in (False, True, "selective")
                                                   for k in (0, 4)]
                         + [("tiny-moe", c, k) for c, k in ((False, 0), (True, 0), ("selective", 4))])
def test_a_second_part_accumulating_in_place_gives_both_parts_gradients(name, checkpoint, chunk):
    """Two micro-batches, the second with ``accumulate_grads`` (its weight gradients added into .grad inside the
    matmuls): the same gradients as both parts backpropagated the usual way, and its backward makes no tensor
    the size of a projection's, an MoE layer's stacked experts' or the tied embedding / LM head's weight (the
    usual way makes one of each). The routers' small (E, H) weights still accumulate through autograd."""
    model, _ = build_builtin(name, 5)
    model = sharpen(model).train()
    ids, attn, P = grouped_batch(8)
    parts = (torch.arange(0, 4), torch.arange(4, 8))
    weights = {tuple(p.shape) for n, p in model.named_parameters() if p.dim() in (2, 3) and ".gate." not in n}
    assert any(len(s) == 3 for s in weights) == (name == "tiny-moe")

    def backward(rows, fused):
        lp, _, _ = fastlm.packed_response_logp(model, ids[rows], attn[rows], P, 0.7, with_entropy=True,
                                               logit_chunk_tokens=chunk, checkpoint_layers=checkpoint,
                                               accumulate_grads=fused)
        with NewTensors() as made:
            (lp * torch.arange(1, lp.numel() + 1, dtype=lp.dtype).view_as(lp)).sum().backward()
        return [s for s in made.shapes if s in weights]

    def grads(fused):
        model.zero_grad(set_to_none=True)
        backward(parts[0], False)
        made = backward(parts[1], fused)
        return made, {n: p.grad.clone() for n, p in model.named_parameters()}

    usual, want = grads(False)
    made, got = grads(True)
    assert_grads_close(got, want, 1e-5)
    assert set(usual) == weights and made == []
