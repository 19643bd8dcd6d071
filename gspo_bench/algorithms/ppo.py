"""PPO: the one algorithm with real code of its own (a critic and GAE).

Departures from the textbook, all as docs/algorithms.md pins them: the scalar reward sits on
the last response token; the KL to the reference model is a per-token penalty
folded into the reward (``kl_coef`` 0.05 by default), not a loss term;
``gamma = 1``, ``lambda = 0.95``. The critic is a separate copy of the
warm-started trunk with a scalar head and its own optimiser, so the policy's
gradients are exactly the clipped surrogate's, as for every other algorithm.
Advantages are whitened over the rollout's response tokens (the usual PPO
practice; the group algorithms normalise per group instead).
"""

from __future__ import annotations

import torch
from transformers import AutoModel

from gspo_bench.core import advantages as adv
from gspo_bench.core import collectives as ddp
from gspo_bench.algorithms.base import PolicyModule, adamw, register_algorithm
from gspo_bench.config import Recipe
from gspo_bench.core.losses import kl_penalty
from gspo_bench.core.metrics import StepStats, Total
from gspo_bench.rollout.producer import RolloutBatch
from gspo_bench.rollout import fastlm
from gspo_bench.rollout.engine import checkpointed_layers, position_ids, uses_packed


class Critic(torch.nn.Module):
    """V(s_t) for every response position: a transformer trunk plus a linear head.

    ``forward`` as ``train.forward``: ``packed`` (or ``auto`` on a Qwen3-family trunk) runs ``fastlm``
    over the real tokens only, each group's prompt once; ``hf`` the transformers module, padded.
    ``moe_kernel``: how a packed MoE trunk runs its experts (``rollout.moe_kernel``).
    ``checkpoint_layers``: activation checkpointing of the trunk (``train.activation_checkpointing``).
    """

    def __init__(self, model_path: str, trust_remote_code: bool = False, forward: str = "auto",
                 moe_kernel: str = "auto", checkpoint_layers: bool | str = False):
        super().__init__()
        self.moe_kernel = moe_kernel
        self.checkpoint_layers = checkpoint_layers
        self.trunk = AutoModel.from_pretrained(model_path, trust_remote_code=trust_remote_code, dtype=torch.float32)
        hidden = self.trunk.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.packed = uses_packed(self.trunk, forward)

    def forward(self, input_ids, attention_mask, prompt_len: int) -> torch.Tensor:
        if self.packed:
            h, resp = fastlm.packed_states(self.trunk, input_ids, attention_mask, prompt_len, share_prompts=True,
                                           moe_kernel=self.moe_kernel, checkpoint_layers=self.checkpoint_layers)
            v = self.head(h.float()).squeeze(-1)
            return torch.zeros(resp.shape, dtype=v.dtype, device=v.device).masked_scatter(resp, v)
        with checkpointed_layers(self.trunk, self.checkpoint_layers):
            h = self.trunk(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids(attention_mask), use_cache=False).last_hidden_state
        # the state before emitting response token t is position P-1+t, as for the policy's logits
        return self.head(h[:, prompt_len - 1 : -1].float()).squeeze(-1)  # (B, T)


@register_algorithm
class PPO(PolicyModule):
    """PPO (Schulman et al. 2017) with GAE, a learned critic and a KL-shaped reward."""

    name = "ppo"
    recipe = Recipe(kl_coef=0.05)
    group_advantages = False  # GAE over the critic instead (``prepare``)
    kl_in_loss = False  # the KL is in the reward, so the policy loss is the bare clipped surrogate

    def __init__(self, cfg, model_path: str, seed: int, settings, **wiring):
        super().__init__(cfg, model_path, seed, settings, **wiring)
        self.critic = Critic(model_path, cfg.model.trust_remote_code, cfg.train.forward,
                             settings.rollout.moe_kernel, cfg.train.activation_checkpointing)

    def configure_optimizers(self):
        t = self.cfg.train
        return [
            adamw(self.policy.parameters(), lr=t.lr, weight_decay=t.weight_decay),
            adamw(self.critic.parameters(), lr=t.critic_lr, weight_decay=0.0),
        ]

    def prepare(self, batch: RolloutBatch, stats: StepStats) -> dict[str, torch.Tensor]:
        out = super().prepare(batch, stats)
        mask = batch.loss_mask
        lc = self.cfg.loss
        with torch.no_grad():
            values = self.critic(batch.input_ids, batch.attention_mask, batch.prompt_len) * mask
            kl = None
            if self.ref is not None:
                # per-token KL(pi_old || pi_ref) estimate, k = kl_estimator (docs/algorithms.md)
                kl = kl_penalty(out["old_logp"], out["ref_logp"], lc.kl_estimator) * mask
                stats.add({"critic/ref_kl": kl.sum() / mask.sum().clamp(min=1)})
            # r_t = R on the last token - kl_coef * kl_t
            rewards = adv.token_rewards(batch.rewards, mask, kl, self.settings.loss.kl_coef if kl is not None else 0.0)
            advantages, returns = adv.gae(rewards, values, mask, gamma=lc.gamma, lam=lc.lam)
            stats.add({"critic/explained_var": adv.explained_variance(values, returns, mask),
                       "critic/value_mean": values.sum() / mask.sum().clamp(min=1),
                       "critic/adv_raw_mean": advantages.sum() / mask.sum().clamp(min=1)})
        # whitened over the whole rollout's response tokens, every rank's included
        out.update(advantages=adv.whiten(advantages, mask, all_sum=ddp.all_sum if self.world > 1 else None),
                   returns=returns, values=values)
        return out

    def parameter_groups(self):
        return super().parameter_groups() + [("critic/grad_norm", list(self.critic.parameters()))]

    def minibatch_forward(self, batch: RolloutBatch, prep: dict, rows: torch.Tensor,
                          accumulate: bool = False) -> dict[str, torch.Tensor]:
        out = super().minibatch_forward(batch, prep, rows, accumulate)
        out["values"] = self.critic(batch.input_ids[rows], batch.attention_mask[rows], batch.prompt_len)  # (b, T)
        return out

    def minibatch_loss(self, batch: RolloutBatch, prep: dict, rows: torch.Tensor, out: dict[str, torch.Tensor],
                       units: dict[str, float] | None = None) -> tuple[torch.Tensor, dict]:
        policy, st = super().minibatch_loss(batch, prep, rows, out, units)
        mask = prep["mask"][rows]  # the loss's tokens: a response the controls leave out trains no value either
        v = out["values"]
        v_old, ret = prep["values"][rows], prep["returns"][rows]
        err = (v - ret).square()
        c = self.cfg.loss.value_clip
        if c is not None:
            # V_clip = V_old + clamp(V - V_old, -c, c); loss = max((V - R)^2, (V_clip - R)^2)
            err = torch.maximum(err, (v_old + (v - v_old).clamp(-c, c) - ret).square())
        # value loss = vf_coef * 0.5 * token-mean of the squared error (the minibatch's tokens on every rank)
        tokens = None if units is None else units["token"]
        value_loss = self.cfg.loss.vf_coef * 0.5 * (err * mask).sum() / (
            mask.sum().clamp(min=1) if tokens is None else (tokens if tokens > 0 else 1.0))
        st["critic/value_loss"] = Total(value_loss.detach())  # with units, the part's share: the shares add
        return policy + value_loss, st
