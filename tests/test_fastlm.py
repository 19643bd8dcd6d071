"""The functional Qwen3 / Qwen3-MoE forward (gspo_bench.rollout.fastlm) against transformers' modules."""

from __future__ import annotations

import math

import pytest
import torch
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


def test_shared_prompts_really_compute_each_prompt_once():
    model, _ = build_builtin("tiny-dense", 0)
    ids, attn, P = grouped_batch(8)
    seen = []
    # the tokens the layers run on: what the embedding looks up
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(o.shape[0]))
    with torch.no_grad():
        fastlm.packed_response_logp(model, ids, attn, P, share_prompts=False)
        fastlm.packed_response_logp(model, ids, attn, P, share_prompts=True)
    hook.remove()
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


@pytest.mark.parametrize("grouped", [True, False])
def test_moe_mlp_by_hand(grouped):
    model, _ = build_builtin("tiny-moe", 0)
    mlp = model.model.layers[1].mlp
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = fastlm.moe_mlp(mlp, x, grouped=grouped)
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


@pytest.mark.parametrize("n", [1, 7, 300])
def test_moe_grouped_and_looped_experts_agree_in_value_and_gradient(n):
    """One grouped_mm per projection and the per-expert loop: same output, same gradients, also when most
    experts get no rows (n=1: 6 of 8 empty) and in bf16, as a bf16 sampler runs it."""
    assert fastlm.grouped_mm_works(torch.zeros(1))  # torch 2.13 on CPU: the grouped path is the default
    model, _ = build_builtin("tiny-moe", 0)
    mlp = model.model.layers[2].mlp
    x0 = torch.randn(n, 128, generator=torch.Generator().manual_seed(n))
    outs, grads = [], []
    for grouped in (True, False):
        mlp.zero_grad()
        x = x0.clone().requires_grad_(True)
        y = fastlm.moe_mlp(mlp, x, grouped=grouped)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append(y.detach())
        grads.append([x.grad] + [p.grad.clone() for p in (mlp.experts.gate_up_proj, mlp.experts.down_proj,
                                                           mlp.gate.weight)])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert grads[0][1].abs().sum() > 0 and grads[0][3].abs().sum() > 0
    with torch.no_grad():
        mlp16, x16 = mlp.to(torch.bfloat16), x0.bfloat16()
        torch.testing.assert_close(fastlm.moe_mlp(mlp16, x16, grouped=True),
                                   fastlm.moe_mlp(mlp16, x16, grouped=False))


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
