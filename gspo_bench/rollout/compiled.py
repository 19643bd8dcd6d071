"""The compiled decode step (``rollout.engine: compiled``): static shapes, one graph per batch bucket.

The eager engine (``fastgen``) shrinks its batch as rows finish and reads
the cache only up to the current column, so no two decode steps have the same
shapes, and on a small model per-op overhead costs more than the arithmetic.
Here the shapes stay put:

- full width: every step attends over all ``P + max_new_tokens`` cache
  columns and masks those past the current one, so within a rollout a step's
  shapes depend only on its batch;
- batch buckets: the batch starts at the rollout's rows; when the live rows
  fit in the next smaller power of two (at least ``MIN_BUCKET``), they are
  gathered down to that many (finished rows fill it up, their tokens ignored);
- the step is a function of the weights and the state tensors, compiled by
  ``torch.compile`` (inductor fuses RMSNorm, the q/k norm with RoPE, SwiGLU
  and the masked softmax). Any model with the same shapes reuses the graph:
  across steps, rollouts and the algorithms of a ``run`` in one process, and
  inductor's on-disk cache keeps the compiled code for the next process.

On a GPU the compiled step is also captured as a CUDA graph (``cuda_capture``), so a decode step is one
graph launch instead of a few hundred kernel launches from Python, which on a small model cost more than the
arithmetic. A graph replays on the very buffers it was captured with, so the step's inputs that change every
step (the fed tokens, their positions, the cache column) are copied into buffers the graph owns, and a bucket
change, which gathers the cache into new tensors, captures the step again: a handful of captures per rollout.

Only dense models with no routes to record take this path (an MoE layer's
per-expert token counts change every step); others decode eagerly.
``compile_seconds`` reports the time spent compiling (and capturing) in this process.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from gspo_bench.rollout import fastlm

MIN_BUCKET = 8
_COMPILED = None  # the compiled step, made on first use (importing this module compiles nothing)
_SHAPES: set[tuple] = set()  # step shapes compiled so far in this process
_STATS = {"compile_s": 0.0, "graphs": 0, "captures": 0}


def supported(model, recording_routes: bool) -> bool:
    """The compiled step serves dense models whose routes nobody records."""
    return not recording_routes and not any(hasattr(layer.mlp, "experts") for layer in model.model.layers)


def bucket(live: int, rows: int) -> int:
    """Rows the step runs on for ``live`` unfinished rows in a batch of ``rows``: the smallest power of two
    >= live (at least MIN_BUCKET), or ``rows`` while that is smaller."""
    b = MIN_BUCKET
    while b < live:
        b *= 2
    return min(b, rows)


def compile_seconds() -> dict:
    """Seconds spent compiling decode graphs in this process, how many graphs (shapes) were compiled, and how many
    times a step was captured (CUDA graphs, GPU only)."""
    return dict(_STATS)


def _step(refs, embed, norm_w, head_w, head_b, tok, pos, col, bias, ks, vs, cos, sin, eps: float, scale: float,
          group: int):
    """Feed one token per row at cache column ``col`` (a 0-d tensor); return next-token logits (b, V) in fp32.

    ``bias`` (b * kv_heads, 1, width) is 0 on keys a row may see and -inf on its prompt padding; ``ks`` and
    ``vs`` are the cache's per-layer keys (b * kv_heads, D, width) and values (b * kv_heads, width, D).
    """
    b, width = tok.shape[0], bias.shape[-1]
    # full width: the columns after the current one are masked instead of sliced away
    visible = bias.masked_fill(torch.arange(width, device=bias.device) > col, float("-inf"))
    layer = iter(range(len(ks)))

    def attend(q, k, v):
        i = next(layer)
        K, V = ks[i], vs[i]
        bh, d = K.shape[0], K.shape[1]
        K.index_copy_(2, col.view(1), k.reshape(bh, d, 1))
        V.index_copy_(1, col.view(1), v.reshape(bh, 1, d))
        # scores = bias + q K^T / sqrt(d) over every column; each kv head serves ``group`` query heads
        scores = torch.add(visible, torch.bmm(q.reshape(bh, group, d), K), alpha=scale)
        return torch.bmm(scores.softmax(-1), V).view(b, -1)

    x = F.embedding(tok, embed)
    c, s = cos[pos], sin[pos]
    for ref in refs:
        x = fastlm.layer_forward(ref, x, c, s, eps, attend)
    return F.linear(fastlm._rms(x, norm_w, eps), head_w, head_b).float()


def cuda_capture(fn):
    """Capture ``fn()`` as a CUDA graph: (replay, its outputs). ``fn`` runs once on a side stream first, so that
    compiling and cuBLAS's workspace happen outside the capture (torch's rule for graph capture); ``replay()``
    runs the captured kernels again on the same buffers, writing the same output tensors."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def capture_for(device: torch.device):
    """How decode steps on ``device`` are captured: CUDA graphs on a GPU, none (each step called) elsewhere."""
    return cuda_capture if device.type == "cuda" else None


