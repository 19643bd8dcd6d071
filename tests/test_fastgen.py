"""The fast rollout engine (gspo_bench.rollout.fastgen, engine.fast_generate) against transformers."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from gspo_bench.rollout import engine, fastgen
from gspo_bench.rollout.engine import fast_generate, forward_response, hf_generate
from gspo_bench.rollout.engines import generate, resolve_engine
from gspo_bench.rollout.fastgen import FastDecoder, decode, sample
from gspo_bench.models import build_builtin
from tests.conftest import sharpen

PROMPTS = ["1+2=", "33+44=", "5+60=", "123+456=", "9+9=", "12+7=", "0+0=", "88+1="]
# random weights mostly repeat the prompt's last character; these prompts lead elsewhere too
VARIED = ["abc", "1+2=", "Hello world", "x", "7*8-2=", "33+44=", "88+1="]


def with_many_eos(model, tok, n_extra: int = 8):
    """Random weights rarely emit eos: make eos plus ``n_extra`` ordinary tokens end a row (generation config,
    read by both engines), so a batch has rows of different lengths."""
    extra = [tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"[:n_extra]]
    model.generation_config.eos_token_id = [tok.eos_token_id, *extra]
    return model.generation_config.eos_token_id


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe", "tiny-dense-sharp", "tiny-moe-sharp"])
def qwen(request):
    model, tok = build_builtin(request.param.removesuffix("-sharp"), 0)
    if request.param.endswith("-sharp"):
        sharpen(model)
    eos = with_many_eos(model, tok)
    return model.eval(), tok, eos


# ----------------------------------------------------------------------------- sample


def test_sample_frequencies_match_the_tempered_softmax():
    probs = torch.tensor([0.4, 0.25, 0.0, 0.2, 0.098, 0.05, 0.002, 0.0])
    logits = probs.log()  # zero-probability tokens have logit -inf
    n, temp = 200_000, 0.7
    p = torch.softmax(logits.double() / temp, -1)
    assert 5e-5 < p[6] < 5e-4  # the tiny token: an expected count of a few dozen in 200k draws
    g = torch.Generator().manual_seed(0)
    tok, lp = sample(logits.expand(n, -1), temp, greedy=False, generator=g)
    assert tok.shape == lp.shape == (n,) and tok.dtype == torch.long
    counts = torch.bincount(tok, minlength=len(probs)).double()
    freq = counts / n
    se = (p * (1 - p) / n).sqrt()
    for v in range(len(probs)):
        assert abs(freq[v] - p[v]) <= 5 * se[v] + 1e-12, (v, freq[v].item(), p[v].item())
    assert counts[2] == counts[7] == 0  # never a zero-probability token, also not the last one
    assert counts[6] > 0
    # log-probs of the drawn tokens: log softmax(logits / T) at those tokens
    want = torch.log_softmax(logits / temp, -1)[tok]
    torch.testing.assert_close(lp, want, atol=1e-6, rtol=1e-6)


def test_sample_is_reproducible_from_the_generator_and_per_row():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(1))
    a, la = sample(logits, 1.3, False, torch.Generator().manual_seed(7))
    b, lb = sample(logits, 1.3, False, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and torch.equal(la, lb)
    want = torch.log_softmax(logits / 1.3, -1).gather(-1, a[:, None])[:, 0]
    torch.testing.assert_close(la, want, atol=1e-6, rtol=1e-6)


def test_sample_greedy_is_argmax_without_logp():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 4.9, 0.0], [-2.0, -3.0, -1.5]])
    tok, lp = sample(logits, 0.7, greedy=True)
    assert tok.tolist() == [1, 0, 2] and lp is None


# ----------------------------------------------------------------------------- fast_generate


def check_layout(g, tok, prompts, eos):
    enc = tok(prompts, padding=True, add_special_tokens=False)
    P = len(enc["input_ids"][0])
    B, T = len(prompts), g.response_mask.shape[1]
    assert g.prompt_len == P
    assert g.input_ids[:, :P].tolist() == enc["input_ids"]
    assert g.attention_mask.tolist() == torch.cat([torch.tensor(enc["attention_mask"]),
                                                   g.response_mask.long()], 1).tolist()
    ended = 0
    for b in range(B):
        r, m = g.input_ids[b, P:].tolist(), g.response_mask[b].tolist()
        n = int(sum(m))
        assert m == [1.0] * n + [0.0] * (T - n)
        assert r[n:] == [tok.pad_token_id] * (T - n)
        assert not set(r[: n - 1]) & set(eos)  # no eos before the last kept token
        if n < T:
            assert r[n - 1] in eos
            ended += 1
        assert g.texts[b] == tok.decode(r[:n], skip_special_tokens=True)
    return ended


def test_fast_generate_logp_equal_a_fresh_forward(qwen):
    model, tok, eos = qwen
    g = fast_generate(model, tok, PROMPTS, max_new_tokens=8, temperature=0.7,
                      generator=torch.Generator().manual_seed(0))
    ended = check_layout(g, tok, PROMPTS, eos)
    assert 0 < ended < len(PROMPTS)  # ragged responses: some rows stopped early, some ran to the cap
    with torch.no_grad():
        fresh, _, _ = forward_response(model, g.input_ids, g.attention_mask, g.prompt_len, temperature=0.7)
    m = g.response_mask
    torch.testing.assert_close(g.rollout_logp, fresh * m, atol=1e-4, rtol=1e-4)
    assert (g.rollout_logp[m == 0] == 0).all() and (g.rollout_logp[m == 1] < 0).all()


def test_fast_generate_without_logp(qwen):
    model, tok, _ = qwen
    g = fast_generate(model, tok, PROMPTS[:3], max_new_tokens=4, return_logp=False,
                      generator=torch.Generator().manual_seed(0))
    assert g.rollout_logp is None and g.response_mask.shape[0] == 3


def test_greedy_fast_generate_equals_greedy_hf_generate(qwen):
    model, tok, eos = qwen
    a = fast_generate(model, tok, VARIED, max_new_tokens=10, greedy=True)
    b = hf_generate(model, tok, VARIED, max_new_tokens=10, greedy=True)
    assert a.rollout_logp is None
    assert a.texts == b.texts
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.response_mask, b.response_mask)
    assert 0 < check_layout(a, tok, VARIED, eos) < len(VARIED)


def test_groups_of_one_prompt_share_its_prefill_and_sample_as_alone(qwen, monkeypatch):
    # a rollout's layout: every prompt G times. The prefill runs once per distinct prompt, yet greedy rows
    # equal transformers' and sampled log-probs equal a fresh forward over the finished rollout
    model, tok, eos = qwen
    grouped = [p for p in VARIED[:4] for _ in range(3)]
    widths = []
    orig = FastDecoder.prefill
    monkeypatch.setattr(FastDecoder, "prefill", lambda self, ids, *a: widths.append(len(ids)) or orig(self, ids, *a))
    a = fast_generate(model, tok, grouped, max_new_tokens=8, greedy=True)
    assert widths == [4]
    assert a.texts == hf_generate(model, tok, grouped, max_new_tokens=8, greedy=True).texts
    assert a.texts[0] == a.texts[1] == a.texts[2]
    g = fast_generate(model, tok, grouped, max_new_tokens=8, temperature=0.7, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fresh, _, _ = forward_response(model, g.input_ids, g.attention_mask, g.prompt_len, temperature=0.7)
    torch.testing.assert_close(g.rollout_logp, fresh * g.response_mask, atol=1e-4, rtol=1e-4)
    assert len(set(g.texts)) > 4  # the samples of one prompt differ: the shared cache was copied, not aliased


@pytest.mark.parametrize("name, short, sharp", [("tiny-dense", "Hello world", False), ("tiny-moe", "7*8-2=", False),
                                                ("tiny-dense", "7+8=", True), ("tiny-moe", "7+8=", True)])
def test_left_padding_does_not_change_a_rows_output(name, short, sharp):
    model, tok = build_builtin(name, 0)  # eos only: the row runs to the cap
    if sharp:
        sharpen(model)
    model.eval()
    alone = fast_generate(model, tok, [short], max_new_tokens=10, greedy=True)
    batch = fast_generate(model, tok, ["123456+654321=+9", short, "99999+1="], max_new_tokens=10, greedy=True)
    assert batch.attention_mask[1, : batch.prompt_len].tolist().count(0) == 16 - len(short)  # left-padded
    assert len(set(alone.texts[0])) > 1  # not one character repeated: the decode steps matter
    n = int(alone.response_mask[0].sum())
    assert int(batch.response_mask[1].sum()) == n
    assert batch.input_ids[1, batch.prompt_len:][:n].tolist() == alone.input_ids[0, alone.prompt_len:][:n].tolist()
    assert batch.texts[1] == alone.texts[0]


# ----------------------------------------------------------------------------- compaction


def first_eos(tokens: torch.Tensor, eos: list[int]) -> list[int]:
    """Index of each row's first eos, or the row length when there is none."""
    hit = torch.isin(tokens, torch.tensor(eos))
    return [int(h.nonzero()[0]) if h.any() else tokens.shape[1] for h in hit]


