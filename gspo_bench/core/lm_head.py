"""Log-probs and entropy of given tokens through the LM head, a chunk of tokens at a time.

At a real vocabulary the LM head's output is the largest tensor of a training
forward: Qwen3's 151,936 tokens make float32 logits of 0.6 MB per token, about
10 GB for a minibatch of 16k response tokens, and the log-softmax and its
gradient as much again each. ``token_logp_entropy`` computes the same numbers
with at most ``chunk_tokens`` tokens' logits alive at once. Its forward keeps
only what the backward cannot cheaply redo, the per-token logsumexp (N,); the
backward recomputes each chunk's logits from the hidden states and the head's
weight (one more head matmul per step) and turns them into the chunk's share
of the gradients at once:

    z = (h W^T + b) / temperature,   log p(y) = z_y - logsumexp(z)
    d log p(y) / d logits_v = (1[v = y] - softmax(z)_v) / temperature
    d H / d logits_v = -p_v (log p_v + H) / temperature      (H = -sum_v p_v log p_v, when it carries a gradient)
    grad h = G W,   grad W = G^T h,   grad b = sum_n G   (G: the chunk's gradient wrt its logits)

Under autocast (``train.precision: bf16-mixed``) the head's matmuls run in the
autocast dtype, as autocast runs the unchunked ``F.linear`` and its backward,
and everything after the matmul in float32. A tied head (the weight is the
input embedding) needs nothing special: autograd adds this function's weight
gradient to the embedding's.

May import: torch only (``core``'s rule).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from gspo_bench.core.accumulate import accumulating_linear, kept_grad, linear_dtype

Tensor = torch.Tensor

HEAD_MEMORY_SHARE = 1 / 16
"""``auto`` chunks: the share of the device's memory one chunk's float32 (C, V) working set may take."""
WORKING_SET = 3
"""(C, V) float32 tensors alive at once while a chunk is computed: its logits, their softmax (or log-softmax and
its exponential), and their gradient in the backward."""
AUTO_CHUNK_STEP, AUTO_CHUNK_MAX = 256, 65_536
"""``auto`` chunks are a multiple of 256 tokens, at least 256, at most 65,536 (on a small vocabulary: every
token of a minibatch at once, in practice)."""


@functools.cache
def device_memory(device: torch.device) -> int:
    """Bytes of memory of ``device``: a GPU's total memory, else the machine's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def auto_chunk_tokens(vocab: int, memory_bytes: int) -> int:
    """Tokens per chunk of the LM head on a device of ``memory_bytes``: as many as keep the chunk's working set
    within ``HEAD_MEMORY_SHARE`` of it, since larger chunks run fewer, larger matrix products.

    Fixed by the device's total memory and the vocabulary, not by the memory free at the moment: the chunks
    decide the order in which the head's weight gradient is summed, so a run computes the same numbers on
    every step and on a resume."""
    # C = share x memory / (WORKING_SET x V x 4 bytes), down to a multiple of 256 within [256, 65,536]
    fit = int(HEAD_MEMORY_SHARE * memory_bytes) // (WORKING_SET * vocab * 4)
    return max(AUTO_CHUNK_STEP, min(AUTO_CHUNK_MAX, fit // AUTO_CHUNK_STEP * AUTO_CHUNK_STEP))


def _logits(h_CH: Tensor, w_VH: Tensor, b_V: Tensor | None, temperature: float) -> Tensor:
    # z = (h W^T + b) / temperature: the matmul in the operands' dtype (cast already), z in float32
    return F.linear(h_CH, w_VH, b_V).float().div_(temperature)  # (C, V)


def _spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


class ChunkedHeadLogp(torch.autograd.Function):
    """(log p(target), entropy) per token with the logits recomputed chunk by chunk in the backward.

    Inputs: h (N, H), weight (V, H), bias (V,) or None, target (N,), temperature, chunk, with_entropy,
    entropy_grad. The entropy output (an empty tensor when not asked for) carries a gradient only with
    ``entropy_grad`` (an entropy bonus in the loss).
    """

    @staticmethod
    def forward(ctx, h_NH, weight_VH, bias_V, target_N, temperature, chunk, with_entropy, entropy_grad=False,
                accumulate=False):
        dt = linear_dtype(h_NH, weight_VH)
        n = h_NH.shape[0]
        lse_N = torch.empty(n, dtype=torch.float32, device=h_NH.device)
        logp_N = torch.empty_like(lse_N)
        ent_N = torch.empty_like(lse_N) if with_entropy else lse_N.new_empty(0)
        with torch.autocast(h_NH.device.type, enabled=False):
            w, b = weight_VH.to(dt), None if bias_V is None else bias_V.to(dt)
            for s, e in _spans(n, chunk):
                z = _logits(h_NH[s:e].to(dt), w, b, temperature)
                lse = torch.logsumexp(z, dim=-1)
                # log p(y) = z_y - logsumexp(z)
                logp_N[s:e] = z.gather(-1, target_N[s:e, None])[:, 0] - lse
                if with_entropy:
                    # H = -sum_v p_v log p_v, with log p = z - logsumexp(z) (in place: z is not needed after)
                    lsm = z.sub_(lse[:, None])
                    ent_N[s:e] = -(lsm.exp() * lsm).sum(-1)
                lse_N[s:e] = lse
        ctx.entropy_grad = bool(with_entropy and entropy_grad)
        ctx.save_for_backward(h_NH, weight_VH, bias_V, target_N, lse_N, ent_N if ctx.entropy_grad else None)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dt
        ctx.params = (weight_VH, bias_V) if accumulate else None
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(ent_N)
        return logp_N, ent_N

    @staticmethod
    def backward(ctx, g_logp_N, g_ent_N):
        h_NH, weight_VH, bias_V, target_N, lse_N, ent_N = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dt, temperature = ctx.dtype, ctx.temperature
        grad_h = torch.empty_like(h_NH) if need_h else None
        # the weight's and bias's gradients add up over chunks in float32 whatever the matmul's dtype: into
        # their float32 .grad itself when accumulating (a micro-batch after the first; core/accumulate.py),
        # else into zeros handed to autograd
        kept_w, kept_b = (_float32_grad(p) for p in (ctx.params or (None, None)))
        grad_w = kept_w if kept_w is not None else torch.zeros(
            weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if need_w else None
        grad_b = kept_b if kept_b is not None else torch.zeros(
            bias_V.shape, dtype=torch.float32, device=bias_V.device) if need_b else None
        with torch.autocast(h_NH.device.type, enabled=False):
            w, b = weight_VH.to(dt), None if bias_V is None else bias_V.to(dt)
            for s, e in _spans(h_NH.shape[0], ctx.chunk):
                h_c = h_NH[s:e].to(dt)
                if ctx.entropy_grad and g_ent_N is not None:
                    # log p = z - logsumexp(z), the logsumexp the forward kept; p = exp(log p)
                    lsm = _logits(h_c, w, b, temperature).sub_(lse_N[s:e, None])  # (C, V)
                    p = lsm.exp()
                    # G = [(onehot(y) - p) * g_logp - p * (log p + H) * g_H] / temperature
                    g = (g_logp_N[s:e] / temperature)[:, None]
                    g_h = (g_ent_N[s:e] / temperature)[:, None]
                    G = (-p * g).scatter_add_(1, target_N[s:e, None], g) - p * (lsm + ent_N[s:e, None]) * g_h
                    G = G.to(dt)
                else:
                    # softmax(z) = exp(z - logsumexp(z)), the logsumexp the forward kept
                    p = _logits(h_c, w, b, temperature).sub_(lse_N[s:e, None]).exp_()  # (C, V)
                    # G = (onehot(y) - softmax(z)) * g / temperature, in the matmul's dtype as autocast's backward
                    # has it
                    g = (g_logp_N[s:e] / temperature)[:, None]
                    G = p.neg_().scatter_add_(1, target_N[s:e, None], torch.ones_like(g)).mul_(g).to(dt)
                if need_h:
                    # grad h = G W
                    grad_h[s:e] = G @ w
                if need_w:
                    # grad W = G^T h (added in place where the dtypes allow: no (V, H) temporary)
                    if G.dtype == grad_w.dtype:
                        grad_w.addmm_(G.T, h_c)
                    else:
                        grad_w += G.T @ h_c
                if need_b:
                    # grad b = sum over the chunk's tokens of G
                    grad_b += G.sum(0)
        return (grad_h, None if grad_w is None or kept_w is not None else grad_w.to(weight_VH.dtype),
                None if grad_b is None or kept_b is not None else grad_b.to(bias_V.dtype),
                None, None, None, None, None, None)


def _float32_grad(param: Tensor | None) -> Tensor | None:
    """``param.grad`` when it is there to accumulate into and float32 (``kept_grad``), else None."""
    grad = kept_grad(param)
    return grad if grad is not None and grad.dtype == torch.float32 else None


def token_logp_entropy(h_NH: Tensor, weight_VH: Tensor, bias_V: Tensor | None, target_N: Tensor,
                       temperature: float, chunk_tokens: int | str, with_entropy: bool = False,
                       entropy_grad: bool = False, accumulate: bool = False) -> tuple[Tensor, Tensor | None]:
    """log p(target) (N,) at ``temperature`` through the LM head (weight (V, H), bias (V,) or None) on final
    hidden states h (N, H), and the entropy (N,) of that distribution when ``with_entropy`` (with a gradient
    only when ``entropy_grad``: an entropy bonus in the loss), both float32.

    ``chunk_tokens`` > 0: at most that many tokens' logits exist at once, in the forward and in the backward
    (``ChunkedHeadLogp``); ``auto``: as many as ``auto_chunk_tokens`` gives for the device of ``h`` and this
    vocabulary; 0: all N at once through plain autograd, which keeps the (N, V) logits and log-softmax for the
    backward (no recomputation: the faster choice where they fit).

    ``accumulate``: the backward adds the head's weight (and bias) gradient into their ``.grad`` where one is
    already there, in the matmul, and hands autograd none (``core.accumulate``; a micro-batch after the first).
    """
    if chunk_tokens == "auto":
        chunk_tokens = auto_chunk_tokens(weight_VH.shape[0], device_memory(h_NH.device))
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 0:
        raise ValueError(f"chunk_tokens={chunk_tokens!r} must be an int >= 0 (0 = all tokens at once), or auto")
    if chunk_tokens > 0:
        logp_N, ent_N = ChunkedHeadLogp.apply(h_NH, weight_VH, bias_V, target_N, temperature, chunk_tokens,
                                              with_entropy, entropy_grad, accumulate)
        return logp_N, (ent_N if with_entropy else None)
    linear = accumulating_linear if accumulate else F.linear
    z = linear(h_NH, weight_VH, bias_V).float() / temperature  # (N, V)
    # log p(y) = z_y - logsumexp(z)
    logp_N = z.gather(-1, target_N[:, None])[:, 0] - torch.logsumexp(z, dim=-1)
    ent_N = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            # H = -sum_v p_v log p_v
            lsm = F.log_softmax(z if entropy_grad else z.detach(), dim=-1)
            ent_N = -(lsm.exp() * lsm).sum(-1)
    return logp_N, ent_N