class CompiledStep:
    """``FastDecoder.step``'s signature over a full-width cache, through the process's compiled graph.

    ``capture``: None calls the compiled step every time; otherwise a function like ``cuda_capture`` (the
    default on a GPU, ``capture_for``) that records one call and returns a replay of it, and the step is
    replayed over buffers of its own (module docstring)."""

    def __init__(self, dec, capture=None):
        global _COMPILED
        if _COMPILED is None:
            _COMPILED = torch.compile(_step, dynamic=False, fullgraph=True)
        self.dec = dec
        m = dec.model
        self.consts = (m.model.norm.weight, m.lm_head.weight, m.lm_head.bias)
        self.capture = capture if capture is not None else capture_for(dec.param.device)
        self.key = None  # the buffers the current capture reads and writes
        self.replay = self.out = self.tok = self.pos = self.col = None

    def run(self, tok, pos, col: torch.Tensor, bias, ks: list, vs: list, cos, sin) -> torch.Tensor:
        d = self.dec
        return _COMPILED(d.refs, d.embed, *self.consts, tok, pos, col, bias, ks, vs, cos, sin, d.eps, d.scale,
                         d.group)

    def __call__(self, tok, pos, col: int, bias, cache, cos, sin) -> torch.Tensor:
        shape = (tok.shape[0], bias.shape[-1], tuple(cache.k[0].shape), str(tok.device))
        new = shape not in _SHAPES
        t0 = time.perf_counter()
        if self.capture is None:
            out = self.run(tok, pos, torch.tensor(col, device=tok.device), bias, cache.k, cache.v, cos, sin)
        else:
            out = self.replayed(tok, pos, col, bias, cache, cos, sin)
        if new:
            _SHAPES.add(shape)
            _STATS["graphs"] += 1
            _STATS["compile_s"] += time.perf_counter() - t0
        return out

    def replayed(self, tok, pos, col: int, bias, cache, cos, sin) -> torch.Tensor:
        """The step through the capture: captured again when the cache or the mask are new tensors (a new
        bucket), replayed otherwise, its per-step inputs copied into the capture's own buffers first."""
        key = (tok.shape[0], bias.data_ptr(), *(t.data_ptr() for t in (*cache.k, *cache.v)))
        if key != self.key:
            self.tok, self.pos = tok.clone(), pos.clone()
            self.col = torch.tensor(col, device=tok.device)
            ks, vs = list(cache.k), list(cache.v)  # the capture's own references: they live as long as it does
            self.replay, self.out = self.capture(lambda: self.run(self.tok, self.pos, self.col, bias, ks, vs, cos, sin))
            self.key = key
            _STATS["captures"] += 1
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        self.col.fill_(col)
        self.replay()
        # the next replay overwrites the capture's output: the caller gets its own copy
        return self.out.clone()