def masked(tokens, eos):
    out = tokens.clone()
    for b, i in enumerate(first_eos(tokens, eos)):
        out[b, i + 1:] = -1
    return out


@pytest.fixture(scope="module")
def dense_batch():
    model, tok = build_builtin("tiny-dense", 0)
    sharpen(model)  # greedy rows then wander instead of repeating one token
    prompts = [f"{i * 7}+{i * 13}=" for i in range(16)]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    # 15 of the 99 ids end a row, so rows finish at different steps (some run to the cap of 12)
    eos = torch.randperm(96, generator=torch.Generator().manual_seed(0))[:15].add(3).tolist()
    return model.eval(), enc["input_ids"], enc["attention_mask"], eos


def record_step_sizes(monkeypatch):
    sizes = []
    orig = FastDecoder.step

    def step(self, tok, *args, **kwargs):
        sizes.append(tok.shape[0])
        return orig(self, tok, *args, **kwargs)

    monkeypatch.setattr(FastDecoder, "step", step)
    return sizes


def test_finished_rows_leave_the_batch(dense_batch, monkeypatch):
    model, ids, attn, eos = dense_batch
    B = ids.shape[0]
    sizes = record_step_sizes(monkeypatch)
    toks, lp = decode(model, ids, attn, max_new_tokens=12, eos_ids=eos, greedy=False,
                      generator=torch.Generator().manual_seed(0))
    assert lp.shape == toks.shape
    assert sizes and all(a >= b for a, b in zip(sizes, sizes[1:]))
    assert sizes[-1] < B
    # rows still running after the token of step s are all in the batch of the step that follows
    ends = first_eos(toks, eos)
    for s, size in enumerate(sizes):
        assert size >= sum(e > s for e in ends)


