"""``PolicyModule``: the RL step every algorithm shares, and the registry of algorithm classes.

An algorithm is a small subclass (``grpo.py``, ``gspo.py``, ...) that names
its loss (``name``, a key of ``losses.LOSSES``) and its ``Recipe`` (the
defaults its ``auto`` fields resolve to), and registers with
``@register_algorithm``; its loss's parameters, their defaults and ``tune``'s
search ranges are the loss registration's (``core/loss_params.py``). Only PPO
(critic, GAE) has real code of its own.

The RL step (``training_step``) reads top to bottom: old log-probs before any
update, then one optimiser step per minibatch (loss, backward, clip, step),
then logging. The shared loop's own choices, which no paper pins:

- Manual optimisation. Lightning's ``global_step`` counts optimiser steps, so
  the module keeps its own ``rl_step`` (one per rollout); it is the MLflow step.
- Minibatches: a permutation of the rollout seeded by ``(seed, rl_step)``,
  split by ``tensor_split`` into exactly ``min(minibatches, B)`` parts whose
  sizes differ by at most one, so every run makes the same number of
  optimiser steps and every algorithm sees the same minibatches.
- Micro-batches (``train.micro_batch_tokens``): a minibatch's rows packed into as few runs of at most that
  many tokens of the forward as fit (``micro_batches``), each backpropagated before the one optimiser step.
  Each run's loss divides by the whole minibatch's unit counts, as a rank's share does on several processes,
  so the gradients add up to the unsplit minibatch's; the step's metrics are computed once on the whole
  minibatch's detached outputs.
- A non-finite loss skips that minibatch's backward; a non-finite gradient
  norm skips that optimiser's step. Either way the minibatch counts in
  ``train/nonfinite`` (the fraction of minibatches whose update was skipped)
  and the NaN stays in the step's metrics (``metrics.StepStats`` does not
  average it away), so the collapse callback sees it.
- Evaluation runs before the first step (the warm-start score, logged at
  step 0), at the end of every ``eval_every``-th step and after the last step
  if that was not an eval step: our loop, not Lightning's validation loop,
  so a run resumed from a checkpoint evaluates at the same steps.
- ``checkpointer`` (``checkpoint.Checkpointer``) saves at the end of a step
  (after its evaluation) and stops the run cleanly on SIGINT/SIGTERM.
- What is not part of the update is a callback (``callbacks/``): collapse
  events, the MoE flip rate, the engine/trainer mismatch and the ratio
  sample. They read ``last_metrics`` and ``trace`` (this step's tensors).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import lightning as L
import torch
from torch.profiler import record_function
from transformers import AutoModelForCausalLM

from gspo_bench.core import collectives as ddp
from gspo_bench.algorithms.evaluation import HeldOutEval
from gspo_bench.config import Recipe, Resolved, RunConfig
from gspo_bench.core.entropy_control import EntropyControl
from gspo_bench.core.losses import LOSSES, Controls, loss_keywords, policy_loss
from gspo_bench.core.metrics import Mean, StepStats, merged, values
from gspo_bench.core.names import rejection_bounds
from gspo_bench.core.ratios import loglinear_prox_logp, masked_mean, rejection_mask
from gspo_bench.rollout.producer import RolloutBatch
from gspo_bench.models import is_moe
from gspo_bench.rollout.engine import response_logp, uses_packed
from gspo_bench.rollout.fastlm import prompt_owners
from gspo_bench.rollout.engines import route_recorders
from gspo_bench.rollout.routing import GridLayout, RouterHooks, empty_grid, routing_mismatch

ALGORITHMS: dict[str, type["PolicyModule"]] = {}


def register_algorithm(cls: type["PolicyModule"]) -> type["PolicyModule"]:
    """Class decorator: make ``cls`` runnable by its ``name`` (``run``, ``tune``, ``bench``, ``list``)."""
    if cls.name not in LOSSES:
        raise ValueError(f"algorithm {cls.__name__} names loss {cls.name!r}, which is not registered "
                         f"(losses: {', '.join(LOSSES)})")
    if cls.name in ALGORITHMS and ALGORITHMS[cls.name] is not cls:
        raise ValueError(f"algorithm {cls.name!r} is already registered by {ALGORITHMS[cls.name].__name__}")
    # the config resolves a ``loss.`` key left at ``auto`` from the recipe: its loss's declared defaults
    cls.recipe = dataclasses.replace(cls.recipe, loss_defaults=LOSSES[cls.name].param_defaults())
    ALGORITHMS[cls.name] = cls
    return cls


def adamw(params, **kw) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one kernel for all parameters: ~4x faster steps on CPU)."""
    return torch.optim.AdamW(params, fused=True, **kw)


