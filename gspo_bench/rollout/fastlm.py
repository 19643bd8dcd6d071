"""A functional Qwen3 / Qwen3-MoE forward over the model's own parameters.

transformers' modules are written for every use at once (caches of many kinds,
masks built per call, hooks, output dataclasses), and at the sizes this
harness runs on a CPU that bookkeeping costs more than the arithmetic. This
module computes the same function with plain tensor ops and is used twice:

- ``FastDecoder.step``: one decode step over a preallocated KV cache (the
  rollout engine in ``fastgen.py``; ``compiled.py`` compiles it);
- ``packed_states`` / ``packed_response_logp``: the training forward over
  *packed* sequences, so the linear layers see only real tokens (no padding,
  and with ``share_prompts`` each group's prompt once) and the vocabulary
  projection runs only at the positions that predict a response token; PPO's
  critic runs ``packed_states`` on its trunk.

It reads the parameters of the ``PreTrainedModel`` it is given on every call
(no copies), so an optimiser step on the policy is seen by the next rollout.
An MoE layer runs its experts with one of ``EXPERT_KERNELS`` (``grouped``:
``F.grouped_mm``; ``batched``: ``bmm`` over zero-padded expert blocks;
``loop``: one matmul pair per expert, the reference); ``auto`` picks per
device and dtype (``pick_moe_kernel``), ``rollout.moe_kernel`` may name one.
Architectures other than Qwen3 and Qwen3-MoE with full attention are not
supported (``unsupported_reason`` says why); callers fall back to
transformers. ``tests/test_fastlm.py`` checks logits against transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gspo_bench.config.names import MOE_KERNELS
from gspo_bench.config.sections import LOGIT_CHUNK_TOKENS
from gspo_bench.core.accumulate import accumulating_experts_linear, accumulating_linear, experts_linear
from gspo_bench.core.embedding import tied_lookup
from gspo_bench.core.lm_head import token_logp_entropy
from gspo_bench.rollout.recompute import layer_context
from gspo_bench.rollout.routing import pinned_routes

SUPPORTED_TYPES = ("qwen3", "qwen3_moe")


def unsupported_reason(model) -> str | None:
    """None when the fast path computes exactly this model's function, else why not."""
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED_TYPES:
        return f"model_type {mtype!r} (fast path: {', '.join(SUPPORTED_TYPES)})"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "sliding-window attention layers"
    if mtype == "qwen3_moe" and getattr(cfg, "sliding_window", None) is not None:
        return "sliding-window attention (qwen3_moe applies config.sliding_window to every layer)"
    if not hasattr(_base(model), "layers") or not hasattr(_base(model), "embed_tokens"):
        return "neither a *ForCausalLM with model.layers nor its bare decoder stack"
    if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager", None):
        return f"attention implementation {cfg._attn_implementation!r}"
    return None


def supports(model) -> bool:
    return unsupported_reason(model) is None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # RMSNorm(x) = w * x / sqrt(mean(x^2) + eps), normalised in float32 as transformers does
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_rot: torch.Tensor) -> torch.Tensor:
    # RoPE: x * cos + rotate_half(x) * sin with rotate_half([a, b]) = [-b, a]
    #     = x * cos + roll(x, D/2) * [-sin_a, sin_b]   (sin_rot, see ``rope``)
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_rot)


class LayerRefs:
    """References (not copies) to one decoder layer's tensors, looked up once per call instead of per op;
    ``moe_kernel``: how an MoE layer runs its experts (``EXPERT_KERNELS`` or ``auto``)."""

    __slots__ = ("ln1", "ln2", "q", "k", "v", "o", "qn", "kn", "qn_eps", "kn_eps", "head_dim", "mlp", "dense",
                 "moe_kernel")

    def __init__(self, layer, moe_kernel: str = "auto"):
        self.moe_kernel = moe_kernel
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.q, self.k, self.v, self.o = ((m.weight, m.bias) for m in (attn.q_proj, attn.k_proj, attn.v_proj,
                                                                         attn.o_proj))
        self.qn, self.kn = attn.q_norm.weight, attn.k_norm.weight
        self.qn_eps, self.kn_eps = attn.q_norm.variance_epsilon, attn.k_norm.variance_epsilon
        self.head_dim = attn.head_dim
        self.mlp = mlp
        self.dense = None if hasattr(mlp, "experts") else (mlp.gate_proj.weight, mlp.up_proj.weight,
                                                           mlp.down_proj.weight)