def test_eager_compaction_keeps_exactly_the_live_rows(dense_batch, monkeypatch):
    model, ids, attn, eos = dense_batch
    sizes = record_step_sizes(monkeypatch)
    # any threshold below 1/B compacts as soon as one row is done
    toks, _ = decode(model, ids, attn, max_new_tokens=12, eos_ids=eos, greedy=True, compact_frac=1e-9)
    ends = first_eos(toks, eos)
    assert sizes == [sum(e > s for e in ends) for s in range(len(sizes))]
    assert len(sizes) == toks.shape[1] - 1  # no step after the last sampled token
    assert toks.shape[1] == min(12, max(ends) + 1)  # stopped when the last row ended, or at the cap


def test_decoding_stops_when_every_row_has_ended(dense_batch, monkeypatch):
    model, ids, attn, _ = dense_batch
    eos = torch.randperm(96, generator=torch.Generator().manual_seed(1))[:40].add(3).tolist()
    sizes = record_step_sizes(monkeypatch)
    toks, lp = decode(model, ids, attn, max_new_tokens=12, eos_ids=eos, generator=torch.Generator().manual_seed(0))
    ends = first_eos(toks, eos)
    assert max(ends) < 11 and toks.shape == lp.shape == (16, max(ends) + 1)  # every row ended: no further steps
    assert len(sizes) == max(ends)