def step_lr(train, rl_step: int) -> float:
    """The policy's learning rate at RL step ``rl_step`` (0-based) under ``train.lr_schedule``."""
    if train.lr_schedule == "linear":
        # lr_t = lr (1 - t / T): lr at the first step, lr / T at the last (T = train.steps)
        return train.lr * (1.0 - min(rl_step, train.steps - 1) / train.steps)
    return train.lr


def minibatch_indices(B: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A random permutation of ``range(B)`` split into ``min(minibatches, B)`` near-equal parts.

    ``tensor_split`` (not ``chunk``): B=6 in 4 parts is [2, 2, 1, 1], B=10 is
    [3, 3, 2, 2], so the number of optimiser steps is always ``minibatches``.
    """
    perm = torch.randperm(B, generator=generator)
    return list(perm.tensor_split(min(minibatches, B)))


def micro_batches(rows: torch.Tensor, limit: int, prompt: list[int], response: list[int],
                  groups: list[int] | None = None) -> list[torch.Tensor]:
    """``rows`` packed into micro-batches of at most ``limit`` tokens the forward computes, first fit
    decreasing: as few parts as the budget allows, each as full as it allows.

    ``prompt`` and ``response``: each row's real prompt and response tokens. ``groups``: each row's group (the
    rows of one prompt, whose forward computes that prompt once per micro-batch: ``fastlm``'s shared prompts),
    or None when every row computes its own prompt. A part's cost is its rows' response tokens plus each of
    its groups' prompt once (None: plus every row's prompt). The rows are placed group by group, the largest
    group first (its prompt once and all its responses), and within a group the longest response first, each
    into the first part that already holds its group's prompt and has room, else the first part with room,
    else a new one: a group shares its prompt where it can, but fills the room earlier parts left rather
    than open a part of its own (each part costs a forward, a backward and the whole model's gradient added
    once more, a repeated prompt only its tokens). A row over the budget alone is a part of its own. ``limit``
    0 or below: one part of every row. Each part keeps its rows in ``rows``' order; the parts together hold
    every row once."""
    if limit <= 0:
        return [rows]
    keys = list(range(len(rows))) if groups is None else list(groups)
    units: dict[int, list[int]] = {}
    for i, g in enumerate(keys):
        units.setdefault(g, []).append(i)
    parts: list[dict] = []  # each: its cost, its groups, its rows' positions in ``rows``

    def cost(part, i):  # what row i adds to a part: its response, and its prompt unless its group is there
        return response[i] + (0 if keys[i] in part["groups"] else prompt[i])

    def unit_cost(ix):  # a group alone in a part: its prompt once, every row's response
        return prompt[ix[0]] + sum(response[i] for i in ix)

    # largest first; equal ones in the order their first rows come (sorted is stable)
    for ix in sorted(units.values(), key=unit_cost, reverse=True):
        for i in sorted(ix, key=lambda i: response[i], reverse=True):
            fits = [q for q in parts if q["cost"] + cost(q, i) <= limit]
            part = next((q for q in fits if keys[i] in q["groups"]), None) or next(iter(fits), None)
            if part is None:
                part = {"cost": 0, "groups": set(), "rows": []}
                parts.append(part)
            part["cost"] += cost(part, i)
            part["groups"].add(keys[i])
            part["rows"].append(i)
    return [rows[sorted(q["rows"])] for q in parts]


def shares_prompts(model, forward: str, routed: bool) -> bool:
    """Whether the training forward ``forward`` (``train.forward``) of ``model`` computes a group's prompt once:
    on the packed forward, unless an MoE model's routes are replayed or recorded (``routed``), which need every
    cell."""
    return uses_packed(model, forward) and not (is_moe(model) and routed)


def part_sizes(batch: RolloutBatch, rows: torch.Tensor, shared: bool) -> dict:
    """``micro_batches``' inputs for ``rows`` of ``batch``: each row's real prompt and response tokens, and its
    group (the first row of the rollout with the same prompt) when the forward computes a group's prompt once
    (``shared``)."""
    attn = batch.attention_mask[rows]
    P = batch.prompt_len
    groups = prompt_owners(batch.input_ids, batch.attention_mask, P)[rows].tolist() if shared else None
    return {"prompt": attn[:, :P].sum(-1).tolist(), "response": attn[:, P:].sum(-1).tolist(), "groups": groups}


def minibatch_units(mask_BT: torch.Tensor) -> dict[str, float]:
    """The divisors of a minibatch's means, for a loss summed over parts of it: its response tokens and its
    non-empty responses (``minibatches`` gives the same counts over every rank's rows, / W)."""
    len_B = mask_BT.sum(-1)
    return {"token": float(len_B.sum()), "sequence": float((len_B > 0).sum())}


def optimizers_of(module: L.LightningModule) -> list:
    """The module's optimisers as a list, in ``configure_optimizers``' order (Lightning gives one bare)."""
    opts = module.optimizers()
    return opts if isinstance(opts, list) else [opts]


def search_space(algo: str, trial, params=None) -> dict:
    """Config overrides for one Optuna trial of ``algo``, e.g. ``{"loss": {"eps_low": 0.13, "eps_high": 0.27}}``.

    The ranges are its loss's parameters' declared ``search`` ranges (``LossSpec.search_ranges``), sampled in
    their order; ``params`` picks which (default ``LossSpec.searched_by_default``); the others keep the
    algorithm's default.
    """
    spec = LOSSES[algo]
    chosen = spec.searched_by_default() if params is None else tuple(params)
    return {"loss": {name: trial.suggest_float(name, low, high, log=log)
                     for name, (low, high, log) in spec.search_ranges().items() if name in chosen}}


def minibatches(batch: RolloutBatch, count: int, g: torch.Generator, world: int = 1,
                mask: torch.Tensor | None = None):
    """``(rows, units)`` per optimiser step, ``count`` of them. One process: the rollout's rows, ``units`` None.
    ``world`` processes: the global rollout (ranks' rows in rank order) is permuted and split as on one process;
    each rank takes its rows of each minibatch, and ``units`` holds the minibatch's token and non-empty sequence
    counts over all ranks divided by ``world``: the divisors that make the strategy's gradient average the
    gradient of the whole minibatch's loss (``distributed``). ``mask``: the loss's mask (default the rollout's
    ``loss_mask``: the model's response tokens)."""
    mask = batch.loss_mask if mask is None else mask
    if world == 1:
        for rows in minibatch_indices(len(batch), count, g):
            yield rows, None
        return
    lengths = ddp.all_gather_cat(mask.sum(-1).float())
    parts = minibatch_indices(len(lengths), count, g)
    rank = ddp.rank_world()[0]
    for rows, tokens, seqs in ddp.local_minibatches(parts, lengths.cpu(), rank, world):
        yield rows, {"token": tokens / world, "sequence": seqs / world}


def loss_mask(r, batch: RolloutBatch, old_logp: torch.Tensor, stats: StepStats) -> torch.Tensor:
    """``m``, the response tokens the loss trains on (B, T), under rollout settings ``r``: the rollout's loss mask
    (the model's response tokens, never an environment's), less the responses cut at the length cap
    (``rollout.mask_truncated``) and the tokens rejection by KL removes (``rollout.rejection``, logged as
    ``mismatch/rejected_frac``). Both leave the loss's denominators; the advantages were computed with every
    response."""
    mask = batch.loss_mask
    if r.mask_truncated and batch.truncated is not None:
        # a response that ended at max_new_tokens without an eos contributes no term
        mask = mask * (~batch.truncated).to(mask.dtype)[:, None]
    if r.rejection is not None:
        if batch.rollout_logp is None:
            raise RuntimeError("rollout.rejection needs the sampler's log-probs, and this engine returned none")
        keep = rejection_mask(old_logp, batch.rollout_logp, mask, rejection_bounds(r.rejection, r.rejection_threshold))
        # the fraction of the loss's tokens that rejection removes
        stats.add({"mismatch/rejected_frac": masked_mean(((mask > 0) & ~keep).float(), mask.float())})
        mask = mask * keep.to(mask.dtype)
    return mask


def rollout_logp(forward, batch: RolloutBatch, limit: int, replay: torch.Tensor | None = None,
                 record: torch.Tensor | None = None, shared: bool = False) -> torch.Tensor:
    """Response log-probs (B, T) of every row of the rollout through ``forward`` (a module's bound
    ``response_logp`` with its model: the recompute and reference passes, no gradient), in micro-batches of at
    most ``limit`` tokens like the update's (``train.micro_batch_tokens``; ``shared``: the forward computes a
    group's prompt once), so these passes grow no larger than one micro-batch either (0: all rows at once)."""
    if not limit:
        return forward(batch, rows=None, replay=replay, record=record)[0]
    rows = torch.arange(len(batch), device=batch.input_ids.device)
    parts = micro_batches(rows, limit, **part_sizes(batch, rows, shared))
    out = torch.cat([forward(batch, rows=part, replay=replay, record=record)[0] for part in parts])
    # the parts' outputs stacked are the rows in the parts' order: put back in the rollout's
    return out[torch.cat(parts).argsort()]


@dataclass
class StepTrace:
    """This RL step's tensors, for the callbacks that measure rather than train (all detached)."""

    old_logp: torch.Tensor  # (B, T) what the loss used as old log-probs
    minibatches: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (rows, logp (b, T))


class PolicyModule(HeldOutEval, L.LightningModule):
    name: ClassVar[str] = ""
    """Registry key, and the loss it trains with (``losses.LOSSES``)."""
    recipe: ClassVar[Recipe] = Recipe()
    """What this algorithm's ``auto`` fields resolve to (the clip range comes from its loss registration)."""
    group_advantages: ClassVar[bool] = True
    """The datamodule computes group z-score advantages; an algorithm with its own (PPO's GAE) turns it off."""
    kl_in_loss: ClassVar[bool] = True
    """False when the KL to the reference lives elsewhere (PPO: in the reward)."""

    def __init__(self, cfg: RunConfig, model_path: str, seed: int, settings: Resolved, *,
                 resume_state: dict | None = None, start_evals=None, checkpointer=None, evaluate: bool = True,
                 on_metrics=None):
        """``settings``: ``cfg.resolve(name, recipe, ...)``, the same the datamodule samples with.
        ``resume_state``: the checkpoint a resumed run continues from (``train.checkpoint``; the datamodule is
        handed its own part); ``start_evals``: the step-0 evaluations the runs of one seed share
        (``evaluation.StartEvals``); ``checkpointer``: what saves and restores its checkpoints, beats the
        heartbeat and stops it cleanly on a signal (``train.checkpoint.Checkpointer``; None: none of that);
        ``evaluate``: run the held-out evaluation (a benchmark that times the RL step alone turns it off);
        ``on_metrics``: called with every step's metrics, as logged (a benchmark's record of its steps)."""
        super().__init__()
        self.automatic_optimization = False
        self.cfg, self.seed, self.settings = cfg, seed, settings
        self.policy = AutoModelForCausalLM.from_pretrained(
            model_path, trust_remote_code=cfg.model.trust_remote_code, dtype=torch.float32)
        self.ref = None
        if settings.loss.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(
                model_path, trust_remote_code=cfg.model.trust_remote_code, dtype=torch.float32)
            self.ref.requires_grad_(False).eval()
        self.is_moe = is_moe(self.policy)
        self.replay = cfg.moe.routing_replay
        if self.replay != "none" and not self.is_moe:
            warnings.warn(f"moe.routing_replay={self.replay} applies to mixture-of-experts models; "
                          f"{cfg.model.name} is dense, so it is ignored", stacklevel=2)
            self.replay = "none"
        r = settings.rollout
        if r.correction != "none" and r.old_logp_source == "rollout":
            warnings.warn(f"rollout.correction={r.correction} does nothing with old_logp_source=rollout: the old "
                          "log-probs are the sampler's, so the weight is 1", stacklevel=2)
        if r.rejection is not None and r.old_logp_source == "rollout":
            warnings.warn(f"rollout.rejection={r.rejection} sees no mismatch with old_logp_source=rollout: the old "
                          "log-probs are the sampler's, so log rho is 0 at every token", stacklevel=2)
        # the entropy bonus's coefficient, which an adaptive control moves after every optimiser step
        self.entropy = EntropyControl.of(settings.loss)
        self.rl_step = 0
        self.first_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.trace: StepTrace | None = None
        self.eval_history: list[tuple[int, float]] = []  # (rl_step, eval pass@1)
        self.eval_log: list[tuple[int, dict[str, float]]] = []  # (rl_step, every eval/* metric)
        self.eval_listeners: list = []  # fn(rl_step, eval metrics), e.g. the collapse detector
        self.checkpointer = checkpointer
        self.resume_state = resume_state
        self.start_evals = start_evals
        self.evaluate, self.on_metrics = evaluate, on_metrics
        self.world = 1  # processes training together (set in setup)
        # seconds spent in each phase of this run (``bench --whole``): sampling, the update, evaluation
        self.clock = {"rollout_s": 0.0, "train_s": 0.0, "eval_s": 0.0}

    # -- wiring ------------------------------------------------------------------------------------
    def configure_optimizers(self):
        return adamw(self.policy.parameters(), lr=self.cfg.train.lr, weight_decay=self.cfg.train.weight_decay)

    def parameter_groups(self) -> list[tuple[str, list[torch.nn.Parameter]]]:
        """(grad-norm metric, parameters) of each optimiser, in ``configure_optimizers``' order."""
        return [("train/grad_norm", list(self.policy.parameters()))]

    def setup(self, stage: str) -> None:
        rank, self.world = ddp.rank_world()
        if self.world > 1:
            # every rank samples its own responses (a seed per rank), and continues rank 0's checkpoint
            torch.manual_seed(self.seed * 1_000_003 + rank)
            self.resume_state = ddp.broadcast_object(self.resume_state)

    def response_logp(self, model, batch: RolloutBatch, rows=None, with_entropy: bool = False,
                      replay: torch.Tensor | None = None, record: torch.Tensor | None = None,
                      entropy_grad: bool = False, accumulate: bool = False):
        """Response log-probs (and entropy, with its gradient when ``entropy_grad``) of ``rows`` through the
        configured forward (``train.forward``). ``accumulate``: the packed forward's weight gradients go into
        the ``.grad`` already there, inside their matmuls (a micro-batch after the first; ``core.accumulate``).

        MoE only: ``replay`` (a routes grid of the whole rollout) forces those experts; ``record`` (a grid
        from ``routing.empty_grid``) receives the router's own choices, written in place.
        """
        ids, attn = (batch.input_ids, batch.attention_mask) if rows is None else (
            batch.input_ids[rows], batch.attention_mask[rows])
        width = ids.shape[1] - batch.prompt_len  # T, the rollout's response columns
        if rows is not None and replay is None and record is None and not uses_packed(model, self.cfg.train.forward):
            # the transformers forward runs over padded rows: a part of the rollout (a minibatch, a micro-batch)
            # stops at its own longest row, not the rollout's (responses are right-padded, so the columns past
            # its last real token are padding in every one of its rows); the outputs are padded back to T below
            real = attn.any(0).nonzero()
            end = max(int(real.max()) + 1 if len(real) else 0, batch.prompt_len + 1)
            ids, attn = ids[:, :end], attn[:, :end]

        def widen(out):
            # (log-probs, entropy) of the kept columns, zeros on the cut ones: (b, T) as the rest of the step
            return tuple(x if x is None or x.shape[1] == width else torch.nn.functional.pad(x, (0, width - x.shape[1]))
                         for x in out)

        def forward(share: bool):  # a group's rows compute their prompt once, unless routes are replayed
            t = self.cfg.train
            return response_logp(model, ids, attn, batch.prompt_len, self.settings.rollout.temperature,
                                 with_entropy, t.forward, share, self.settings.rollout.moe_kernel,
                                 logit_chunk_tokens=t.logit_chunk_tokens, checkpoint_layers=t.activation_checkpointing,
                                 entropy_grad=entropy_grad, accumulate_grads=accumulate)

        if not self.is_moe or (replay is None and record is None):
            return widen(forward(True))
        layout = GridLayout(attn, rows, uses_packed(model, self.cfg.train.forward))
        with RouterHooks(model) as hooks:
            hooks.replay = None if replay is None else layout.gather(replay)
            out = forward(False)
            if record is not None:
                layout.scatter(record, hooks.take())
        return out

    # -- the RL step ---------------------------------------------------------------------------
    def training_step(self, batch: RolloutBatch, batch_idx: int):
        t0 = time.perf_counter()
        stats = StepStats()
        # 1. old log-probs (and reference log-probs, advantages), before any update
        with record_function("step/prepare"):  # a phase of the profiler's table (``bench --memory --profile``)
            prep = self.prepare(batch, stats)
        # 1 where the loss's mask left no token (truncation, rejection): the step trains on nothing (on W > 1
        # processes the ranks' mean: 1 only where no rank had one)
        stats.add({"train/masked_all": (prep["mask"].sum() == 0).float()})
        self.trace = StepTrace(old_logp=prep["old_logp"])
        g = torch.Generator().manual_seed(self.seed * 7919 + self.rl_step)
        prep["generator"] = g  # the step's random draws after the minibatches' permutation (clip_cov's tokens)
        # this step's policy learning rate (train.lr_schedule): a function of the step alone, so a resumed run
        # continues the schedule exactly; the policy's optimiser comes first
        lr = step_lr(self.cfg.train, self.rl_step)
        for group in optimizers_of(self)[0].param_groups:
            group["lr"] = lr
        stats.add({"train/lr": lr})
        for opt in optimizers_of(self):
            opt.zero_grad(set_to_none=True)
        # 2. minibatches: one optimiser step each, so all but the first are off policy
        for rows, units in minibatches(batch, self.cfg.train.minibatches, g, self.world, prep["mask"]):
            rows = rows.to(batch.input_ids.device)
            # 3-4. loss and backward, micro-batch by micro-batch (on W > 1 processes: this rank's share of the
            # minibatch's loss, x W), unless the loss is NaN/Inf (on any rank: all ranks skip together)
            finite = self.minibatch_backward(batch, prep, rows, stats, units)
            # 5. clip and step
            with record_function("step/optimizer"):
                self.clip_and_step(stats, finite)
        # 6. logging, with the RL step as the step (metrics reduced over ranks: every rank logs the same)
        self.rl_step += 1
        metrics = {**batch.stats, **stats.reduce()}
        if self.entropy.in_loss:
            metrics["loss/entropy_coef"] = self.entropy.coef
        metrics["time/train_s"] = time.perf_counter() - t0
        metrics["time/step_s"] = metrics["time/train_s"] + batch.stats.get("time/gen_s", 0.0)
        self.clock["rollout_s"] += batch.stats.get("time/gen_s", 0.0)
        self.clock["train_s"] += metrics["time/train_s"]
        self.record(ddp.reduce_metrics(metrics))
        return None

    def prepare(self, batch: RolloutBatch, stats: StepStats) -> dict[str, torch.Tensor]:
        """Tensors every minibatch needs: old (and reference) log-probs, advantages and the loss's mask.

        ``old_logp_source: rollout`` takes the engine's log-probs as they are
        (no recompute pass); ``recompute`` runs the training model over the rollout.
        """
        mask = batch.loss_mask
        if self.replay == "r3" and batch.routes is None:
            raise RuntimeError("moe.routing_replay=r3 needs the sampler's expert choices, and this engine did not "
                               f"record them (engines that can: {', '.join(route_recorders())})")
        # the router's own choices on this rollout before any update: r2 replays them, and they are
        # what moe/routing_mismatch compares with the sampler's
        natural = None
        if self.is_moe and (self.replay == "r2" or batch.routes is not None):
            natural = empty_grid(self.policy, *batch.input_ids.shape, device=batch.input_ids.device)
        limit = self.cfg.train.micro_batch_tokens
        policy_pass, ref_pass = (functools.partial(self.response_logp, m) for m in (self.policy, self.ref))
        routed = natural is not None or self.replay == "r3"  # the policy's passes replay or record routes
        shared = shares_prompts(self.policy, self.cfg.train.forward, routed)
        r = self.settings.rollout
        if r.prox_logp == "loglinear" and (batch.rollout_logp is None or batch.versions is None):
            raise RuntimeError("rollout.prox_logp=loglinear needs the sampler's log-probs and each token's version, "
                               "and this rollout has none")
        with torch.no_grad():
            if (r.old_logp_source == "rollout" and batch.rollout_logp is not None) or r.prox_logp == "loglinear":
                # the sampler's own (loglinear: what each minibatch's proximal log-probs start from; no pass)
                old = batch.rollout_logp
                if natural is not None:  # no recompute pass: one forward just for the routes
                    rollout_logp(policy_pass, batch, limit, record=natural, shared=shared)
            else:
                # r3: the recompute pass already replays the sampler's experts
                old = rollout_logp(policy_pass, batch, limit, replay=batch.routes if self.replay == "r3" else None,
                                   record=natural, shared=shared)
            out = {"old_logp": old * mask, "advantages": batch.advantages,
                   "routes": {"r2": natural, "r3": batch.routes}.get(self.replay)}
            if self.ref is not None:
                ref_shared = shares_prompts(self.ref, self.cfg.train.forward, False)
                out["ref_logp"] = rollout_logp(ref_pass, batch, limit, shared=ref_shared)
        if natural is not None and batch.routes is not None:
            stats.add({"moe/routing_mismatch": routing_mismatch(batch.routes, natural, batch.attention_mask.bool())})
        out["mask"] = loss_mask(self.settings.rollout, batch, out["old_logp"], stats)
        return out

    def minibatch_backward(self, batch: RolloutBatch, prep: dict, rows: torch.Tensor, stats: StepStats,
                           units: dict[str, float] | None = None) -> bool:
        """Backpropagate the minibatch's loss on ``rows`` in micro-batches of at most ``train.micro_batch_tokens``
        real tokens (``micro_batches``; off: all rows at once) and add its metrics to ``stats``. ``units`` as in
        ``minibatch_loss``. Returns whether the loss was finite on every rank; when it was not, no gradient of
        the minibatch is left (parts already backpropagated are dropped), and ``clip_and_step`` skips it."""
        if not len(rows):  # no rows of this minibatch on this rank (W > 1 only): DDP all-reduces every gradient in
            # the backward, so this rank must run one too or the others wait for it forever. A loss of exactly 0
            # times one element of each trained parameter gives every gradient exactly 0 (never NaN), with
            # no forward pass: the ranks' backwards pair up and the average is the other ranks' gradient.
            loss = 0.0 * sum(p.reshape(-1)[0] for p in self.parameters() if p.requires_grad)
            # its share of the minibatch's loss is 0: the ranks' mean stays the whole minibatch's loss
            stats.add({"train/loss": 0.0, "loss/policy": 0.0, "loss/kl": 0.0})
            finite = ddp.all_true(bool(torch.isfinite(loss)), loss.device)  # the other ranks vote on their loss
            if finite:
                self.manual_backward(loss)
            # the adaptive entropy control sums over every rank: this one adds nothing, but takes part
            empty = prep["mask"][rows]
            self.entropy.adapt(torch.zeros_like(empty, dtype=torch.float32), empty,
                               ddp.all_sum if self.world > 1 else None)
            return finite
        limit = self.cfg.train.micro_batch_tokens
        routed = self.is_moe and prep.get("routes") is not None
        shared = shares_prompts(self.policy, self.cfg.train.forward, routed)
        parts = micro_batches(rows, limit, **part_sizes(batch, rows, shared)) if limit else [rows]
        rows = torch.cat(parts)  # the minibatch's rows in the parts' order, which its outputs stacked follow
        # each part divides by the whole minibatch's counts, as a rank's share does (one part: its own, as ever)
        mask = prep["mask"][rows]
        shares = units if units is not None or len(parts) == 1 else minibatch_units(mask)
        if shares is not None:
            # bnpo divides by this process's own tokens of the minibatch, never by the count over every process
            shares = {**shares, "local_token": minibatch_units(mask)["token"]}
        outs, partials, total, finite = [], [], 0.0, True
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            # a part after the first adds its weight gradients into the ones the parts before left, inside the
            # matmuls (core/accumulate.py); the part whose backward DDP all-reduces (the last on W > 1
            # processes) stays autograd's own, so that the all-reduce's hooks see every gradient arrive
            fused = i > 0 and not (last and self.world > 1)
            # after a NaN/Inf nothing more is backpropagated: the later parts' forwards only complete the metrics
            with torch.set_grad_enabled(finite and torch.is_grad_enabled()):
                with record_function("step/forward"):
                    out = self.minibatch_forward(batch, prep, part, fused)
                with record_function("step/loss"):
                    loss, st = self.minibatch_loss(batch, prep, part, out, shares)
            finite = finite and bool(torch.isfinite(loss))
            if last:  # one vote per minibatch on every rank, however many parts each rank's rows make
                finite = ddp.all_true(finite, loss.device)
            if finite:
                # DDP all-reduces in the backward of a minibatch's last micro-batch; the others accumulate on this
                # rank (no_sync), so each rank all-reduces once per minibatch, whatever its number of parts
                quiet = not last and self.world > 1
                with self.trainer.strategy.block_backward_sync() if quiet else contextlib.nullcontext(), \
                        record_function("step/backward"):
                    self.manual_backward(loss)
            outs.append({k: out[k].detach() for k in ("logp", "entropy")})
            partials.append(st)
            # L = sum over parts of L_part, each part's sum over its units / the minibatch's count
            total = total + loss.detach()
        if not finite:
            self.zero_grad(set_to_none=True)
        # the metrics of the whole minibatch (means, spreads, extremes over all its rows) from its parts' own
        # statistics, merged (core/metrics.py): no loss is evaluated again
        with torch.no_grad(), record_function("step/metrics"):
            stats.add({**values(merged(partials)), "train/loss": total})
            entropy = torch.cat([o["entropy"] for o in outs]) if len(outs) > 1 else outs[0]["entropy"]
        # the adaptive entropy control, from this step's entropy (its new c applies from the next step on)
        self.entropy.adapt(entropy, mask, ddp.all_sum if self.world > 1 else None)
        self.trace.minibatches.append((rows, torch.cat([o["logp"] for o in outs])))
        return finite

    def minibatch_forward(self, batch: RolloutBatch, prep: dict, rows: torch.Tensor,
                          accumulate: bool = False) -> dict[str, torch.Tensor]:
        """The training forward on ``rows``, with gradient: what ``minibatch_loss`` reads, (b, T) each (the
        response log-probs and entropy). ``accumulate``: its backward adds the weight gradients into the
        ``.grad`` the earlier micro-batches left (``response_logp``)."""
        logp, ent = self.response_logp(self.policy, batch, rows, with_entropy=True, replay=prep.get("routes"),
                                       entropy_grad=self.entropy.in_loss, accumulate=accumulate)
        return {"logp": logp, "entropy": ent}

    def minibatch_loss(self, batch: RolloutBatch, prep: dict, rows: torch.Tensor, out: dict[str, torch.Tensor],
                       units: dict[str, float] | None = None) -> tuple[torch.Tensor, dict]:
        """The policy loss on ``rows`` from their forward ``out`` (``minibatch_forward``), and its metrics as the
        rows' sufficient statistics (``core/metrics.py``), which ``minibatch_backward`` merges over the parts.
        ``units``: the divisors of the minibatch's means over tokens or sequences when ``rows`` are a part of it
        (a rank's share on W > 1 processes, a micro-batch): its counts over all its rows / W (``minibatches``,
        ``minibatch_units``), and ``local_token``, this process's own token count of it (bnpo's divisor); None when
        ``rows`` are the whole minibatch on one process (the rows' own counts). The loss's tokens are ``prepare``'s
        mask; the controls (``loss.*``: the entropy bonus at this step's coefficient, the top-entropy mask, bnpo)
        are passed only when on."""
        logp, ent = out["logp"], out["entropy"]
        mask = prep["mask"][rows]
        old = prep["old_logp"][rows]
        if self.settings.rollout.prox_logp == "loglinear":
            # prox_logp_t = roll_logp_t + alpha_t (sg(logp_t) - roll_logp_t), v_train = this RL step's version
            old = loglinear_prox_logp(batch.rollout_logp[rows], logp, batch.versions[rows], self.rl_step) * mask
        extra = {}
        if self.ref is not None and self.kl_in_loss:
            extra = {"kl_coef": self.settings.loss.kl_coef, "ref_logp": prep["ref_logp"][rows]}
        spec = LOSSES[self.name]
        # the controls at this optimiser step's entropy coefficient, each passed only when on
        controls = Controls.of(self.settings.loss, self.settings.rollout, self.entropy.applied())
        extra.update(controls.keywords(None if batch.rollout_logp is None else batch.rollout_logp[rows], ent))
        if "generator" in spec.inputs and prep.get("generator") is not None:
            extra["generator"] = prep["generator"]
        if "rollout_logp" in spec.inputs and batch.rollout_logp is not None:  # a loss against the sampler itself
            extra["rollout_logp"] = batch.rollout_logp[rows]
        coef, kind = controls.entropy_coef, controls.units_key(spec)
        loss, st = policy_loss(self.name, logp=logp, old_logp=old,
                               advantages=prep["advantages"][rows], mask=mask,
                               units=None if units is None else units[kind],
                               **({} if units is None or coef == 0 else {"token_units": units["token"]}),
                               **loss_keywords(spec, self.settings.loss.hparams(), self.settings.rollout.max_new_tokens),
                               partials=True, **extra)
        # H = mean over the model's response tokens of the sampling distribution's entropy
        resp = batch.loss_mask[rows]
        st["policy/entropy"] = Mean((ent.detach() * resp).sum(), resp.sum())
        return loss, st

    def clip_and_step(self, stats: StepStats, loss_finite: bool) -> None:
        """Clip each optimiser's gradient by norm and step it; a NaN/Inf loss or norm skips that step."""
        max_norm = self.cfg.train.max_grad_norm or float("inf")
        skipped = not loss_finite
        for opt, (key, params) in zip(optimizers_of(self), self.parameter_groups()):
            for p in params:
                if p.grad is not None and p.grad.is_sparse:
                    # a tied embedding's rows-read gradient (``core/embedding.py``) stays sparse only where the
                    # LM head took no part in the backward: made whole for clipping and AdamW
                    p.grad = p.grad.to_dense()
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            ok = loss_finite and bool(torch.isfinite(norm))
            if ok:
                opt.step()
            opt.zero_grad(set_to_none=True)
            skipped = skipped or not ok
            stats.add({key: norm})
        stats.add({"train/nonfinite": float(skipped)})

    def record(self, metrics: dict[str, float]) -> None:
        """Log with the RL step as the step; also feed callback_metrics and the progress bar."""
        self.last_metrics = metrics
        if self.rl_step == 1:
            self.first_metrics = dict(metrics)
        if self.logger is not None:
            self.logger.log_metrics(metrics, step=self.rl_step)
        bar = {"reward": metrics.get("reward/mean", 0.0), "clip": metrics.get("clip/frac", 0.0)}
        self.log_dict(bar, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1)
        self.log("rl_step", float(self.rl_step), logger=False, batch_size=1)
        if self.on_metrics is not None:
            self.on_metrics(metrics)

    # -- evaluation and checkpoints -----------------------------------------------------------------
    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # after every callback's hook (Lightning calls the module's last), so the collapse detector has
        # seen the step before its evaluation, and the checkpoint holds both
        if self.evaluate and self.rl_step % self.cfg.train.eval_every == 0:
            self.evaluate_now()
        if self.checkpointer is not None:
            self.checkpointer.after_step(self)

    def on_train_start(self) -> None:
        if self.resume_state is not None:  # a resumed run: its step-0 evaluation is logged already
            self.checkpointer.restore(self, self.resume_state)  # the runner's: it wrote the checkpoint too
            self.resume_state = None
        elif self.evaluate:  # the warm-start score, logged at step 0
            self.evaluate_now()

    def on_train_end(self) -> None:
        if self.evaluate and (not self.eval_history or self.eval_history[-1][0] != self.rl_step):
            self.evaluate_now()
