"""What activation checkpointing keeps of a decoder layer, and what its backward runs again.

``train.activation_checkpointing`` names one of ``config.names.CHECKPOINT_MODES``:

- ``false``: every layer keeps what its backward reads (the most memory, no recomputation);
- ``true`` (full): each layer keeps only its input, and the backward runs the whole layer again, its
  matrix products included: one more forward of the trunk per step;
- ``selective``: each layer keeps the outputs of its matrix products and attention (``SAVED_OPS``), and
  the backward runs again only the cheap operators between them (norms, rotary embedding, activation,
  residual adds, routing), taking the products from what was kept. The arithmetic the backward redoes
  is a small share of a layer's; the memory lies between the two others. As PyTorch's selective
  activation checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts``) does,
  which this uses.

Every mode gives the same gradients: the recomputed operators see the same inputs.

May import: torch, config.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from gspo_bench.config.names import CHECKPOINT_MODES

_aten = torch.ops.aten
SAVED_OPS = frozenset(op for op in (
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten._grouped_mm.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default, _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default, _aten._scaled_dot_product_cudnn_attention.default,
))
"""The operators whose outputs a ``selective`` layer keeps: the matrix products (the dense projections, the MoE
experts' grouped or batched products, the router's logits) and fused attention, the costly ones to run again."""


def _keep_products(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    # MUST_SAVE: the forward's output is kept and handed back to the backward's recomputation;
    # PREFER_RECOMPUTE: the operator runs again there
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def _entered(contexts):
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


def layer_context(mode: bool | str, *context_fns):
    """``context_fn`` for ``torch.utils.checkpoint`` (non-reentrant) around a decoder layer under ``mode``: the
    given ``context_fns`` (each returning a (forward, recompute) pair of contexts, as ``routing.pinned_routes``
    does) entered together, with selective checkpointing's pair inside them when ``mode`` is ``selective``."""
    fns = list(context_fns)
    if mode not in CHECKPOINT_MODES or type(mode) not in (bool, str):
        raise ValueError(f"activation checkpointing {mode!r} is not a mode (modes: false, true, selective)")
    if mode == "selective":
        fns.append(functools.partial(create_selective_checkpoint_contexts, _keep_products))

    def context_fn():
        pairs = [fn() for fn in fns]
        return _entered([p[0] for p in pairs]), _entered([p[1] for p in pairs])

    return context_fn