def test_compaction_does_not_change_greedy_output(dense_batch, monkeypatch):
    model, ids, attn, eos = dense_batch
    B = ids.shape[0]
    sizes = record_step_sizes(monkeypatch)
    a, la = decode(model, ids, attn, max_new_tokens=12, eos_ids=eos, greedy=True, compact_frac=0.125)
    compacted = list(sizes)
    sizes.clear()
    b, lb = decode(model, ids, attn, max_new_tokens=12, eos_ids=eos, greedy=True, compact_frac=2.0)
    assert la is None and lb is None
    assert compacted[-1] < B and set(sizes) == {B}  # the first run compacted, the second never did
    assert a.shape == b.shape
    assert torch.equal(masked(a, eos), masked(b, eos))


# ----------------------------------------------------------------------------- no weight copies


def test_decoder_reads_the_models_own_parameters():
    model, tok = build_builtin("tiny-moe", 0)
    dec = FastDecoder(model)
    assert dec.embed is model.model.embed_tokens.weight
    for ref, layer in zip(dec.refs, model.model.layers):
        att = layer.self_attn
        assert ref.q[0] is att.q_proj.weight and ref.k[0] is att.k_proj.weight
        assert ref.v[0] is att.v_proj.weight and ref.o[0] is att.o_proj.weight
        assert ref.qn is att.q_norm.weight and ref.kn is att.k_norm.weight
        assert ref.ln1 is layer.input_layernorm.weight and ref.ln2 is layer.post_attention_layernorm.weight
        assert ref.mlp is layer.mlp  # experts read through the module, at call time
    dense, _ = build_builtin("tiny-dense", 0)
    for ref, layer in zip(FastDecoder(dense).refs, dense.model.layers):
        assert ref.dense[0] is layer.mlp.gate_proj.weight and ref.dense[1] is layer.mlp.up_proj.weight
        assert ref.dense[2] is layer.mlp.down_proj.weight


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_in_place_parameter_edits_reach_the_next_rollout(name):
    model, tok = build_builtin(name, 0)
    model.eval()
    prompts = PROMPTS[:4]
    before = fast_generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    with torch.no_grad():  # what an optimiser step does: in place, same tensor objects
        for layer in model.model.layers[:2]:
            if hasattr(layer.mlp, "experts"):
                layer.mlp.experts.down_proj.zero_()
            else:
                layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight[5:40].mul_(-3.0)  # tied: the embedding changes too
    after = fast_generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    ref = hf_generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    assert after.texts != before.texts
    assert after.texts == ref.texts and torch.equal(after.input_ids, ref.input_ids)
    # a final norm of zeros makes every logit 0: argmax is token 0 (pad) at every step
    with torch.no_grad():
        model.model.norm.weight.zero_()
    flat = fast_generate(model, tok, prompts, max_new_tokens=3, greedy=True)
    assert (flat.input_ids[:, flat.prompt_len:] == tok.pad_token_id).all() and flat.texts == [""] * 4


# ----------------------------------------------------------------------------- engine choice


def tiny_llama(tok):
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def test_engine_choice_for_an_unsupported_model(monkeypatch):
    qwen, tok = build_builtin("tiny-dense", 0)
    llama = tiny_llama(tok)
    assert resolve_engine("auto", qwen) == "fast"
    assert resolve_engine("auto", llama) == "hf"
    assert resolve_engine("hf", qwen) == "hf"
    with pytest.raises(ValueError, match="hf"):
        generate("fast", llama, tok, PROMPTS[:2], max_new_tokens=4)
    with pytest.raises(ValueError, match="hf"):
        FastDecoder(llama)
    calls = []
    orig = engine.hf_generate

    def spy(*args, **kwargs):
        calls.append(args[0])
        return orig(*args, **kwargs)

    monkeypatch.setattr(engine, "hf_generate", spy)
    g = generate("auto", llama, tok, PROMPTS[:3], max_new_tokens=4, greedy=True)
    assert calls == [llama]
    want = orig(llama, tok, PROMPTS[:3], max_new_tokens=4, greedy=True)
    assert g.texts == want.texts and torch.equal(g.input_ids, want.input_ids)
    # and auto on the Qwen3 model goes through the fast engine, not transformers
    calls.clear()
    a = generate("auto", qwen, tok, PROMPTS[:3], max_new_tokens=4, greedy=True)
    assert calls == []
    assert a.texts == orig(qwen, tok, PROMPTS[:3], max_new_tokens=4, greedy=True).texts


