"""Routing Replay for Qwen3-MoE: record the experts a forward pass chose, and force a later pass to use them.

One mechanism serves every forward the harness runs (the fast sampler, the
packed training forward, transformers' module and its ``generate``): a forward
hook on each layer's router (``mlp.gate``), which returns
``(logits, gate weights, top-k expert indices)``. ``fastlm`` calls the router
module too, so the hook sees the same thing on every path.

- Recording keeps the router's own top-k of every token the pass saw.
- Replaying substitutes given expert indices. The gate weights are then
  recomputed from the *current* router's logits over the replayed experts and
  normalised as the model does (softmax over all experts, take the k
  replayed, renormalise when ``norm_topk_prob``), so the router still gets a
  gradient. A replayed index of -1 means "not recorded": that token keeps the
  router's own choice (the last token a sampler drew was never fed back, so it
  has no recorded route; nothing downstream depends on it).

Recorded routes live on the rollout grid: ``(layers, B, P + T, k)``, int8 (or
int16 beyond 127 experts), -1 where nothing was recorded; ``GridLayout`` maps
a forward's flat tokens to and from that grid (docs/algorithms.md, "MoE").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F



def routers(model) -> list[torch.nn.Module]:
    """Each layer's router, in layer order (empty for a dense model): of a *ForCausalLM or its bare decoder
    stack (a critic's trunk)."""
    layers = getattr(getattr(model, "model", model), "layers", None) or []
    gates = [getattr(layer.mlp, "gate", None) for layer in layers]
    return [g for g in gates if g is not None and hasattr(g, "top_k") and hasattr(g, "weight")]


def index_dtype(num_experts: int) -> torch.dtype:
    # compact storage: int8 holds expert ids up to 127 (and -1 for "not recorded")
    return torch.int8 if num_experts <= 127 else torch.int16


def empty_grid(model, rows: int, width: int, device=None) -> torch.Tensor:
    """A (layers, rows, width, k) grid of -1 (nothing recorded yet) for ``model``'s routers."""
    gates = routers(model)
    k, e = gates[0].top_k, gates[0].weight.shape[0]
    return torch.full((len(gates), rows, width, k), -1, dtype=index_dtype(e), device=device)


def replayed_gate(router, logits: torch.Tensor, natural: torch.Tensor, replay: torch.Tensor):
    """Gate weights and indices of ``router`` when the experts are forced to ``replay`` (N, k); -1 keeps ``natural``."""
    chosen = torch.where(replay >= 0, replay.to(natural.dtype), natural)
    # p = softmax(router logits) over all experts, in float32 as the model does
    probs = F.softmax(logits, dim=-1, dtype=torch.float)
    # gate weight of each replayed expert: p_e, renormalised over the k chosen when norm_topk_prob
    weights = probs.gather(-1, chosen)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), chosen


class ForwardHooks:
    """Context manager: forward hooks on each of ``modules`` while inside; ``hooks`` are (hook, prepend) pairs
    (``prepend``: run before the hooks already there)."""

    def __init__(self, modules: list[torch.nn.Module], hooks):
        self.modules, self.hooks, self._handles = modules, hooks, []

    def __enter__(self) -> "ForwardHooks":
        self._handles = [m.register_forward_hook(hook, prepend=prepend)
                         for m in self.modules for hook, prepend in self.hooks]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def pinned_routes(gates: list[torch.nn.Module]):
    """``context_fn`` for ``torch.utils.checkpoint`` (non-reentrant) around decoder layers with these routers:
    the backward's recomputation of a layer routes every token to the experts its forward used.

    Activation checkpointing runs each layer's forward again in the backward. By then the caller has left
    ``RouterHooks``' context, so a replayed forward (r2, r3) would be recomputed on the router's own choices
    and the gradient would belong to another function. The forward context notes, per router, whether a hook
    put other experts in place of the router's own (``RouterHooks`` replaying) and which; the recompute
    context puts the same ones back through ``replayed_gate``, as the replay did, unless a ``RouterHooks``
    still open did it already. The recomputation then runs the very ops of the forward, which
    ``torch.utils.checkpoint`` checks. A forward on the router's own choices is recomputed as it is: the
    router sees the same inputs and weights and chooses the same experts.
    """

    def context_fn():
        own: dict[torch.nn.Module, torch.Tensor] = {}  # the router's own choices, before any other hook
        replaced: dict[torch.nn.Module, torch.Tensor] = {}  # the experts a hook replayed instead, in the forward

        def mark(module, args, output):
            own[module] = output[2]

        def keep(module, args, output):
            if output[2] is not own.pop(module):
                replaced[module] = output[2].detach()

        def force(module, args, output):
            if module in replaced and output[2] is own.pop(module):
                logits = output[0]
                weights, chosen = replayed_gate(module, logits, output[2], replaced[module])
                return logits, weights, chosen
            return None

        return (ForwardHooks(gates, [(mark, True), (keep, False)]),
                ForwardHooks(gates, [(mark, True), (force, False)]))

    return context_fn


