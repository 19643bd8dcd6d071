"""Log-probs and entropy through the LM head in token chunks (gspo_bench.core.lm_head) against all tokens at once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gspo_bench.core.lm_head import token_logp_entropy

N, H, V = 37, 16, 101


def inputs(seed: int = 0, bias: bool = True, n: int = N, v: int = V):
    """h (n, H), weight (v, H), bias (v,) or None, targets (n,), and per-token weights for the loss."""
    g = torch.Generator().manual_seed(seed)
    h = (2 * torch.randn(n, H, generator=g)).requires_grad_(True)
    w = torch.randn(v, H, generator=g).requires_grad_(True)
    b = torch.randn(v, generator=g).requires_grad_(True) if bias else None
    return h, w, b, torch.randint(0, v, (n,), generator=g), torch.randn(n, generator=g)


def run(chunk: int, temperature: float = 0.7, bias: bool = True, autocast: bool = False, seed: int = 0):
    """(log p, entropy, grad h, grad W, grad b) of sum_n c_n log p_n."""
    h, w, b, y, c = inputs(seed, bias)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logp, ent = token_logp_entropy(h * 1.0, w, b, y, temperature, chunk, with_entropy=True)
    (logp * c).sum().backward()
    return logp.detach(), ent, h.grad, w.grad, None if b is None else b.grad


def assert_close_to(got, want, rtol):
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        err = (a - b).abs().max().item()
        assert err <= rtol * b.abs().max().item() + 1e-7, (err, b.abs().max().item())


# ----------------------------------------------------------------------------- values and gradients


@pytest.mark.parametrize("chunk", [1, 5, 16, N, 1000])  # 5 and 16 do not divide 37; 1000 > N: one chunk
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
def test_chunks_equal_all_tokens_at_once(chunk, temperature, bias):
    want = run(0, temperature, bias)
    got = run(chunk, temperature, bias)
    assert_close_to(got, want, rtol=2e-6)
    assert got[1].shape == got[0].shape == (N,) and got[0].dtype == got[1].dtype == torch.float32
    assert got[1].requires_grad is False


def test_all_at_once_is_the_log_softmax_by_hand():
    h, w, b, y, _ = inputs(1)
    with torch.no_grad():
        logp, ent = token_logp_entropy(h, w, b, y, 0.5, 0, with_entropy=True)
        z = (h.double() @ w.double().T + b.double()) / 0.5
        lsm = torch.log_softmax(z, -1)
    torch.testing.assert_close(logp.double(), lsm.gather(-1, y[:, None])[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), -(lsm.exp() * lsm).sum(-1), atol=1e-5, rtol=1e-5)
    assert (ent >= 0).all() and (ent <= math.log(V) + 1e-5).all()


def test_gradient_is_onehot_minus_softmax_over_temperature():
    # d log p(y) / d logits = (onehot(y) - softmax(logits / T)) / T: with W = identity the logits are h itself
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, 7, generator=g).requires_grad_(True)
    y = torch.tensor([0, 3, 6, 3, 1])
    logp, _ = token_logp_entropy(h, torch.eye(7), None, y, 0.6, 2)
    logp.sum().backward()
    want = (F.one_hot(y, 7) - torch.softmax(h.detach() / 0.6, -1)) / 0.6
    torch.testing.assert_close(h.grad, want, atol=1e-6, rtol=1e-6)


def test_entropy_is_optional_and_carries_no_gradient():
    h, w, b, y, _ = inputs(3)
    logp, ent = token_logp_entropy(h, w, b, y, 1.0, 8)
    assert ent is None and logp.requires_grad


def test_temperature_changes_the_distribution():
    a, b = run(7, 1.0), run(7, 0.7)
    assert (a[0] - b[0]).abs().max() > 1e-3 and (a[1] - b[1]).abs().max() > 1e-3


def test_no_tokens():
    h, w, b, y, _ = inputs(4, n=0)
    logp, ent = token_logp_entropy(h, w, b, y, 1.0, 8, with_entropy=True)
    logp.sum().backward()
    assert logp.shape == ent.shape == (0,)
    assert h.grad.shape == (0, H) and (w.grad == 0).all() and (b.grad == 0).all()


def test_a_frozen_weight_gets_no_gradient_and_h_the_same():
    h, w, b, y, c = inputs(5)
    w.requires_grad_(False)
    (token_logp_entropy(h, w, b, y, 0.7, 4)[0] * c).sum().backward()
    want = h.grad.clone()
    h.grad = None
    (token_logp_entropy(h, w, b, y, 0.7, 0)[0] * c).sum().backward()
    assert w.grad is None
    assert_close_to((want,), (h.grad,), rtol=2e-6)


@pytest.mark.parametrize("chunk", [-1, 2.0, True])
def test_bad_chunk_sizes_are_refused(chunk):
    h, w, b, y, _ = inputs(6)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logp_entropy(h, w, b, y, 1.0, chunk)


# ----------------------------------------------------------------------------- tied head, bf16 autocast


def test_tied_head_gradients_add_up():
    """The head's weight is the input embedding (tie_word_embeddings): h is built from embedding rows, and the
    weight's gradient is the sum of the embedding's and the head's; chunked equals all at once."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, V, (N,), generator=g)
    y = torch.randint(0, V, (N,), generator=g)
    mix = torch.randn(H, H, generator=g) / 4
    grads = []
    for chunk in (0, 6):
        emb = torch.randn(V, H, generator=torch.Generator().manual_seed(8)).requires_grad_(True)
        h = torch.tanh(emb[tokens] @ mix)  # a stand-in for the decoder stack
        logp, _ = token_logp_entropy(h, emb, None, y, 0.8, chunk)
        logp.sum().backward()
        grads.append(emb.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)
    # both paths reach the weight: rows that are only embedded and rows that are only predicted
    only_in = sorted(set(tokens.tolist()) - set(y.tolist()))
    assert only_in and (grads[1][only_in] != 0).any()


