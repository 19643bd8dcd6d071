"""``run``: warm start once per seed, then each algorithm from that checkpoint, tracked in MLflow.

Everything a user can get wrong is checked in ``validate`` before the first
MLflow run is created, so a bad flag never leaves a run RUNNING. An exception
inside one algorithm marks that run FAILED and the others still run; the
exception types a caller names in ``RunOptions.interrupts`` (``tune``:
``optuna.TrialPruned``) end the run KILLED instead and propagate, and so does
a SIGINT/SIGTERM (``interrupts``), after a checkpoint. ``resume`` continues
unfinished runs from their checkpoints (``lifecycle``, ``checkpoint``).

The runner orchestrates; the MLflow run itself (opened or continued, tagged, ended, the run to resume
found, orphans marked) is ``tracking.runs``'s, and what a checkpoint holds is ``train.checkpoint``'s.
"""

from __future__ import annotations

import signal
import traceback
from dataclasses import dataclass, field, replace

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException

from gspo_bench import algorithms
from gspo_bench.tracking import runs, stores
from gspo_bench.train import checkpoint
from gspo_bench.train import distributed
from gspo_bench.train import interrupts as signals
from gspo_bench.train.assembly import assemble
from gspo_bench.algorithms.evaluation import StartEvals
from gspo_bench.callbacks import (CollapseCallback, MaskedAllRun, MaskedAllWatch, MismatchProbe, MoEFlipProbe,
                                  RatioSample)
from gspo_bench.core.collectives import launch_rank_zero
from gspo_bench.core.losses import LOSSES, Controls
from gspo_bench.core.loss_params import check_relations
from gspo_bench.config import ConfigError, Resolved, RunConfig, to_dict
from gspo_bench.tracking.digest import config_digest, hashed_settings
from gspo_bench.tracking.runs import quiet
from gspo_bench.models import classify_model_ref, tokenizer_and_context
from gspo_bench.tracking.redact import redact_nested
from gspo_bench.rollout.engines import check_engine
from gspo_bench.tasks import ENVIRONMENTS, is_multi_turn, load_task, resolve_task_spec, uses_tool
from gspo_bench.tasks.environments.tools import tool_format
from gspo_bench.tasks.task import check_chat, check_task_data
from gspo_bench.tracking.provenance import git_commit
from gspo_bench.train.warmstart import WarmStart, for_model, warm_start


@dataclass
class RunResult:
    algo: str
    seed: int
    run_id: str | None
    status: str  # FINISHED | FAILED | KILLED (an ``interrupts`` exception; it propagates)
    first: dict = field(default_factory=dict)  # first step's metrics
    last: dict = field(default_factory=dict)  # last step's metrics
    eval_start: float | None = None
    eval_end: float | None = None
    eval_log: list = field(default_factory=list)  # (rl_step, {"eval/pass1": ..., "eval/reward_mean": ...})
    collapse_events: int = 0
    seconds: float = 0.0
    error: str | None = None
    module: object | None = None  # the trained LightningModule, only when asked for (tests, notebooks)
    experiment_id: str | None = None
    clock: dict = field(default_factory=dict)  # seconds in rollout, train and eval (PolicyModule.clock)
    completions: dict = field(default_factory=dict)  # completions generated for training and for eval
    earlier: bool = False  # FINISHED before this command: ``--resume`` read it back and trained nothing


def earlier_result(algo: str, seed: int, done: runs.FinishedRun) -> RunResult:
    """A run ``--resume`` found FINISHED, as a result: its numbers read back from the store."""
    evals = [m["eval/pass1"] for _, m in done.eval_log if "eval/pass1" in m]
    return RunResult(algo, seed, done.run_id, "FINISHED", first=done.first, last=done.last,
                     eval_start=evals[0] if evals else None, eval_end=evals[-1] if evals else None,
                     eval_log=done.eval_log, collapse_events=done.collapse_events, seconds=done.seconds,
                     experiment_id=done.experiment_id, earlier=True)


