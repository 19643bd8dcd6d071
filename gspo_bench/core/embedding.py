"""The input embedding's lookup, with a gradient of only the rows it read.

A model whose LM head is its input embedding (tied, as Qwen3's small models
are) gets two gradients for the one (V, H) weight: the head's, dense, and the
lookup's. ``F.embedding``'s backward writes the lookup's into a (V, H) tensor
of zeros and adds it to the head's: at Qwen3's 151,936 x 1,024 that is 0.6 GB
filled with zeros and 0.6 GB added, once per backward (once per micro-batch
under ``train.micro_batch_tokens``), for the few hundred rows the tokens touch.
``tied_lookup`` returns the same gradient as a sparse tensor of those rows, and
autograd adds it to the head's dense one:

    x_n = W[id_n]                                      (forward: the rows read)
    grad W[r] = sum over n with id_n = r of grad x_n   (the rows read; 0 elsewhere)

Each row's sum runs over its tokens in order from 0, as ``F.embedding``'s
backward sums them, so the weight's gradient is bit for bit the same; tokens
at ``padding_idx`` get none, as there. Autograd adds a sparse gradient that
arrives after a dense one out of place: the sum is a copy of the head's (V, H)
gradient with the rows added, once per backward. Where the head's gradient
goes straight into ``.grad`` (``core.accumulate``: a micro-batch after the
first), the rows alone reach ``.grad`` and are added there in place.

Only for a tied weight: its gradient then reaches the optimiser dense (the
head's is dense), where an untied embedding's would stay sparse, which
AdamW's fused kernel and gradient clipping do not take.

May import: torch only (``core``'s rule).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


class _RowsLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.shape, ctx.padding_idx = weight.shape, padding_idx
        return weight.index_select(0, ids)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (ids,) = ctx.saved_tensors
        if ctx.padding_idx is not None:  # F.embedding gives the padding row no gradient
            grad = grad.masked_fill((ids == ctx.padding_idx)[:, None], 0)
        rows, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        # S_r = sum over the tokens n with id_n = r of grad x_n, in token order from 0
        summed = grad.new_zeros(len(rows), grad.shape[1]).index_add_(0, inverse, grad)
        sparse = torch.sparse_coo_tensor(rows[None], summed, ctx.shape, is_coalesced=True,
                                         check_invariants=False)
        return None, sparse, None


def tied_lookup(ids: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """``F.embedding(ids, weight, padding_idx)`` for 1-D ``ids``, whose weight's gradient is sparse in the rows
    read (module docstring): for a weight that is also the LM head, whose dense gradient it is added to."""
    if not (torch.is_grad_enabled() and weight.requires_grad):
        return weight.index_select(0, ids)
    return _RowsLookup.apply(ids, weight, padding_idx)
