"""The fast rollout engine: a sampling loop over a preallocated KV cache.

One ``generate`` call samples a whole rollout batch:

1. prefill: the left-padded prompt block in one pass (causal + padding mask),
   writing keys and values into a cache sized for ``P + max_new_tokens``;
   rows with the same prompt (a group's samples) are prefilled once and
   their cache rows copied (prefix sharing);
2. decode: one token per step for every *unfinished* row, under
   ``torch.inference_mode``. Attention reads the cache up to the current
   column with batched matmuls (grouped-query heads share their key/value
   head without copies). Sampling is inverse-CDF on the tempered softmax, one
   uniform draw per row, and the log-prob of the drawn token comes out of the
   same log-softmax, so ``old_logp_source: rollout`` needs no extra pass;
3. compaction: when an eighth of the rows in flight have emitted eos, the
   cache and row state are gathered down to the live rows, so finished
   sequences stop costing compute.

The forward itself is ``fastlm``'s (the policy's own parameters, no copies;
MoE experts through ``rollout.moe_kernel``'s kernel); models it does not
support go through transformers' ``generate`` instead (``engine="auto"``
picks, ``engine="hf"`` forces it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gspo_bench.rollout import compiled as compiled_step
from gspo_bench.rollout import fastlm
from gspo_bench.rollout.routing import RouterHooks


# generation_config fields whose logits processors ``generate`` applies and this engine does not, with the
# values that mean "off"; a model asking for one of them samples through transformers instead
PROCESSORS = {"suppress_tokens": (None, []), "begin_suppress_tokens": (None, []), "sequence_bias": (None, {}),
              "bad_words_ids": (None, []), "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
              "no_repeat_ngram_size": (None, 0), "min_new_tokens": (None, 0), "min_length": (None, 0),
              "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "epsilon_cutoff": (None, 0.0),
              "eta_cutoff": (None, 0.0), "typical_p": (None, 1.0), "min_p": (None, 0.0),
              "exponential_decay_length_penalty": (None,)}


def unsupported_reason(model) -> str | None:
    """None when this engine samples exactly what ``generate`` would (architecture and logits processors)."""
    reason = fastlm.unsupported_reason(model)
    if reason is not None or not hasattr(model, "lm_head"):
        return reason or "a bare decoder stack (no LM head) cannot sample"
    gc = getattr(model, "generation_config", None)
    used = [k for k, off in PROCESSORS.items() if gc is not None and getattr(gc, k, None) not in off]
    return f"generation_config asks for {', '.join(used)}" if used else None


class KVCache:
    """Keys and values of every layer, preallocated for ``width`` = P + T columns.

    Keys are stored transposed, (rows * kv_heads, head_dim, width), so q K^T is a
    plain batched matmul over a column slice; values (rows * kv_heads, width, head_dim).
    """

    def __init__(self, n_layers: int, rows: int, kv_heads: int, width: int, head_dim: int, dtype, device,
                 zero: bool = False):
        # zero: columns not written yet hold 0, not whatever memory held (a full-width step reads them, masked)
        new = torch.zeros if zero else torch.empty
        self.k = [new(rows * kv_heads, head_dim, width, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [new(rows * kv_heads, width, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.kv_heads, self.width = kv_heads, width

    def keep(self, idx: torch.Tensor) -> None:
        """Drop every row not in ``idx`` (row indices into the current batch)."""
        h = self.kv_heads
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                store[i] = t.view(-1, h, *t.shape[1:])[idx].view(-1, *t.shape[1:])


class FastDecoder:
    """Prefill and decode steps of one Qwen3-family model (``fastlm`` supported); ``moe_kernel``: how its MoE
    layers run their experts (``fastlm.EXPERT_KERNELS`` or ``auto``)."""

    def __init__(self, model, moe_kernel: str = "auto"):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fast engine does not support this model ({reason}); use engine 'hf'")
        self.model = model
        cfg = model.config
        self.eps = cfg.rms_norm_eps
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = cfg.num_key_value_heads
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.scale = attn.scaling
        self.param = next(model.parameters())
        self.refs = fastlm.layer_refs(model, moe_kernel)
        self.embed = model.model.embed_tokens.weight

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        return F.linear(fastlm._rms(x, m.model.norm.weight, self.eps), m.lm_head.weight, m.lm_head.bias).float()

    def prefill(self, ids: torch.Tensor, attn_mask: torch.Tensor, cache: KVCache, cos, sin) -> torch.Tensor:
        """Run the (B, P) prompt block, fill cache columns [0, P), return the last column's logits (B, V)."""
        B, P = ids.shape
        d, h = self.head_dim, self.kv_heads
        pos = (attn_mask.long().cumsum(-1) - 1).clamp(min=0)
        real = attn_mask.bool()
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        # query i sees key j <= i when j is a real token; every query also sees itself (no empty rows)
        mask = (causal & real[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)
        layer_i = iter(range(len(cache.k)))

        def attend(q, k, v):
            i = next(layer_i)
            kb = k.view(B, P, h, d).transpose(1, 2)
            vb = v.view(B, P, h, d).transpose(1, 2)
            cache.k[i].view(B, h, d, cache.width)[..., :P] = kb.transpose(2, 3)
            cache.v[i].view(B, h, cache.width, d)[:, :, :P] = vb
            qb = q.view(B, P, -1, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask[:, None], enable_gqa=self.group > 1)
            return o.transpose(1, 2).reshape(B * P, -1)

        x = F.embedding(ids, self.embed).view(B * P, -1)
        flat = pos.flatten()
        c, s = cos[flat], sin[flat]
        for ref in self.refs:
            x = fastlm.layer_forward(ref, x, c, s, self.eps, attend)
        return self.logits(x.view(B, P, -1)[:, -1])

    def step(self, tok: torch.Tensor, pos: torch.Tensor, col: int, bias: torch.Tensor, cache: KVCache,
             cos, sin) -> torch.Tensor:
        """Feed one token per row at cache column ``col``; return next-token logits (b, V).

        ``bias`` (b * kv_heads, 1, width) is 0 on keys a row may attend to and -inf on its prompt padding.
        """
        b = tok.shape[0]
        d, h, g, t = self.head_dim, self.kv_heads, self.group, col + 1
        layer_i = iter(range(len(cache.k)))

        def attend(q, k, v):
            i = next(layer_i)
            K, V = cache.k[i], cache.v[i]
            K[:, :, col] = k.reshape(b * h, d)
            V[:, col] = v.reshape(b * h, d)
            # scores = bias + q K^T / sqrt(d) over columns [0, col]; each kv head serves g query heads
            scores = torch.add(bias[:, :, :t], torch.bmm(q.reshape(b * h, g, d), K[:, :, :t]), alpha=self.scale)
            return torch.bmm(scores.softmax(-1), V[:, :t]).view(b, h * g * d)

        x = F.embedding(tok, self.embed)
        c, s = cos[pos], sin[pos]
        for ref in self.refs:
            x = fastlm.layer_forward(ref, x, c, s, self.eps, attend)
        return self.logits(x)


def sample(logits: torch.Tensor, temperature: float, greedy: bool, generator=None, rows: torch.Tensor | None = None):
    """(tokens (b,), log-probs (b,) under softmax(logits / temperature), or None when greedy).

    ``generator``: a ``torch.Generator``, or the call's ``draws.Draws``, asked for one draw per row of
    ``rows`` (the rows' indices in the call's batch; default all ``b``); None: torch's global generator."""
    if greedy:
        return logits.argmax(-1), None
    # log pi(v) = log softmax(z / T)_v
    logp = torch.log_softmax(logits / temperature, dim=-1)
    cdf = logp.exp().cumsum(-1)
    # inverse CDF: the first v with cdf_v > u, u ~ U[0, cdf_V) (so rounding never walks off the end)
    if generator is None or isinstance(generator, torch.Generator):
        u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device, dtype=cdf.dtype)
    else:
        u = generator.uniform(torch.arange(cdf.shape[0]) if rows is None else rows, cdf.device, cdf.dtype)
    u = u * cdf[:, -1:]
    tok = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
    return tok[:, 0], logp.gather(-1, tok)[:, 0]


