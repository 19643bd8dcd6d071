"""Linear layers (and MoE experts) whose weight gradients are added into ``.grad`` by the matmul itself.

Under gradient accumulation (``train.micro_batch_tokens``) every micro-batch
after the first computes each weight's gradient into a fresh tensor the size of
the weight, and autograd then adds it into the ``.grad`` the earlier parts left:
per part the whole model's gradient written once more and read twice more, 2.4 GB
at Qwen3-0.6B's size. A tied LM head costs a third pass: its dense gradient
meets the input embedding's sparse one, and autograd adds those two
out of place, copying the (V, H) gradient. ``accumulating_linear`` folds the
addition into the weight-gradient matmul, as Megatron-LM's gradient
accumulation fusion does:

    y = x W^T + b                            (forward, as F.linear)
    grad x = g W                             (as autograd's)
    W.grad <- W.grad + g^T x                 (one addmm into the kept gradient; no (out, in) temporary)
    b.grad <- b.grad + sum over rows of g

and hands autograd no gradient for W or b, so nothing else adds it. It only
accumulates where a gradient is already there (a micro-batch after the first);
where ``.grad`` is None it returns ``g^T x`` as autograd's own linear does. The
caller chooses where it runs: never where anything must see the weight's
gradient arrive through autograd (under DDP, the backward that all-reduces;
``torch.autograd.grad``).

``accumulating_experts_linear`` does the same for an MoE layer's experts, whose
weights are stacked (E, out, in) and run on their rows by one ``grouped_mm``:
each expert with rows adds ``g_e^T x_e`` into its slice of ``.grad`` with one
``addmm``, and an expert no row chose adds nothing (autograd's grouped backward
writes every expert's gradient afresh, zeros for the idle ones, and then adds
the whole (E, out, in) tensor).

The sum is the same one accumulation computes, ``G + g^T x`` per element, with
the matmul's own rounding order (an ``addmm`` may round differently from an
``mm`` then an add, by the last bit). Under autocast (``bf16-mixed``) the
product runs in the autocast dtype, as autocast's own linear and its backward
do, and is added into the float32 ``.grad`` (a temporary of the product's
dtype, but no float32 copy of it and no second add).

May import: torch only (``core``'s rule).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def kept_grad(param: Tensor | None) -> Tensor | None:
    """``param.grad`` where there is one to accumulate into (dense, of the parameter's shape), else None."""
    grad = None if param is None or not param.requires_grad else param.grad
    if grad is None or grad.layout != torch.strided or grad.shape != param.shape:
        return None
    return grad


def _into(grad: Tensor, g_t: Tensor, x: Tensor) -> None:
    """grad <- grad + g_t @ x, in place."""
    if grad.dtype == g_t.dtype == x.dtype:
        # G <- G + g^T x, inside the matmul
        grad.addmm_(g_t, x)
    else:  # a product in autocast's dtype, accumulated into a float32 gradient
        grad.add_(g_t @ x)


def _into_grad(param: Tensor, g_t: Tensor, x: Tensor) -> bool:
    """Add ``g_t @ x`` into ``param.grad`` in place; False (nothing added) when there is no dense grad yet."""
    grad = kept_grad(param)
    if grad is None:
        return False
    _into(grad, g_t, x)
    return True


def linear_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype ``F.linear(x, weight)`` computes in here: autocast's where it is on, else the operands'."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return torch.promote_types(x.dtype, weight.dtype)


class _AccumulatingLinear(torch.autograd.Function):
    """y = x W^T + b on 2-D x (N, in); the weight's and bias's gradients added into their ``.grad``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        dt = linear_dtype(x, weight)
        # under autocast, the casts autocast's own linear makes: its product, and the backward's, in dt
        with torch.autocast(x.device.type, enabled=False):
            x_c, w_c = x.to(dt), weight.to(dt)
            y = F.linear(x_c, w_c, None if bias is None else bias.to(dt))
        ctx.save_for_backward(x_c, w_c)
        ctx.params, ctx.x_dtype = (weight, bias), x.dtype  # the leaves themselves: their .grad is read below
        return y

    @staticmethod
    def backward(ctx, g: Tensor):
        x_c, w_c = ctx.saved_tensors
        param_w, param_b = ctx.params
        need_x, need_w, need_b = ctx.needs_input_grad
        # grad x = g W (in the product's dtype, then x's, as autocast's cast hands it back)
        grad_x = g.mm(w_c).to(ctx.x_dtype) if need_x else None
        grad_w = grad_b = None
        if need_w and not _into_grad(param_w, g.t(), x_c):
            # grad W = g^T x, as autograd's linear computes it
            grad_w = g.t().mm(x_c).to(param_w.dtype)
        if need_b:
            # grad b = sum over rows of g
            s = g.sum(0)
            if (kept := kept_grad(param_b)) is not None:
                kept.add_(s)
            else:
                grad_b = s.to(param_b.dtype)
        return grad_x, grad_w, grad_b


def experts_linear(x: Tensor, weight: Tensor, offs: Tensor, dt: torch.dtype) -> Tensor:
    """y_e = x_e W_e^T for each expert e on its rows of x (sorted by expert, ``offs[e]`` = where expert e's rows
    end), W (E, out, in), one ``grouped_mm`` in ``dt`` (grouped_mm does not autocast: the operands are cast)."""
    # y_e = x_e W_e^T, every expert at once
    return F.grouped_mm(x.to(dt), weight.to(dt).transpose(1, 2), offs=offs)


class _AccumulatingExpertsLinear(torch.autograd.Function):
    """y_e = x_e W_e^T for each expert e on its rows x_e of x (rows sorted by expert, ``offs[e]`` = where expert
    e's rows end), one ``grouped_mm``; W (E, out, in)'s gradient added into its ``.grad`` expert by expert."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, offs: Tensor, dt: torch.dtype) -> Tensor:
        # grouped_mm does not autocast: the operands in the compute dtype, as the experts' own kernel casts them
        x_c, w_c = x.to(dt), weight.to(dt)
        ctx.save_for_backward(x_c, w_c, offs)
        ctx.param, ctx.x_dtype = weight, x.dtype
        # y_e = x_e W_e^T, every expert at once
        return F.grouped_mm(x_c, w_c.transpose(1, 2), offs=offs)

    @staticmethod
    def backward(ctx, g: Tensor):
        x_c, w_c, offs = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        # grad x_e = g_e W_e, every expert at once (as autograd's grouped_mm backward)
        grad_x = F.grouped_mm(g, w_c, offs=offs).to(ctx.x_dtype) if need_x else None
        grad_w = None
        if need_w:
            kept = kept_grad(ctx.param)
            if kept is None:
                # grad W_e = g_e^T x_e, into a fresh (E, out, in) tensor (0 for an expert with no rows)
                grad_w = F.grouped_mm(g.t(), x_c, offs=offs).to(ctx.param.dtype)
            else:
                start = 0
                for e, end in enumerate(offs.tolist()):  # an expert with no rows adds nothing
                    if end > start:
                        _into(kept[e], g[start:end].t(), x_c[start:end])
                    start = end
        return grad_x, grad_w, None, None


def accumulating_experts_linear(x: Tensor, weight: Tensor, offs: Tensor, dt: torch.dtype) -> Tensor:
    """``experts_linear``: every expert's linear map on its rows, whose backward adds each expert's weight gradient into ``weight.grad`` in place, one ``addmm`` per
    expert with rows (module docstring), and fills nothing for the others. The loop reads ``offs`` on the
    host: meant for a CPU, where grouped_mm's own backward loops over the experts too."""
    if not torch.is_grad_enabled() or not weight.requires_grad:
        return experts_linear(x, weight, offs, dt)
    return _AccumulatingExpertsLinear.apply(x, weight, offs, dt)


def accumulating_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x`` whose backward adds the weight's (and bias's) gradient into
    its existing ``.grad`` in place (module docstring), autocast's casts included; plain ``F.linear`` where no
    gradient is recorded."""
    if not torch.is_grad_enabled() or not weight.requires_grad or x.dim() != 2:
        return F.linear(x, weight, bias)
    return _AccumulatingLinear.apply(x, weight, bias)