class ProgressBar(RichProgressBar):
    """Rich bar with reward and clip fraction, without Lightning's ``v_num`` clutter."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def check_loss_controls(cfg: RunConfig, algo: str) -> None:
    """The loss controls ``algo`` cannot take (``losses.Controls.check``), and the top-entropy mask or M2PO's
    where they cannot see the whole minibatch, as a ConfigError before any work."""
    # the loss settings alone are read: the rollout's length cap (1 here) does not enter them
    settings = cfg.resolve(algo, algorithms.get(algo).recipe, 1)
    loss = settings.loss
    try:
        Controls.of(loss, settings.rollout).check(LOSSES[algo], delta_clip=loss.delta_clip, eps_high=loss.eps_high)
    except ValueError as e:
        raise ConfigError(f"{'rollout' if str(e).startswith('m2_threshold') else 'loss'}.{e}") from None
    try:  # the rules between parameters, with every auto resolved to this algorithm's own default
        check_relations(loss.params, "loss.")
    except ValueError as e:
        raise ConfigError(f"{e} ({algo})") from None
    t = cfg.train
    wide = "loss.top_entropy_quantile < 1" if loss.top_entropy_quantile < 1.0 else (
        "rollout.m2_threshold" if settings.rollout.m2_threshold is not None else (
            algo if LOSSES[algo].minibatch_wide else None))
    if wide and (t.micro_batch_tokens or t.devices * t.num_nodes > 1):
        raise ConfigError(f"{wide} needs one process and train.micro_batch_tokens off (null): it picks tokens by "
                          "statistics over every token of a minibatch, and a part of one sees only its own")


def check_environment(spec, cfg: RunConfig) -> None:
    """The environment the task is played in (``env.name``, else the spec's) is registered; a multi-turn one
    with a tool needs a tokenizer that can write its calls in ``env.tool_format``, and is not yet played with partial
    rollouts: a one-line ValueError."""
    name = spec.environment if cfg.env.name is None else cfg.env.name
    if name not in ENVIRONMENTS:
        raise ValueError(f"env.name: unknown environment {name!r} (allowed: {', '.join(ENVIRONMENTS)})")
    if not is_multi_turn(name):
        return
    if cfg.rollout.partial:
        raise ValueError(f"rollout.partial=true is not supported with the multi-turn environment {name!r} yet")
    if not uses_tool(name):
        return
    tok, _ = tokenizer_and_context(cfg.model.name, cfg.model.trust_remote_code)
    try:
        tool_format(tok, cfg.env.tool_format)
    except ValueError as e:
        raise ValueError(f"environment {name!r} with model {cfg.model.name!r}: {e}") from None


def validate(cfg: RunConfig, here: bool = True) -> str:
    """Check everything cheap to check before any run exists; returns the tracking URI. ``here``: the run
    trains in this process's machine (not a suite's Ray cluster), whose device is checked too."""
    for algo in cfg.algos:
        if algo not in algorithms.ALGORITHMS:
            raise ConfigError(f"unknown algorithm {algo!r} (allowed: {', '.join(algorithms.names())})")
        check_loss_controls(cfg, algo)
    distributed.check_processes(cfg)
    if here:
        distributed.check_device(cfg)
    try:
        spec = resolve_task_spec(cfg.task, cfg.task_options)
        check_task_data(spec)  # its data files or data set read once, before the header line and any warm start
        classify_model_ref(cfg.model.name)
        check_chat(spec, cfg.model)
        check_environment(spec, cfg)
    except (ValueError, ImportError) as e:  # ImportError: the task's verifier needs an extra not installed
        raise ConfigError(str(e)) from None
    check_engine(cfg)
    uri = stores.writable_uri(cfg.tracking.tracking_uri)
    stores.apply_retry_budget(cfg.tracking.retry_budget_s)
    if launch_rank_zero():  # the other processes of a multi-process run never open the store
        stores.check_store(uri, cfg.tracking.experiment, cfg.tracking.artifact_location,
                           cfg.tracking.connect_timeout_s)
    return uri


def resolved_settings(cfg: RunConfig, algo: str, seed: int, ws: WarmStart, settings: Resolved) -> dict:
    """One run's settings as logged (params, ``config.yaml``), secrets masked."""
    resolved = to_dict(cfg)
    resolved["algos"] = [algo]
    resolved["seeds"] = [seed]
    resolved["resolved"] = {"loss": to_dict(settings.loss), "rollout": to_dict(settings.rollout),
                            "warmstart": {"path": str(ws.path), "pass1": ws.pass1, "steps": ws.steps,
                                          "dev_pass1": ws.dev_pass1}}
    return redact_nested(resolved)