def test_sampled_tokens_follow_the_model_distribution():
    # one prompt repeated: the first sampled token's frequencies match softmax(logits / T) of the prompt
    model, tok = build_builtin("tiny-dense", 0)
    model.eval()
    n, temp = 2000, 0.7
    g = fast_generate(model, tok, ["12+34="] * n, max_new_tokens=1, temperature=temp,
                      generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ids = tok(["12+34="], return_tensors="pt", add_special_tokens=False)["input_ids"]
        p = torch.softmax(model(input_ids=ids).logits[0, -1].double() / temp, -1)
    first = g.input_ids[:, g.prompt_len]
    freq = torch.bincount(first, minlength=len(p)).double() / n
    se = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1.5 / n).all()
    assert math.isclose(freq.sum().item(), 1.0)


def test_logits_processors_in_the_generation_config_send_auto_to_transformers():
    model, tok = build_builtin("tiny-dense", 0)
    assert fastgen.unsupported_reason(model) is None
    model.generation_config.suppress_tokens = [5, 6]
    assert "suppress_tokens" in fastgen.unsupported_reason(model)
    assert resolve_engine("auto", model) == "hf"
    with pytest.raises(ValueError, match="suppress_tokens"):
        FastDecoder(model)
    # neutral values ("off") keep the fast engine
    model.generation_config.suppress_tokens = None
    model.generation_config.repetition_penalty = 1.0
    assert resolve_engine("auto", model) == "fast"


# ----------------------------------------------------------------------------- partial rollouts
def test_a_swap_mid_response_continues_under_the_new_weights_on_the_old_cache():
    """``swap`` loads new weights between two decode steps: the tokens before are the old weights' (the same
    as a decode without it, draw for draw) and tagged with the first version; every token after is tagged with
    the new one and drawn from the new weights attending to the keys and values the old ones cached, as
    transformers computes it when one model's cache is handed to the other."""
    import copy

    model, tok = build_builtin("tiny-dense", 0)
    model.eval()
    g = torch.Generator().manual_seed(1)
    new_state = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    enc = tok(["12+7="] * 3, return_tensors="pt")
    T = 8

    def run(swap_at: int | None):
        m, calls = copy.deepcopy(model), [0]

        def swap():
            calls[0] += 1
            if calls[0] == swap_at:
                m.load_state_dict(new_state)
                return 5
            return None

        versions = torch.full((3, T), 4, dtype=torch.long)
        toks, lp = decode(m, enc["input_ids"], enc["attention_mask"], max_new_tokens=T, eos_ids=[-1],
                          generator=torch.Generator().manual_seed(0), swap=swap, versions=versions)
        return toks, lp, versions

    toks_a, lp_a, vers_a = run(None)
    toks, lp, vers = run(3)  # before the third decode step: tokens 0-2 old, 3 on new
    assert toks.shape == (3, T) and bool((vers_a == 4).all())
    assert bool((vers[:, :3] == 4).all()) and bool((vers[:, 3:] == 5).all())
    assert torch.equal(toks[:, :3], toks_a[:, :3]) and torch.equal(lp[:, :3], lp_a[:, :3])
    assert not torch.equal(lp[:, 3:], lp_a[:, 3:])
    new = copy.deepcopy(model)
    new.load_state_dict(new_state)
    for r in range(3):
        with torch.no_grad():
            head = model(torch.cat([enc["input_ids"][r], toks[r, :2]])[None], use_cache=True)
            tail = new(toks[r, 2:T - 1][None], past_key_values=head.past_key_values, use_cache=True)
        # token j >= 3 is drawn from the logits of feeding token j - 1 to the new weights
        want = torch.log_softmax(tail.logits[0].float(), -1).gather(-1, toks[r, 3:, None])[:, 0]
        assert torch.allclose(lp[r, 3:], want, atol=1e-4), (r, lp[r, 3:], want)