@torch.inference_mode()
def decode(model, ids: torch.Tensor, attn_mask: torch.Tensor, *, max_new_tokens: int, eos_ids: list[int],
           temperature: float = 1.0, greedy: bool = False, generator=None, compact_frac: float = 0.125,
           routes: torch.Tensor | None = None, compiled: bool = False, moe_kernel: str = "auto", swap=None,
           versions: torch.Tensor | None = None):
    """Sample up to ``max_new_tokens`` per row. Returns (tokens (B, T'), log-probs (B, T') or None), T' <= T,
    with whatever follows a row's first eos left for the caller to mask.

    ``routes``: a (layers, B, P + max_new_tokens, k) grid (``routing.empty_grid``) to fill with the experts
    the router chose for every token fed to the model (MoE only; Rollout Routing Replay records them).
    ``compiled``: decode steps through ``compiled`` (static shapes, one compiled graph per batch bucket) where
    it serves the model; elsewhere eager steps. ``moe_kernel``: how MoE layers run their experts
    (``fastlm.EXPERT_KERNELS`` or ``auto``).

    Partial rollouts: ``swap`` is called before each decode step; when it returns a version, it has loaded new
    weights into ``model`` (in place: the decoder reads the same tensors), and every token sampled from then on
    records that version in ``versions`` (B, max_new_tokens), which starts filled with the first. The keys and
    values cached under the old weights stay: the continuation attends to them, as an in-flight weight update
    without recomputing the cache does."""
    compiled = compiled and compiled_step.supported(model, routes is not None)
    args = (model, ids, attn_mask, max_new_tokens, eos_ids, temperature, greedy, generator, compact_frac, routes,
            compiled, moe_kernel, swap, versions)
    if routes is None:
        return _decode(*args, None)
    with RouterHooks(model) as hooks:
        return _decode(*args, hooks)