def test_bf16_autocast_matches_the_unchunked_autocast_forward():
    """As ``train.precision: bf16-mixed`` runs it: the head's matmuls in bfloat16, the softmax in float32. One
    chunk is the very same computation; several differ only where bf16 partial sums of grad W round."""
    want = run(0, autocast=True)
    assert_close_to(run(N, autocast=True), want, rtol=1e-6)
    assert_close_to(run(5, autocast=True), want, rtol=2e-2)
    logp, ent, gh, _, _ = run(5, autocast=True)
    assert_close_to((logp, ent, gh), want[:3], rtol=1e-6)  # per-token values and grad h: exact
    f32 = run(5)
    assert (logp - f32[0]).abs().max() > 1e-4  # autocast really ran the matmul in bf16


# ----------------------------------------------------------------------------- memory


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op returned while active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("autocast", [False, True])
def test_no_tokens_by_vocabulary_tensor_is_ever_made(autocast):
    """n = 600 tokens, V = 1000, chunk 64: nothing as large as (n, V) exists in the forward or the backward,
    while the unchunked computation makes several."""
    n, v, chunk = 600, 1000, 64
    sizes = {}
    for c in (0, chunk):
        h, w, b, y, wt = inputs(9, n=n, v=v)
        with LargestTensor() as seen, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, ent = token_logp_entropy(h, w, b, y, 0.7, c, with_entropy=True)
            (logp * wt).sum().backward()
        sizes[c] = seen.most
    assert sizes[0] >= n * v
    assert sizes[chunk] <= max(chunk * v, v * H, n * H) < n * v


# ----------------------------------------------------------------------------- auto: chunks sized to the device
def test_auto_chunks_keep_a_chunk_s_working_set_within_a_sixteenth_of_the_device_s_memory():
    from gspo_bench.core.lm_head import auto_chunk_tokens

    gib = 2**30
    # 24 GiB / 16 = 1.5 GiB; 3 x 151,936 x 4 bytes = 1.82 MB per token -> 883 tokens -> 768 (a multiple of 256)
    assert auto_chunk_tokens(151_936, 24 * gib) == 768
    # 141 GiB / 16 / 1.82 MB = 5,190 tokens -> 5,120
    assert auto_chunk_tokens(151_936, 141 * gib) == 5_120
    assert auto_chunk_tokens(151_936, 2 * gib) == 256  # never below 256 tokens
    assert auto_chunk_tokens(101, 24 * gib) == 65_536  # a small vocabulary: one chunk for any minibatch here
    for v, mem in ((151_936, 24 * gib), (32_000, 80 * gib), (262_144, 141 * gib)):
        c = auto_chunk_tokens(v, mem)
        assert c % 256 == 0 and (c == 256 or 3 * c * v * 4 <= mem / 16 < 3 * (c + 256) * v * 4)


def test_auto_computes_what_the_chunk_it_resolves_to_computes(monkeypatch):
    """``auto`` on a device whose memory gives 256-token chunks: 600 tokens in three chunks, the same numbers,
    gradients included, bit for bit, as ``chunk_tokens=256``; the device's memory is read once."""
    from gspo_bench.core import lm_head

    reads = []
    lm_head.device_memory.cache_clear()
    monkeypatch.setattr(lm_head.os, "sysconf", lambda name: reads.append(name) or {"SC_PAGE_SIZE": 4096,
                                                                                    "SC_PHYS_PAGES": 2**11}[name])
    assert lm_head.auto_chunk_tokens(V, lm_head.device_memory(torch.device("cpu"))) == 256  # 8 MiB at V = 101
    out = {}
    for chunk in ("auto", 256):
        h, w, b, y, c = inputs(3, n=600)
        logp, ent = token_logp_entropy(h, w, b, y, 0.9, chunk, with_entropy=True)
        (logp * c).sum().backward()
        out[chunk] = (logp, ent, h.grad, w.grad, b.grad)
    for a, b_ in zip(out["auto"], out[256]):
        assert torch.equal(a, b_)
    assert reads == ["SC_PAGE_SIZE", "SC_PHYS_PAGES"]  # cached: once per device
    lm_head.device_memory.cache_clear()
    with pytest.raises(ValueError, match="or auto"):
        token_logp_entropy(*inputs()[:4], 1.0, "big")