class RouterHooks:
    """Context manager: hooks on every router that record its own top-k and optionally replay given experts.

    Before each forward, set ``replay`` to a (layers, N, k) tensor (or None to
    let the router choose); after it, ``take()`` returns the router's own
    choices (layers, N, k) of that forward, whatever was replayed. Layers are
    assumed to run in order (the last router's hook closes a forward).
    """

    def __init__(self, model, on_forward=None):
        """``on_forward(routes)``: called with ``take()``'s result after each forward (a generate loop's steps)."""
        self.gates = routers(model)
        self.on_forward = on_forward
        self.replay: torch.Tensor | None = None
        self._natural: list[torch.Tensor | None] = [None] * len(self.gates)
        self._handles = []

    def __enter__(self) -> "RouterHooks":
        for i, gate in enumerate(self.gates):
            self._handles.append(gate.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, layer: int):
        def hook(module, args, output):
            logits, weights, natural = output
            self._natural[layer] = natural.detach()
            if self.on_forward is not None and layer == len(self.gates) - 1:
                self.on_forward(self.take())
            if self.replay is None:
                return None
            rep = self.replay[layer]
            if rep.shape != natural.shape:
                raise ValueError(f"routing replay: layer {layer} routes {tuple(natural.shape)} tokens x slots, "
                                 f"the replayed routes are {tuple(rep.shape)}")
            weights, chosen = replayed_gate(module, logits, natural, rep.to(natural.device))
            return logits, weights, chosen

        return hook

    def take(self) -> torch.Tensor:
        """The router's own top-k of the last forward, (layers, N, k); then forget it."""
        if any(t is None for t in self._natural):
            raise RuntimeError("no forward pass went through every router since the last take()")
        out = torch.stack(self._natural)
        self._natural = [None] * len(self.gates)
        return out


class GridLayout:
    """Which grid cells (row, column) of a rollout the flat tokens of one forward pass are.

    ``packed``: the real tokens (attention mask 1) of ``rows``, row-major, as
    ``fastlm.packed_response_logp`` runs them; ``padded``: every cell of
    ``rows``, as transformers' module runs a padded batch.
    """

    def __init__(self, attention_mask: torch.Tensor, rows: torch.Tensor | None, packed: bool):
        self.rows = rows
        self.cells = attention_mask.bool() if packed else torch.ones_like(attention_mask, dtype=torch.bool)

    def _sub(self, grid: torch.Tensor) -> torch.Tensor:
        return grid if self.rows is None else grid[:, self.rows]

    def gather(self, grid: torch.Tensor) -> torch.Tensor:
        """Flat (layers, N, k) routes of this forward's tokens, read from ``grid``."""
        return self._sub(grid)[:, self.cells.to(grid.device)]

    def scatter(self, grid: torch.Tensor, flat: torch.Tensor) -> None:
        """Write a forward's flat routes (layers, N, k) into ``grid`` (in place)."""
        sub = self._sub(grid)
        sub[:, self.cells.to(grid.device)] = flat.to(grid.dtype)
        if self.rows is not None:
            grid[:, self.rows] = sub


def routing_mismatch(sampler_grid: torch.Tensor, trainer_grid: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """Of the sampler's (token, layer, slot) choices on ``cells`` (B, W) it recorded, the fraction the trainer's
    router does not make on the same tokens (a reordering inside the top-k is not a mismatch)."""
    recorded = cells.to(sampler_grid.device)[None] & (sampler_grid[..., 0] >= 0)  # (L, B, W)
    s = sampler_grid[recorded].long()  # (n, k)
    t = trainer_grid.to(sampler_grid.device)[recorded].long()
    if s.numel() == 0:
        return torch.tensor(float("nan"))
    # still_chosen[n, j] = s[n, j] in t[n, :]
    still = (s.unsqueeze(-1) == t.unsqueeze(-2)).any(-1)
    return (~still).float().mean()