def prior_run(cfg: RunConfig, uri: str, algo: str, seed: int, resolved: dict, resume: bool, log,
              restart: bool = False) -> tuple:
    """Mark the experiment's orphaned runs KILLED; with ``resume``, ``(run id, checkpoint)`` of the run to
    continue (``runs.prior_run``): ``(None, None)`` when there is none (a new run starts), ``(run id, None)``
    with ``restart`` when that run has no usable checkpoint (it starts afresh as the same MLflow run).
    Checkpoints that do not load or do not fit (``checkpoint.verify``) are named one line each and the one
    before is tried; when none is left, without ``restart``, a ConfigError says so."""
    digest = config_digest(resolved)
    client, prior = runs.prior_run(uri, cfg.tracking.experiment, algo, seed, digest, resume, log)
    if prior is None:
        return None, None
    run_id, status = prior.info.run_id, prior.info.status
    state, problems = checkpoint.load(client, run_id, digest, hashed_settings(resolved))
    for name, why in problems:
        log(f"[resume] {algo} seed {seed}: checkpoint {name} of run {run_id} is unusable: {why}")
    if state is None and restart:
        log(f"[resume] {algo} seed {seed}: --restart: run {run_id} ({status}) starts afresh from RL step 0, as the "
            "same MLflow run")
        return run_id, None
    if state is None and problems:
        raise ConfigError(f"run {run_id} ({algo} seed {seed}) has no usable checkpoint ("
                          + "; ".join(f"{n}: {w}" for n, w in problems)[:600]
                          + "): add --restart to start it afresh as the same MLflow run")
    if state is None:
        log(f"[resume] {algo} seed {seed}: run {run_id} ({status}) has no checkpoint: starting afresh")
        return None, None
    log(f"[resume] {algo} seed {seed}: continuing run {run_id} from its checkpoint at RL step {state['rl_step']}"
        + (" (the newest usable one)" if problems else ""))
    return run_id, state


@dataclass
class RunOptions:
    """How ``run_one`` runs beyond the config: what ``run``, ``tune`` and the tests ask of it."""

    keep_module: bool = False
    """Keep the trained LightningModule on the result (tests, notebooks)."""
    callbacks: tuple = ()
    """Extra Lightning callbacks (``tune``'s pruning)."""
    tags: dict | None = None
    """Extra MLflow tags."""
    parent_run_id: str | None = None
    """A run to nest under (``tune``'s study run)."""
    run_name: str | None = None
    """The MLflow run's name (default ``<algo>-s<seed>``)."""
    interrupts: tuple[type[BaseException], ...] = ()
    """Exception types that end the run KILLED and are re-raised (``optuna.TrialPruned``); any other exception
    ends it FAILED and is returned (on one process)."""
    resume: bool = False
    """Skip this (algo, seed) where a run of these settings FINISHED (its result is read back), else continue its
    unfinished run from its checkpoint (``prior_run``)."""
    restart: bool = False
    """With ``resume``: start it afresh where no checkpoint of it is usable."""
    start_evals: object | None = None
    """The step-0 evaluations the runs of one seed share (``evaluation.StartEvals``)."""


