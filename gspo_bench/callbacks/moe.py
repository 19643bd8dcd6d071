"""The MoE probe: which experts the router picks, and how many of those choices an update flips."""

from __future__ import annotations

import lightning as L
import torch

from gspo_bench.rollout.engine import position_ids


class RouterRecorder:
    """Forward hooks on every ``mlp.gate`` router that keep its top-k expert indices."""

    def __init__(self, model: torch.nn.Module):
        self.gates = [m for name, m in model.named_modules() if name.endswith("mlp.gate") and hasattr(m, "top_k")]
        self.indices: list[torch.Tensor] = []
        self._handles = []

    def __enter__(self):
        self.indices = []

        def hook(module, args, output):
            # transformers 5 routers return (logits, scores, top-k indices)
            self.indices.append(output[-1].detach())

        self._handles = [g.register_forward_hook(hook) for g in self.gates]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()


@torch.no_grad()
def route(model, input_ids, attention_mask) -> torch.Tensor:
    """Top-k expert indices, (layers, B*S, k), for one forward pass."""
    with RouterRecorder(model) as rec:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
              use_cache=False)
    return torch.stack(rec.indices)


def expert_flip_rate(old_LNK: torch.Tensor, new_LNK: torch.Tensor, token_mask_N: torch.Tensor) -> torch.Tensor:
    """Of the old policy's (token, layer, slot) choices, the fraction the new policy no longer makes.

    A slot counts as flipped when its old expert is absent from the new top-k
    set of the same token and layer (a reordering inside the top-k is not a
    flip: the same experts still process the token).
    """
    # still_chosen[l, n, j] = old[l, n, j] in new[l, n, :]
    still = (old_LNK.unsqueeze(-1) == new_LNK.unsqueeze(-2)).any(-1)
    w = token_mask_N.to(still.dtype)[None, :, None].expand_as(still).float()
    return ((~still).float() * w).sum() / w.sum().clamp(min=1)


class MoEFlipProbe(L.Callback):
    """Logs ``moe/expert_flip_rate`` (docs/algorithms.md, MoE) on the rollout's response tokens each step."""

    def __init__(self):
        self._old = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._old = route(pl_module.policy, batch.input_ids, batch.attention_mask)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._old is None or self._old.numel() == 0:
            return
        new = route(pl_module.policy, batch.input_ids, batch.attention_mask)
        P = batch.prompt_len
        tok = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
        tok[:, P:] = batch.response_mask.bool()
        rate = float(expert_flip_rate(self._old, new, tok.flatten()))
        pl_module.last_metrics["moe/expert_flip_rate"] = rate
        if pl_module.logger is not None:
            pl_module.logger.log_metrics({"moe/expert_flip_rate": rate}, step=pl_module.rl_step)
        self._old = None