def _decode(model, ids, attn_mask, max_new_tokens, eos_ids, temperature, greedy, generator, compact_frac,
            routes, compiled, moe_kernel, swap, versions, hooks):
    dec = FastDecoder(model, moe_kernel)
    B, P = ids.shape
    dev, width = ids.device, P + max_new_tokens
    step = dec.step
    if compiled:  # a cache width rounded up to 16 columns: prompts of nearby lengths share a compiled graph
        step, width = compiled_step.CompiledStep(dec), -(-width // 16) * 16
    # prefix sharing: the rows of one prompt (a group's G samples) are prefilled once, then their cache copied
    firsts, group = torch.unique(fastlm.prompt_owners(ids, attn_mask, P), return_inverse=True)
    cache = KVCache(len(model.model.layers), len(firsts), dec.kv_heads, width, dec.head_dim, dec.param.dtype, dev,
                    zero=compiled)
    cos, sin = fastlm.rope(model, torch.arange(width, device=dev), dec.param.dtype)
    n_pad = (attn_mask == 0).sum(-1)
    key_ok = torch.ones(B, width, dtype=torch.bool, device=dev)
    key_ok[:, :P] = attn_mask.bool()
    bias = torch.zeros(B, width, dtype=dec.param.dtype, device=dev).masked_fill_(~key_ok, float("-inf"))
    bias = bias.repeat_interleave(dec.kv_heads, dim=0)[:, None]  # (B * kv_heads, 1, width)
    out_tok = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
    out_lp = None if greedy else torch.zeros(B, max_new_tokens, dtype=torch.float32, device=dev)
    rows = torch.arange(B, device=dev)
    eos = torch.tensor(eos_ids, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    logits = dec.prefill(ids[firsts], attn_mask[firsts], cache, cos, sin)[group]
    if len(firsts) < B:
        cache.keep(group)
    if hooks is not None:
        # prefill routed every prompt cell of each distinct prompt, row-major; padding cells stay -1
        prompt = hooks.take().view(routes.shape[0], len(firsts), P, -1)[:, group]
        routes[:, :, :P] = torch.where(attn_mask.bool()[None, :, :, None], prompt, -1).to(routes.dtype)
    steps = 0
    for s in range(max_new_tokens):
        tok, lp = sample(logits, temperature, greedy, generator, rows)
        out_tok[rows, s] = tok
        if lp is not None:
            out_lp[rows, s] = lp
        steps = s + 1
        done |= torch.isin(tok, eos)
        n_done = int(done.sum())
        if n_done == len(rows) or s + 1 == max_new_tokens:
            break
        keep = None
        if compiled:  # down to the live rows' bucket, finished rows filling it up
            fit = compiled_step.bucket(len(rows) - n_done, len(rows))
            if fit < len(rows):
                keep = torch.cat(((~done).nonzero()[:, 0], done.nonzero()[:, 0][:fit - len(rows) + n_done]))
        elif n_done >= max(1, int(compact_frac * len(rows))):
            keep = (~done).nonzero()[:, 0]
        if keep is not None:
            cache.keep(keep)
            rows, tok, done, n_pad = rows[keep], tok[keep], done[keep], n_pad[keep]
            bias = bias.view(-1, dec.kv_heads, 1, width)[keep].view(-1, 1, width)
        col = P + s
        if swap is not None and (new := swap()) is not None:
            # new weights, loaded in place: the next logits and every token after are theirs
            versions[rows, s + 1:] = new
        # the token sampled at step s sits at column P + s, position P + s - (row's left padding)
        logits = step(tok, col - n_pad, col, bias, cache, cos, sin)
        if hooks is not None:
            # the token at column col of each live row was just routed
            routes[:, rows, col] = hooks.take().view(routes.shape[0], len(rows), -1).to(routes.dtype)
    return out_tok[:, :steps], (None if out_lp is None else out_lp[:, :steps])