def run_one(cfg: RunConfig, algo: str, seed: int, task, ws: WarmStart, uri: str, log=print,
            opts: RunOptions | None = None) -> RunResult:
    """Train one algorithm from the warm start, as ``opts`` says (``RunOptions``)."""
    o = opts or RunOptions()
    cls = algorithms.get(algo)
    settings = cfg.resolve(algo, cls.recipe, task.spec.max_new_tokens)
    resolved = resolved_settings(cfg, algo, seed, ws, settings)
    digest = config_digest(resolved)
    if o.resume and (done := runs.finished_run(uri, cfg.tracking.experiment, algo, seed, digest)) is not None:
        log(f"[resume] {algo} seed {seed}: already FINISHED (run {done.run_id}): skipped")
        return earlier_result(algo, seed, done)
    resume_id, state = prior_run(cfg, uri, algo, seed, resolved, o.resume, log, o.restart)
    logger = runs.open_run(cfg, uri, algo, seed, resolved, task.name, o.tags, o.parent_run_id, o.run_name,
                           resume_id)
    distributed.watch_run(logger.experiment, logger.run_id)  # another rank dying marks this run FAILED
    result = RunResult(algo, seed, logger.run_id, "FAILED", experiment_id=logger.experiment_id)
    ckpt = checkpoint.Checkpointer(logger.experiment, logger.run_id, cfg.train.checkpoint_every, digest,
                                   state["elapsed_s"] if state else 0.0, log, hashed_settings(resolved))
    module = dm = collapse = None
    resumed_at = state["rl_step"] if state else None  # the RL step the run continued from

    def at() -> int:  # the RL step reached, for the messages below
        return module.rl_step if module is not None else (resumed_at or 0)

    def last_checkpoint() -> int | None:  # the step a --resume would continue from
        return ckpt.saved_step if ckpt.saved_step is not None else resumed_at

    try:
        # the run's objects, each handed what it needs: the module, the trainer, then the datamodule with the
        # engine resolved for the device the trainer puts the policy on
        # RL's own draws (sampling, prompt order, minibatches) follow train.rl_seed where it is set; the data,
        # the initial weights and the warm start stay those of the run's seed
        rl_seed = seed if cfg.train.rl_seed is None else cfg.train.rl_seed
        collapse = CollapseCallback(cfg.collapse, log=ckpt.log)
        built = assemble(cfg, algo, task, ws.path, rl_seed, lambda m: _trainer(cfg, m, logger, collapse, o.callbacks),
                         settings=settings, resume_state=state, start_evals=o.start_evals, checkpointer=ckpt)
        module, trainer, dm = built.module, built.trainer, built.datamodule
        # the stabilisers and the engine, as tags the leaderboard can split by (--by): routing_replay is what
        # ran (none on dense), engine the one that samples (auto resolved)
        runs.tag_run(logger, {"moe": str(module.is_moe).lower(), "routing_replay": module.replay,
                              "engine": dm.engine.name, "correction": settings.rollout.correction,
                              "rollout_dtype": settings.rollout.dtype,
                              "processes": str(cfg.train.devices * cfg.train.num_nodes),
                              # asynchronous: rollouts sampled by a worker while the trainer trains
                              "async": str(settings.rollout.max_staleness > 0).lower(),
                              "max_staleness": str(settings.rollout.max_staleness),
                              "partial": str(settings.rollout.partial).lower()})
        with signals.deferred():
            try:
                trainer.fit(module, datamodule=dm)
            finally:
                dm.close_engine()  # what the engine holds (vLLM's is kept for the next run on its folder)
        result.status = "FINISHED"
        if logger.run_id is not None:  # rank 0 holds the run (and its checkpoint)
            checkpoint.discard(logger.experiment, logger.run_id)
    except (signals.Interrupted, SIGTERMException) as caught:
        # SIGINT/SIGTERM: checkpointed at a step's end (or abandoned mid-step); Lightning's own SIGTERM
        # exception comes instead when the signal lands in the last step, which has no checkpoint
        e = caught if isinstance(caught, signals.Interrupted) else signals.Interrupted(
            signal.SIGTERM, "in the last RL step")
        result.status = "KILLED"
        step = last_checkpoint()
        where = f"; resume from RL step {step} with --resume" if step else "; no checkpoint yet"
        runs.end_run(logger, "KILLED", ckpt.elapsed(),
                     ("killed_reason", f"{e.name} at RL step {at()}{where}"))
        e.checkpoint_step, e.results = step, [result]
        if e is caught:
            raise
        raise e from None
    except o.interrupts:  # stopped on purpose (a pruned trial): not a failure, and the caller handles it
        result.status = "KILLED"
        runs.end_run(logger, "KILLED", ckpt.elapsed())
        raise
    except Exception as e:  # one algorithm failing must not take the benchmark down
        if stores.unreachable(e):  # the server is gone: no more calls to it (each would retry in vain)
            step = last_checkpoint()
            raise stores.TrackingUnreachable(stores.unreachable_message(
                uri, cfg.tracking.retry_budget_s, f"{algo} seed {seed} at RL step {at()}", step)) from None
        result.error, trace, rank = f"{type(e).__name__}: {e}", traceback.format_exc(), 0
        # another rank's death shows here as a failed collective: its own error says what went wrong
        other = distributed.other_rank_failure() if cfg.train.devices * cfg.train.num_nodes > 1 else None
        if other is not None:
            rank, line, trace = other
            result.error = f"rank {rank} failed: {line}"
        log(f"[error] {algo} seed {seed} failed: {result.error}")
        if not isinstance(e, MaskedAllRun):  # a reason, not a bug: its line says it all
            log(trace)
        if rank:  # the other rank's traceback, as an artifact
            runs.attach_text(logger, trace, f"rank{rank}-error.txt")
        runs.end_run(logger, "FAILED", ckpt.elapsed(), ("failed_reason", result.error[:5000]))
        if cfg.train.devices * cfg.train.num_nodes > 1:  # ranks in lockstep: none can go on without the others
            line = result.error if rank else distributed.error_line(e)
            raise distributed.RankFailed(f"{algo} seed {seed}: {line}", trace, line) from None
    result.seconds = ckpt.elapsed()
    if module is not None:  # built (a failure may come before)
        result.first, result.last = module.first_metrics, module.last_metrics
        history = module.eval_history
        result.eval_start, result.eval_end = (history[0][1], history[-1][1]) if history else (None, None)
        result.eval_log, result.clock = list(module.eval_log), dict(module.clock)
    if dm is not None:
        result.completions = dict(dm.sampled)
    result.collapse_events = len(collapse.events) if collapse is not None else 0
    if result.status == "FINISHED":  # Lightning marked it FINISHED
        runs.log_wall_time(logger, result.seconds)
    if o.keep_module:
        result.module = module
    return result


