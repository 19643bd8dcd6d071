"""Generation and token log-probs (gspo_bench.rollout.engine)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gspo_bench.rollout.engine import (
    forward_response,
    hf_generate,
    position_ids,
    response_mask_from,
    token_entropy,
    token_logp,
)
from gspo_bench.rollout.engines import generate
from gspo_bench.models import build_builtin

PAD, BOS, EOS = 0, 1, 2
PROMPTS = ["1+2=", "33+44=", "5+60=", "9+9=", "12+7=", "0+0="]


@pytest.fixture(scope="module")
def dense():
    model, tok = build_builtin("tiny-dense", 0)
    return model.eval(), tok


@pytest.fixture(scope="module")
def biased():
    """tiny-dense whose *sampler* never picks pad and favours eos, so rows end at different lengths.

    Both knobs are logits processors in the generation config: ``output_logits`` still returns the raw
    logits, so the returned rollout log-probs are those of the plain model at the sampling temperature.
    """
    model, tok = build_builtin("tiny-dense", 0)
    model.generation_config.suppress_tokens = [tok.pad_token_id]
    model.generation_config.sequence_bias = {(tok.eos_token_id,): 2.0}
    return model.eval(), tok


# ----------------------------------------------------------------------------- response_mask_from


def test_response_mask_by_hand():
    ids = torch.tensor([
        [5, 2, 7, 7],  # eos in the middle: kept, everything after it dropped
        [5, 6, 7, 8],  # no eos: all generated tokens count
        [2, 9, 9, 9],  # eos first
        [5, 6, 2, 0],  # eos then pad
        [5, 2, 2, 0],  # a second eos after the first is dropped too
    ])
    got = response_mask_from(ids, EOS, PAD)
    assert got.dtype == torch.float32
    assert got.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]]


def test_response_mask_several_eos_ids():
    ids = torch.tensor([[5, 3, 2, 7], [5, 2, 3, 7], [5, 6, 7, 3]])
    assert response_mask_from(ids, [2, 3], PAD).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]


def test_response_mask_pad_equal_to_eos():
    # many hub models use eos as pad: the first eos still counts, the padding after it does not
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 6, 7, 8, 9]])
    assert response_mask_from(ids, 2, pad_id=2).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert response_mask_from(ids, [2, 9], pad_id=2).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


# ----------------------------------------------------------------------------- token_logp / entropy


LOGITS = [[[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], [[0.3, 0.3, 0.3], [10.0, 0.0, -10.0]]]
TOKENS = [[1, 0], [2, 2]]


def logp_by_hand(row, tok, temp):
    z = [x / temp for x in row]
    return z[tok] - math.log(sum(math.exp(v) for v in z))


@pytest.mark.parametrize("temp", [1.0, 0.5, 2.0])
def test_token_logp_by_hand(temp):
    got = token_logp(torch.tensor(LOGITS), torch.tensor(TOKENS), temperature=temp)
    assert got.shape == (2, 2)
    for b in range(2):
        for t in range(2):
            assert got[b, t].item() == pytest.approx(logp_by_hand(LOGITS[b][t], TOKENS[b][t], temp), abs=1e-6)


def test_token_logp_specific_values():
    # uniform logits: log(1/3) whatever the temperature
    assert token_logp(torch.zeros(1, 1, 3), torch.tensor([[2]]), 0.7).item() == pytest.approx(-math.log(3), abs=1e-6)
    # logits [ln 1, ln 3]: p = 1/4, 3/4
    lg = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logp(lg, torch.tensor([[0]])).item() == pytest.approx(math.log(0.25), abs=1e-6)
    # at temperature 0.5 the logits double: [0, ln 9] -> p = 1/10, 9/10
    assert token_logp(lg, torch.tensor([[1]]), 0.5).item() == pytest.approx(math.log(0.9), abs=1e-6)


def test_token_logp_bf16_logits_are_upcast():
    lg = torch.tensor(LOGITS, dtype=torch.bfloat16)
    got = token_logp(lg, torch.tensor(TOKENS))
    assert got.dtype == torch.float32


def test_token_entropy_by_hand():
    assert token_entropy(torch.zeros(2, 4)).tolist() == pytest.approx([math.log(4)] * 2, abs=1e-6)
    lg = torch.tensor([[0.0, math.log(3.0)]])  # p = 1/4, 3/4
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert token_entropy(lg).item() == pytest.approx(h, abs=1e-6)
    # temperature 0.5 -> p = 1/10, 9/10
    h2 = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    assert token_entropy(lg, 0.5).item() == pytest.approx(h2, abs=1e-6)


# ----------------------------------------------------------------------------- position ids


def test_position_ids_left_padded():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 1, 2, 2], [0, 0, 0, 0, 0]]
    assert position_ids(mask.bool()).dtype == torch.long


# ----------------------------------------------------------------------------- forward_response


def test_forward_response_matches_a_plain_forward(dense):
    model, tok = dense
    enc = tok(["7+8=", "10+20="], return_tensors="pt", padding=True, add_special_tokens=False)
    resp = torch.tensor([[20, 2, 0], [21, 22, 2]])
    rmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    ids = torch.cat([enc["input_ids"], resp], 1)
    attn = torch.cat([enc["attention_mask"], rmask], 1)
    P = enc["input_ids"].shape[1]
    with torch.no_grad():
        logp, ent, hidden = forward_response(model, ids, attn, P, temperature=0.9, with_entropy=True,
                                             output_hidden_states=True)
        assert logp.shape == ent.shape == (2, 3)
        assert hidden.shape == (2, 3, 128)
        assert (ent >= 0).all() and (ent <= math.log(len(tok)) + 1e-5).all()
        # row 1 has no padding: positions 0..n-1 are the default, so a plain forward must agree
        full = model(input_ids=ids[1:], attention_mask=attn[1:]).logits[0]
        for t in range(3):
            want = torch.log_softmax(full[P - 1 + t] / 0.9, -1)[resp[1, t]]
            assert logp[1, t].item() == pytest.approx(want.item(), abs=1e-5)
        # row 0 is left-padded by 2: its log-probs equal those of the unpadded row run alone
        n_pad = int((enc["attention_mask"][0] == 0).sum())
        assert n_pad == 2
        alone = ids[0:1, n_pad:][:, : P - n_pad + 2]
        full0 = model(input_ids=alone).logits[0]
        for t in range(2):
            want = torch.log_softmax(full0[P - n_pad - 1 + t] / 0.9, -1)[resp[0, t]]
            assert logp[0, t].item() == pytest.approx(want.item(), abs=1e-5)


# ----------------------------------------------------------------------------- hf_generate


def test_hf_generate_sampled_shapes_masks_and_logp(biased):
    model, tok = biased
    torch.manual_seed(2)
    g = hf_generate(model, tok, PROMPTS, max_new_tokens=5, temperature=0.8)
    enc = tok(PROMPTS, padding=True, add_special_tokens=False)
    P = len(enc["input_ids"][0])
    B, T = len(PROMPTS), g.response_mask.shape[1]
    assert g.prompt_len == P
    assert 1 <= T <= 5
    assert g.input_ids.shape == g.attention_mask.shape == (B, P + T)
    assert g.response_mask.shape == g.rollout_logp.shape == (B, T)
    assert len(g.texts) == B
    # the prompt block is the tokenizer's left-padded encoding
    assert g.input_ids[:, :P].tolist() == enc["input_ids"]
    assert g.attention_mask[:, :P].tolist() == enc["attention_mask"]
    assert g.attention_mask[:, P:].tolist() == g.response_mask.long().tolist()

    resp = g.input_ids[:, P:]
    ended_early = 0
    for b in range(B):
        r, m = resp[b].tolist(), g.response_mask[b].tolist()
        n = int(sum(m))
        assert m == [1.0] * n + [0.0] * (T - n)  # a prefix
        assert r[n:] == [tok.pad_token_id] * (T - n)  # tokens after eos are pad
        if n < T:
            assert r[n - 1] == tok.eos_token_id  # the row ended on its eos
            ended_early += 1
        assert tok.eos_token_id not in r[: n - 1]
        assert g.texts[b] == tok.decode(r[:n], skip_special_tokens=True)
        lp = g.rollout_logp[b].tolist()
        assert all(v == 0.0 for v in lp[n:])
        assert all(v < 0.0 for v in lp[:n])
    # the seed gives a mix of finished and unfinished rows, so the checks above are not vacuous
    assert 0 < ended_early < B

    # the sampler's log-probs are a fresh forward pass's, at the same temperature and positions
    with torch.no_grad():
        fresh, _, _ = forward_response(model, g.input_ids, g.attention_mask, P, temperature=0.8)
    diff = ((fresh - g.rollout_logp).abs() * g.response_mask).max().item()
    assert diff < 1e-4
    # ... and the temperature matters: at 1.0 they differ
    with torch.no_grad():
        other, _, _ = forward_response(model, g.input_ids, g.attention_mask, P, temperature=1.0)
    assert ((other - g.rollout_logp).abs() * g.response_mask).max().item() > 1e-2


def test_hf_generate_without_logp(biased):
    model, tok = biased
    torch.manual_seed(0)
    g = hf_generate(model, tok, PROMPTS[:2], max_new_tokens=3, return_logp=False)
    assert g.rollout_logp is None
    assert g.input_ids.shape[0] == 2


def test_hf_generate_greedy_is_deterministic_and_argmax(dense):
    model, tok = dense
    torch.manual_seed(0)
    a = hf_generate(model, tok, PROMPTS[:4], max_new_tokens=5, greedy=True)
    torch.manual_seed(1)
    b = hf_generate(model, tok, PROMPTS[:4], max_new_tokens=5, greedy=True)
    assert a.rollout_logp is None
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert a.texts == b.texts
    # every generated token is the argmax of the model at that position
    P = a.prompt_len
    with torch.no_grad():
        logits = model(input_ids=a.input_ids, attention_mask=a.attention_mask,
                       position_ids=position_ids(a.attention_mask)).logits
    pred = logits[:, P - 1 : -1].argmax(-1)
    m = a.response_mask.bool()
    assert m.any()
    assert torch.equal(pred[m], a.input_ids[:, P:][m])


def test_generate_dispatch_errors(dense):
    model, tok = dense
    with pytest.raises(ValueError, match="unknown engine 'sglang'"):
        generate("sglang", model, tok, ["1+1="], max_new_tokens=2)
    with pytest.raises(ValueError, match="samples through an engine object"):  # it needs its engine object
        generate("vllm", model, tok, ["1+1="], max_new_tokens=2)


def test_rollout_logp_matches_forward_when_pad_is_sampled(dense):
    # plain random tiny-dense samples the pad id (0) often; with this seed some rows get one mid-response
    model, tok = dense
    torch.manual_seed(3)
    g = hf_generate(model, tok, PROMPTS[:4], max_new_tokens=6, temperature=1.0)
    with torch.no_grad():
        fresh, _, _ = forward_response(model, g.input_ids, g.attention_mask, g.prompt_len, temperature=1.0)
    diff = ((fresh - g.rollout_logp).abs() * g.response_mask).max().item()
    assert diff < 1e-4


# ----------------------------------------------------------------------------- forward_response: training memory


def _grads(model, fn):
    """(log-probs, entropy, hidden, {name: grad}) of a weighted sum of the log-probs of ``fn()``."""
    model.zero_grad(set_to_none=True)
    logp, ent, hidden = fn()
    (logp * torch.linspace(-1, 2, logp.numel()).view_as(logp)).sum().backward()
    return logp.detach(), ent, None if hidden is None else hidden.detach(), {
        n: (torch.zeros_like(p) if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _assert_same(got, want, rtol=1e-5):
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for n, g in want[3].items():
        assert (got[3][n] - g).abs().max().item() <= rtol * g.abs().max().item() + 1e-7, n


def _models():
    from tests.test_fastlm import tiny_gpt2, tiny_llama

    return {"tiny-dense": lambda: build_builtin("tiny-dense", 1)[0], "tiny-moe": lambda: build_builtin("tiny-moe", 1)[0],
            "llama": tiny_llama, "gpt2": tiny_gpt2}


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe", "llama", "gpt2"])
def test_forward_response_chunked_head_equals_the_modules_logits(name):
    """The decoder stack and the LM head applied in chunks of 5 (of B x T = 18 positions) against the module's own
    (B, T, V) logits: log-probs, entropy, the final hidden states and every gradient."""
    from gspo_bench.rollout.engine import plain_head
    from tests.test_fastlm import ragged_batch

    model = _models()[name]().eval()  # gradients still flow; eval only turns gpt2's dropout off
    assert plain_head(model)
    ids, attn, P = ragged_batch(13, [3, 7, 1], [6, 2, 4], 6)
    want = _grads(model, lambda: forward_response(model, ids, attn, P, 0.8, with_entropy=True,
                                                  output_hidden_states=True, logit_chunk_tokens=0))
    got = _grads(model, lambda: forward_response(model, ids, attn, P, 0.8, with_entropy=True,
                                                 output_hidden_states=True, logit_chunk_tokens=5))
    _assert_same(got, want)
    assert got[2].shape == (3, 6, model.config.hidden_size)


def test_a_head_with_its_own_logit_scale_keeps_the_modules_logits():
    """Granite divides its logits by ``logits_scaling`` after the head: not a plain head, so the module's logits."""
    import transformers

    from gspo_bench.rollout.engine import plain_head
    from tests.test_fastlm import ragged_batch

    cfg = transformers.GraniteConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, logits_scaling=4.0)
    torch.manual_seed(0)
    model = transformers.GraniteForCausalLM(cfg).eval()
    assert not plain_head(model)
    ids, attn, P = ragged_batch(14, [3, 5], [4, 4], 4)
    with torch.no_grad():
        logp, _, _ = forward_response(model, ids, attn, P, 0.8, logit_chunk_tokens=3)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits[:, P - 1:-1]
    torch.testing.assert_close(logp, token_logp(logits, ids[:, P:], 0.8), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_forward_response_activation_checkpointing_gives_the_same_gradients(name):
    from tests.test_fastlm import ragged_batch

    model = _models()[name]().train()
    ids, attn, P = ragged_batch(15, [3, 7, 1], [6, 2, 4], 6)
    calls = []
    # a pre-hook on each layer's first module: the recomputation stops as soon as it has what the backward needs,
    # before a forward hook would run; and on a module inside the layer, since transformers from 5.24 on recomputes
    # a layer's forward, not its __call__ (the layer's own hooks stay outside the checkpoint)
    hooks = [layer.input_layernorm.register_forward_pre_hook(lambda *a: calls.append(1))
             for layer in model.model.layers]
    runs = {}
    for ck in (False, True, "selective"):
        calls.clear()
        with warnings.catch_warnings():  # transformers' deprecated gradient_checkpointing_* names warn from 5.24 on
            warnings.simplefilter("error", FutureWarning)
            runs[ck] = _grads(model, lambda: forward_response(model, ids, attn, P, 0.8, checkpoint_layers=ck))
        runs[ck] += (len(calls),)
    for h in hooks:
        h.remove()
    layers = model.config.num_hidden_layers
    for ck in (True, "selective"):
        _assert_same(runs[ck], runs[False], rtol=1e-6)
        assert (runs[False][4], runs[ck][4]) == (layers, 2 * layers)  # each layer ran again in the backward
    # off again after the call (generate needs the KV cache), and no hook left on the embedding
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert not model.get_input_embeddings()._forward_hooks


def test_forward_response_never_holds_positions_by_vocabulary():
    from tests.test_fastlm import big_vocab_qwen3, ragged_batch
    from tests.test_lm_head import LargestTensor

    model = big_vocab_qwen3()
    ids, attn, P = ragged_batch(16, [5] * 8, [40] * 8, 40)
    most = {}
    for chunk in (0, 16):
        with LargestTensor() as seen:
            _grads(model, lambda: forward_response(model, ids, attn, P, with_entropy=True, logit_chunk_tokens=chunk))
        most[chunk] = seen.most
    bt, v = 8 * 40, model.config.vocab_size
    assert most[0] >= bt * v and most[16] <= max(16 * v, v * 32) <= bt * v / 10