def _base(model):
    """The decoder stack: ``model.model`` of a *ForCausalLM, or the model itself when it is that stack."""
    return model.model if hasattr(model, "lm_head") else model


def layer_refs(model, moe_kernel: str = "auto") -> list[LayerRefs]:
    return [LayerRefs(layer, moe_kernel) for layer in _base(model).layers]


def pick_moe_kernel(device_type: str, dtype: torch.dtype, capability: tuple[int, int] | None = None,
                    widths: tuple[int, ...] = ()) -> str:
    """The expert kernel ``auto`` means for tokens on ``device_type`` computed in ``dtype``.

    ``grouped`` where ``F.grouped_mm`` (torch >= 2.10) runs a kernel of its own: on CPU in every dtype, and on
    CUDA in bfloat16 on compute capability 9.x or 10.x (Hopper, Blackwell datacenter: torch's CUTLASS grouped
    GEMM). Elsewhere torch runs it as a hidden loop over the groups after copying the offsets to the host, so
    ``batched`` is the better choice there. grouped_mm also wants every row stride a multiple of 16 bytes:
    ``widths`` (hidden size, expert width) must be multiples of 16 / itemsize, else ``batched`` too.
    ``capability``: the CUDA device's (major, minor), None elsewhere.
    """
    aligned = all(w % (16 // dtype.itemsize) == 0 for w in widths)
    if not hasattr(F, "grouped_mm") or not aligned:
        return "batched"
    if device_type == "cpu":
        return "grouped"
    if device_type == "cuda" and dtype == torch.bfloat16 and capability is not None and capability[0] in (9, 10):
        return "grouped"
    return "batched"


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype x's matmuls run in: autocast's when it is on for x's device (``train.precision: *-mixed``),
    else x's own."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def resolve_moe_kernel(kernel: str, x: torch.Tensor, hidden: int, width: int) -> str:
    """``kernel`` (``rollout.moe_kernel``) with ``auto`` replaced by ``pick_moe_kernel`` for x's device and
    compute dtype; a named kernel is kept (``grouped`` where grouped_mm cannot run fails in torch, loudly)."""
    if kernel not in MOE_KERNELS:
        raise ValueError(f"moe kernel {kernel!r} is not allowed (allowed: {', '.join(MOE_KERNELS)})")
    if kernel != "auto":
        return kernel
    cap = torch.cuda.get_device_capability(x.device) if x.device.type == "cuda" else None
    return pick_moe_kernel(x.device.type, compute_dtype(x), cap, (hidden, width))


def experts_grouped(xs: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """Every expert on its rows of xs (sorted by expert, ``counts`` rows each): one ``grouped_mm`` per
    projection. grouped_mm does not autocast, so the operands are cast to the compute dtype here.
    ``accumulate``: the backward adds each projection's weight gradient into its ``.grad``, expert by expert
    (``core.accumulate.accumulating_experts_linear``; a micro-batch after the first, on a CPU)."""
    dt = compute_dtype(xs)
    # offs[e] = pairs routed to experts 0..e: where expert e's rows end in xs
    offs = counts.cumsum(0).to(torch.int32)
    linear = accumulating_experts_linear if accumulate else experts_linear
    # expert_e(x) = W_down (silu(x W_gate^T) * x W_up^T), for every expert's rows at once
    gate, up = linear(xs, gate_up, offs, dt).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, down, offs, dt)


def experts_batched(xs: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor) -> torch.Tensor:
    """The same as ``experts_grouped`` with ``torch.bmm``: the sorted rows are spread into a zero-padded
    (E, R, H) block, R = the busiest expert's rows, and each projection is one batched matmul over the experts.

    Reading R costs one device-to-host copy per call (the loop reads every count). Memory: E x R rows of the
    widest projection, about the rows themselves when routing is balanced and E times them when one expert
    takes every token. Padding rows are zero, stay zero through SwiGLU, and are never read back, so they add
    nothing to the output or to any gradient.
    """
    E, n = counts.shape[0], xs.shape[0]
    R = int(counts.max())
    # pair j (sorted) of expert e_j is row r_j = j - start(e_j) of that expert's block, slot e_j * R + r_j
    expert = torch.repeat_interleave(torch.arange(E, device=xs.device), counts, output_size=n)
    start = counts.cumsum(0) - counts
    slot = expert * R + torch.arange(n, device=xs.device) - start[expert]
    # which pair fills each slot; n = a zero row appended to xs (the padding)
    fill = torch.full((E * R,), n, dtype=torch.long, device=xs.device).index_put_((slot,), torch.arange(
        n, device=xs.device))
    # index_select, not indexing: its backward is a plain index_add
    block = F.pad(xs, (0, 0, 0, 1)).index_select(0, fill).view(E, R, xs.shape[1])
    # expert_e(x) = W_down (silu(x W_gate^T) * x W_up^T), for every expert's block at once
    gate, up = torch.bmm(block, gate_up.transpose(1, 2)).chunk(2, dim=-1)
    out = torch.bmm(F.silu(gate) * up, down.transpose(1, 2))
    return out.reshape(E * R, out.shape[-1]).index_select(0, slot)


def experts_loop(xs: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
                 down: torch.Tensor) -> torch.Tensor:
    """The same, one matmul pair per expert in a Python loop: the reference the others are tested against."""
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        # expert_e(x) = W_down (silu(x W_gate^T) * x W_up^T)
        gate, up = F.linear(xs[start:start + n], gate_up[e]).chunk(2, dim=-1)
        outs.append(F.linear(F.silu(gate) * up, down[e]))
        start += n
    return torch.cat(outs)


EXPERT_KERNELS = {"grouped": experts_grouped, "batched": experts_batched, "loop": experts_loop}
"""``rollout.moe_kernel``'s kernels by name (``auto`` picks one per device and dtype: ``pick_moe_kernel``)."""


def moe_mlp(mlp, x: torch.Tensor, kernel: str = "auto", accumulate: bool = False) -> torch.Tensor:
    """Qwen3-MoE sparse block on flat tokens (N, H): route, sort the (token, expert) pairs by expert, run
    each expert on its rows with ``kernel`` (``EXPERT_KERNELS``, or ``auto``: ``resolve_moe_kernel``); every
    kernel gives the same numbers up to rounding. ``accumulate``: where the experts run ``grouped`` on a CPU,
    their weight gradients go into ``.grad`` in the backward's matmuls (``experts_grouped``); a GPU's
    grouped kernel computes every expert's gradient in one launch, and a loop of one product per expert would
    cost it a host sync and as many launches as experts, so there, and with the other kernels, autograd adds
    them. The router's (E, H) weight always goes through autograd."""
    router, experts = mlp.gate, mlp.experts
    # the router module itself: p = softmax(x W_r^T) in float32, top-k experts, renormalised when
    # norm_topk_prob. Calling the module (not its weight) lets routing replay's hook see every path.
    _, top_p, top_e = router(x)
    top_p = top_p.to(x.dtype)
    flat_e = top_e.flatten()
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=experts.num_experts)
    token = order // router.top_k
    xs = x.index_select(0, token)
    gate_up, down = experts.gate_up_proj, experts.down_proj
    name = resolve_moe_kernel(kernel, x, x.shape[-1], down.shape[-1])
    if accumulate and name == "grouped" and x.device.type == "cpu":
        ys = experts_grouped(xs, counts, gate_up, down, accumulate=True)
    else:
        ys = EXPERT_KERNELS[name](xs, counts, gate_up, down)
    # y = sum over the chosen experts of p_e * expert_e(x)
    ys = ys * top_p.flatten()[order, None]
    return torch.zeros_like(x).index_add_(0, token, ys.to(x.dtype))


def layer_forward(ref: LayerRefs, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                  attend, accumulate: bool = False) -> torch.Tensor:
    """One decoder layer on flat tokens x (N, H); ``attend(q, k, v)`` does the attention for a layout.

    q (N, Hq, D), k and v (N, Hkv, D) come in RoPE'd; ``attend`` returns (N, Hq * D). ``accumulate``: the
    projections' and the experts' weight gradients added into ``.grad`` in the matmul (``accumulating_linear``,
    ``moe_mlp``: a micro-batch after the first).
    """
    linear = accumulating_linear if accumulate else F.linear
    h = _rms(x, ref.ln1, eps)
    n, d = h.shape[0], ref.head_dim
    q = _rms(linear(h, *ref.q).view(n, -1, d), ref.qn, ref.qn_eps)
    k = _rms(linear(h, *ref.k).view(n, -1, d), ref.kn, ref.kn_eps)
    v = linear(h, *ref.v).view(n, -1, d)
    x = x + linear(attend(_rotate(q, cos, sin), _rotate(k, cos, sin), v), *ref.o)
    h = _rms(x, ref.ln2, eps)
    if ref.dense is None:
        return x + moe_mlp(ref.mlp, h, ref.moe_kernel, accumulate)
    gate, up, down = ref.dense
    # SwiGLU: W_down (silu(x W_gate^T) * x W_up^T)
    return x + linear(F.silu(linear(h, gate)) * linear(h, up), down)


def rope(model, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin_rot = [-sin_a, sin_b] for flat positions (N,), shaped (N, 1, D) to broadcast over heads.

    The model's own rotary module computes cos and sin, so every rope type it
    supports (default, linear, yarn, llama3, ...) comes out right.
    """
    probe = torch.empty(0, dtype=dtype, device=positions.device)
    cos, sin = _base(model).rotary_emb(probe, positions[None])
    half = sin.shape[-1] // 2
    sin_rot = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos[0, :, None], sin_rot[0, :, None]


def prompt_owners(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """owner (B,): for every row, the first row whose prompt block (tokens and padding) is the same."""
    B = input_ids.shape[0]
    block = torch.where(attention_mask[:, :prompt_len].bool(), input_ids[:, :prompt_len], -1)
    _, group = torch.unique(block, dim=0, return_inverse=True)
    rows = torch.arange(B, device=input_ids.device)
    first = torch.full((B,), B, dtype=torch.long, device=input_ids.device).scatter_reduce(0, group, rows, "amin")
    return first[group]


def embed(model, ids: torch.Tensor) -> torch.Tensor:
    """The input embedding of 1-D ``ids``. A weight tied to the LM head is read by ``tied_lookup``, whose
    gradient is the rows read (added into the head's dense gradient) rather than a (V, H) tensor of zeros
    around them: the same gradient, bit for bit, without writing and adding the whole vocabulary's."""
    emb = _base(model).embed_tokens
    head = getattr(model, "lm_head", None)
    if head is not None and head.weight is emb.weight:
        return tied_lookup(ids, emb.weight, emb.padding_idx)
    return emb(ids)


def packed_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                  share_prompts: bool = False, moe_kernel: str = "auto",
                  checkpoint_layers: bool | str = False,
                  accumulate_grads: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Final-norm hidden states (N, H) at the positions that predict a response token, and the response
    mask (B, T) saying where those N states belong.

    ``model``: a *ForCausalLM or its bare decoder stack (a critic's trunk). Rollout layout: left-padded
    prompts, responses from column P, ``attention_mask`` marks real tokens. The linear layers run on the
    real tokens only, attention on each sequence left-aligned with a causal mask. ``share_prompts``: rows
    with the same prompt (the G samples of a group) compute it once, and every row's keys and values read
    that one copy (prefix sharing; the gradient sums over the rows). The flat tokens are then no longer
    every real cell, so routing replay's hooks need ``share_prompts=False``. ``moe_kernel``: how MoE layers
    run their experts (``EXPERT_KERNELS`` or ``auto``). ``checkpoint_layers`` (activation checkpointing,
    when grad is on; ``rollout/recompute.py``): true, each layer keeps only its input for the backward and
    runs again there; ``selective``, it keeps its matrix products' outputs too and runs again only the
    operators between them. Either way on the experts its forward used (``routing.pinned_routes``), so the
    gradient is the same. ``accumulate_grads``: the projections' (and on a CPU the experts') backward adds their
    weight gradients into the ``.grad`` already there, inside the matmul (``core.accumulate``: a micro-batch
    after the first).
    """
    base = _base(model)
    B, W = input_ids.shape
    dev = input_ids.device
    eps = base.config.rms_norm_eps
    real = attention_mask.bool()
    rows = torch.arange(B, device=dev)
    owner = prompt_owners(input_ids, attention_mask, prompt_len) if share_prompts else rows
    # computed cells: every real response cell, and the real prompt cells of each group's first row
    own = real.clone()
    own[:, :prompt_len] &= (owner == rows)[:, None]
    # packed index of every computed cell; a shared prompt cell reads its owner's
    idx = own.flatten().long().cumsum(0).view(B, W) - 1
    src = torch.cat((idx[owner, :prompt_len], idx[:, prompt_len:]), dim=1)
    # pos_t = number of real tokens before t in its row (position ids, as in the rollout)
    pos = attention_mask.long().cumsum(-1) - 1
    lmax = int(pos.max()) + 1
    slot = rows[:, None] * lmax + pos  # slot of each cell in the left-aligned (B, lmax) attention layout
    n = int(own.sum())
    # which packed token fills each slot (n = a zero row: the right padding of short rows)
    fill = torch.full((B * lmax,), n, dtype=torch.long, device=dev).index_put_((slot[real],), src[real])
    out_slot = slot[own]  # each packed token's own slot, whose attention output it keeps

    def attend(q, k, v):
        hq, d = q.shape[1], q.shape[2]

        def spread(t):  # (n, h, D) -> (B, h, lmax, D)
            # index_select, not t[fill]: its backward is a plain index_add, not a sorted index_put
            return F.pad(t, (0, 0, 0, 0, 0, 1)).index_select(0, fill).view(B, lmax, t.shape[1], d).transpose(1, 2)

        # causal attention per sequence; padding sits to the right of every real query, so no mask
        o = F.scaled_dot_product_attention(spread(q), spread(k), spread(v), is_causal=True,
                                           enable_gqa=q.shape[1] != k.shape[1])
        return o.transpose(1, 2).reshape(B * lmax, hq * d).index_select(0, out_slot)

    x = embed(model, input_ids[own])
    cos, sin = rope(model, pos[own], x.dtype)
    refs = layer_refs(model, moe_kernel)
    if checkpoint_layers and torch.is_grad_enabled():
        keep = layer_context(checkpoint_layers, pinned_routes([ref.mlp.gate for ref in refs if ref.dense is None]))
        for ref in refs:
            x = checkpoint(layer_forward, ref, x, cos, sin, eps, attend, accumulate_grads, use_reentrant=False,
                           context_fn=keep)
    else:
        for ref in refs:
            x = layer_forward(ref, x, cos, sin, eps, attend, accumulate_grads)
    # response token at column c (c >= P) is predicted by the hidden state at column c - 1
    resp = real[:, prompt_len:]
    return _rms(x.index_select(0, src[:, prompt_len - 1 : -1][resp]), base.norm.weight, eps), resp


def packed_response_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                         temperature: float = 1.0, with_entropy: bool = False, share_prompts: bool = False,
                         moe_kernel: str = "auto", logit_chunk_tokens: int | str = LOGIT_CHUNK_TOKENS,
                         checkpoint_layers: bool | str = False, entropy_grad: bool = False,
                         accumulate_grads: bool = False):
    """Per-token log-probs (B, T) of the response block, computed over packed real tokens only.

    Same contract as ``engine.forward_response``, through ``packed_states``; the LM head runs only at
    the positions that predict a response token, ``logit_chunk_tokens`` of them at a time (0: all at once;
    ``core.lm_head``). Positions outside the response mask get 0. ``accumulate_grads``: the projections' and the
    head's weight gradients go into their ``.grad`` in the matmul (``packed_states``).
    """
    h, resp = packed_states(model, input_ids, attention_mask, prompt_len, share_prompts, moe_kernel,
                            checkpoint_layers, accumulate_grads)
    target = input_ids[:, prompt_len:][resp]
    lp, ent_n = token_logp_entropy(h, model.lm_head.weight, model.lm_head.bias, target, temperature,
                                   logit_chunk_tokens, with_entropy, entropy_grad, accumulate_grads)
    logp = torch.zeros(resp.shape, dtype=lp.dtype, device=lp.device).masked_scatter(resp, lp)
    ent = None
    if ent_n is not None:
        ent = torch.zeros(resp.shape, dtype=ent_n.dtype, device=ent_n.device).masked_scatter(resp, ent_n)
    return logp, ent, None