def _trainer(cfg: RunConfig, module, logger, collapse: CollapseCallback, callbacks: tuple) -> L.Trainer:
    moe = module.is_moe
    # measurements first, so the collapse detector sees the step's full metrics
    callbacks = ([MismatchProbe(), RatioSample()] + ([MoEFlipProbe()] if moe else [])
                 + [collapse, MaskedAllWatch(collapse.echo)] + list(callbacks))
    # the bar on rank 0 only, and Lightning told the same on every rank (a bar callback with the bar
    # disabled is an error, which killed the other ranks of a --devices N run)
    progress = cfg.train.progress and launch_rank_zero()
    if progress:
        callbacks.append(ProgressBar(leave=True))
    # evaluation is the module's own (PolicyModule.evaluate_now), so Lightning runs no validation loop
    t = cfg.train
    trainer = L.Trainer(
        max_epochs=1, max_steps=-1, logger=logger, callbacks=callbacks, accelerator=t.accelerator,
        devices=t.devices, num_nodes=t.num_nodes, strategy=distributed.strategy(t, moe), precision=t.precision,
        num_sanity_val_steps=0, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=progress, log_every_n_steps=1,
        use_distributed_sampler=False,  # the datamodule shards the prompts itself (whole groups per rank)
    )
    return trainer


def run(cfg: RunConfig, log=print, keep_modules: bool = False, resume: bool = False,
        restart: bool = False) -> list[RunResult]:
    """All algorithms x seeds of ``cfg``; returns one result per run. ``resume``: skip the FINISHED ones (their
    results read back, ``RunResult.earlier``) and continue unfinished runs from their checkpoints (``restart``: afresh, as the same run, where none is usable). A signal ends it
    with ``interrupts.Interrupted`` carrying the results so far."""
    quiet()
    uri = validate(cfg)
    git_commit()  # the commit of the code this process loaded: asked now, not after a warm start's minutes
    cfg = distributed.fsdp_fallback(cfg, log)
    if (ws := for_model(cfg.warmstart, cfg.model.name)) != cfg.warmstart:  # so the logged params say so too
        log(f"warm start: off for {cfg.model.name} (random weights; the built-in model is never warm-started)")
        cfg = replace(cfg, warmstart=ws)
    results: list[RunResult] = []
    try:
        for seed in cfg.seeds:
            try:
                task = load_task(cfg.task, seed, cfg.model, cfg.rollout.response_cap(), log, cfg.task_options)
            except ValueError as e:  # bad data: one line before any warm start or MLflow run
                raise ConfigError(str(e)) from None
            try:
                ws = warm_start(task, cfg.model, cfg.warmstart, seed, task.spec.max_new_tokens,
                                progress=cfg.train.progress and launch_rank_zero(), log=log, env=cfg.env)
            except signals.Interrupted as e:
                e.where = e.where or f"during the warm start of seed {seed}"
                raise
            if ws.cached:
                log(f"warm start (cached): greedy pass@1 {ws.pass1:.1%} on {len(task.eval)} held-out prompts "
                    f"-> {ws.path}")
            start_evals = StartEvals(str(ws.path))  # every algorithm of this seed starts from this warm start
            for algo in cfg.algos:
                signals.check(where=f"before {algo} seed {seed}")
                log(f"== {algo} (seed {seed}) ==")
                try:
                    results.append(run_one(cfg, algo, seed, task, ws, uri, log, RunOptions(
                        keep_module=keep_modules, resume=resume, restart=restart, start_evals=start_evals)))
                except Exception as e:  # the server went away between runs (opening the next one)
                    if isinstance(e, stores.TrackingUnreachable) or not stores.unreachable(e):
                        raise
                    raise stores.TrackingUnreachable(stores.unreachable_message(
                        uri, cfg.tracking.retry_budget_s, f"{algo} seed {seed} (before its first step)", None)
                    ) from None
    except signals.Interrupted as e:
        e.results = results + e.results
        raise
    return results
