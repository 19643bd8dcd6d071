"""Checkpoints for an exact ``run --resume``: what they hold, where they live, how they are written.

A checkpoint is taken at the end of an RL step (after that step's evaluation, if any), every
``train.checkpoint_every`` steps and when a signal stops the run. It holds everything the rest of the run
depends on, so a resumed run continues bit for bit on CPU:

- the module's weights (policy, PPO's critic; not the frozen reference, which the warm start rebuilds) and
  every optimiser's state;
- ``rl_step`` and the module's records (first/last metrics, the eval history);
- the datamodule's ``state_dict()``: the sampler's queue of past policies (``rollout.staleness``), the
  verifier timeouts not logged yet, and the samplers' random stream (``rollout.draws``); its position is ``rl_step`` (prompts of step ``s`` are seeded by
  ``(seed, s)``), and dynamic sampling fills each step within that step, so it carries nothing over;
- every callback's ``state_dict()`` (the collapse detector's running means, bests and events);
- the RNG states (torch, CUDA, Python, NumPy), restored just before the next rollout samples (by the
  datamodule, ``RolloutDataModule.load_state_dict``);
- the wall time spent so far.

Where: next to the run, ``<run's artifact dir>/checkpoint/step-<N>.pt`` when the artifact store is a local
directory (the default for a ``sqlite:///`` store); otherwise written to a local temporary file and logged
as the run's artifact ``checkpoint/step-<N>.pt``. The last ``KEEP`` (2) are kept, so a checkpoint that turns
out unreadable has one to fall back to; a finished run's are deleted (nothing is left to resume). Writes are
atomic: the file is written under a temporary name, flushed, then renamed, so a kill at any moment leaves
whole checkpoints only.

Loading verifies before it trusts: the file must unpickle (``weights_only=True``: plain containers,
tensors and numbers, no arbitrary code), hold every key ``capture`` writes, carry this format's
``VERSION`` and the run's settings digest (``digest.config_digest``; the settings themselves are stored
too, so a mismatch is named key by key). ``load`` returns the newest checkpoint that passes, with a reason
for each newer one that did not.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

import torch

from gspo_bench.algorithms.base import optimizers_of
from gspo_bench.core import collectives
from gspo_bench.core.rng import rng_state

VERSION = 1
ARTIFACT_DIR = "checkpoint"
KEEP = 2  # checkpoints kept per run: the newest, and one to fall back to
REQUIRED = ("version", "config_hash", "rl_step", "elapsed_s", "weights", "optimizers", "records", "sampler",
            "verify_timeouts", "callbacks", "rng")
_NAME = re.compile(r"^step-(\d+)\.pt$")
LEGACY = "last.pt"  # the one checkpoint of gspo-bench versions that kept one


# -- what a checkpoint holds --------------------------------------------------------------------------------------
def records_of(module) -> dict:
    """What the module has recorded so far (a checkpoint's ``records``): its RL step, first and last metrics, its
    evaluations, and the entropy control's state."""
    return {"rl_step": module.rl_step, "first_metrics": module.first_metrics, "last_metrics": module.last_metrics,
            "eval_history": module.eval_history, "eval_log": module.eval_log,
            "entropy_control": module.entropy.state_dict()}


def restore_records(module, state: dict) -> None:
    """Put a checkpoint's ``records`` (``records_of``) back into ``module``."""
    module.rl_step = int(state["rl_step"])
    module.first_metrics, module.last_metrics = dict(state["first_metrics"]), dict(state["last_metrics"])
    module.eval_history = [(int(s), float(v)) for s, v in state["eval_history"]]
    module.eval_log = [(int(s), dict(m)) for s, m in state["eval_log"]]
    control = state.get("entropy_control")  # absent from a checkpoint written before the entropy control
    if control is not None:
        module.entropy.load_state_dict(control)


def capture(module, elapsed_s: float, config_hash: str, settings: dict | None = None) -> dict:
    """The state of a run at the end of its RL step ``module.rl_step`` (see the module docstring);
    ``settings``: the hashed settings behind ``config_hash`` (``digest.hashed_settings``)."""
    trainer, dm = module.trainer, module.trainer.datamodule
    return {
        "version": VERSION, "config_hash": config_hash, "settings": dict(settings or {}),
        "rl_step": module.rl_step, "elapsed_s": float(elapsed_s),
        "weights": {k: v.detach().cpu() for k, v in module.state_dict().items() if not k.startswith("ref.")},
        "optimizers": [opt.optimizer.state_dict() for opt in optimizers_of(module)],
        "records": records_of(module),
        **dm.state_dict(),  # "sampler", "verify_timeouts", "draws"
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks if cb.state_dict()},
        "rng": rng_state(),
    }


ROLLOUT_KEYS = ("sampler", "verify_timeouts", "rl_step", "rng", "draws")
"""What the rollout datamodule continues from (``RolloutDataModule.load_state_dict``); ``draws`` is absent from a
checkpoint written before the samplers' draws had a stream of their own."""


def rollout_part(state: dict | None) -> dict | None:
    """The datamodule's part of a checkpoint (``ROLLOUT_KEYS``), handed to it when the run is built; None for
    None."""
    return None if state is None else {k: state[k] for k in ROLLOUT_KEYS if k in state}


def restore(module, state: dict) -> None:
    """Put ``state`` back into a module whose trainer has set up its optimisers (``on_train_start``), and into
    the trainer's callbacks. The datamodule took its part (``rollout_part``) in its own ``setup``
    (``RolloutDataModule.load_state_dict``: its position sizes the dataloader, made before this hook)."""
    trainer = module.trainer
    missing, unexpected = module.load_state_dict(state["weights"], strict=False)
    if unexpected or [k for k in missing if not k.startswith("ref.")]:
        raise RuntimeError(f"the checkpoint does not fit this model (missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]})")
    for opt, sd in zip(optimizers_of(module), state["optimizers"], strict=True):
        opt.optimizer.load_state_dict(sd)
    restore_records(module, state["records"])
    for cb in trainer.callbacks:
        if cb.state_key in state["callbacks"]:
            cb.load_state_dict(state["callbacks"][cb.state_key])


# -- where it lives ----------------------------------------------------------------------------------------------
def _local_dir(artifact_uri: str) -> Path | None:
    from gspo_bench.tracking.client import local_artifact_dir

    local = local_artifact_dir(artifact_uri)
    return None if local is None else local / ARTIFACT_DIR


def atomic_save(state: dict, path: Path) -> None:
    """``torch.save`` to a temporary file in ``path``'s folder, flushed to disk, then renamed over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def name_of(step: int) -> str:
    return f"step-{step:06d}.pt"


def _step_of(name: str) -> int | None:
    """The RL step in a checkpoint's file name; -1 for the legacy ``last.pt`` (older than any numbered one)."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else (-1 if name == LEGACY else None)


def _newest_first(names) -> list[str]:
    return sorted((n for n in names if _step_of(n) is not None), key=_step_of, reverse=True)


def _remote(client, run_id: str):
    from gspo_bench.tracking.client import artifact_repository

    return artifact_repository(client, run_id)


def save(client, run_id: str, state: dict) -> str:
    """Write ``state`` as the run's newest checkpoint and drop all but the newest ``KEEP``; returns where it
    went."""
    name = name_of(int(state["rl_step"]))
    local = _local_dir(client.get_run(run_id).info.artifact_uri)
    if local is not None:
        atomic_save(state, local / name)
        for old in _newest_first(p.name for p in local.iterdir())[KEEP:]:
            (local / old).unlink(missing_ok=True)
        return str(local / name)
    with tempfile.TemporaryDirectory(prefix="gspo-bench-ckpt-") as d:
        atomic_save(state, Path(d) / name)
        client.log_artifact(run_id, str(Path(d) / name), ARTIFACT_DIR)
    names = [Path(a.path).name for a in client.list_artifacts(run_id, ARTIFACT_DIR)]
    for old in _newest_first(names)[KEEP:]:
        try:
            _remote(client, run_id).delete_artifacts(f"{ARTIFACT_DIR}/{old}")
        except Exception:  # a store without deletion keeps them; the newest still come first
            break
    return f"artifact {ARTIFACT_DIR}/{name} of run {run_id}"


def discard(client, run_id: str) -> None:
    """Delete a FINISHED run's checkpoints (nothing is left to resume): the files on local disk, or the remote
    artifacts where the artifact store can delete (a tracking server's proxied artifacts can); elsewhere they
    stay."""
    local = _local_dir(client.get_run(run_id).info.artifact_uri)
    if local is not None:
        if local.is_dir():
            for name in _newest_first(p.name for p in local.iterdir()):
                (local / name).unlink(missing_ok=True)
        return
    try:
        _remote(client, run_id).delete_artifacts(ARTIFACT_DIR)
    except Exception:  # a store without deletion (or without the artifact): leave it
        pass


def verify(state, config_hash: str | None = None, settings: dict | None = None) -> str | None:
    """Why ``state`` (a loaded checkpoint) cannot resume a run with settings digest ``config_hash``, or None
    when it can. ``settings``, the run's hashed settings, name the keys that differ from the checkpoint's."""
    if not isinstance(state, dict):
        return f"not a gspo-bench checkpoint (it holds a {type(state).__name__})"
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        return f"not a whole checkpoint: missing {', '.join(missing)}"
    if state["version"] != VERSION:
        return f"format version {state['version']!r}; this gspo-bench reads version {VERSION}"
    step = state["rl_step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"rl_step {step!r} is not an RL step"
    if config_hash is not None and state["config_hash"] != config_hash:
        theirs = state.get("settings") or {}
        if settings and theirs:
            diff = [f"{k} {theirs.get(k, '(unset)')!r} here {settings.get(k, '(unset)')!r}"
                    for k in sorted(set(theirs) | set(settings)) if theirs.get(k) != settings.get(k)]
            return f"written with other settings: {'; '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}"
        return f"written with other settings (digest {state['config_hash']}, this run's {config_hash})"
    return None


def read(path: Path):
    """``torch.load`` of a checkpoint file; a file that does not unpickle raises ``ValueError`` saying why."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, empty, random bytes, a pickle of arbitrary objects
        first = (str(e).strip().splitlines() or [""])[0][:200]
        what = "empty file" if path.stat().st_size == 0 else f"{type(e).__name__}: {first}"
        raise ValueError(f"unreadable ({what})") from None


def load(client, run_id: str, config_hash: str | None = None, settings: dict | None = None
         ) -> tuple[dict | None, list[tuple[str, str]]]:
    """The run's newest usable checkpoint (or None) and ``(file name, reason)`` for each newer one that is not
    (``verify``); ``(None, [])`` when the run has no checkpoint at all."""
    local = _local_dir(client.get_run(run_id).info.artifact_uri)
    problems: list[tuple[str, str]] = []
    if local is not None:
        names = _newest_first(p.name for p in local.iterdir()) if local.is_dir() else []
        fetch = lambda name: local / name  # noqa: E731
        tmp = None
    else:
        try:
            names = _newest_first(Path(a.path).name for a in client.list_artifacts(run_id, ARTIFACT_DIR))
        except Exception:  # a store that cannot list: no checkpoint
            names = []
        tmp = tempfile.TemporaryDirectory(prefix="gspo-bench-ckpt-")
        fetch = lambda name: Path(client.download_artifacts(run_id, f"{ARTIFACT_DIR}/{name}", tmp.name))  # noqa
    try:
        for name in names:
            try:
                state = read(fetch(name))
            except ValueError as e:
                problems.append((name, str(e)))
                continue
            why = verify(state, config_hash, settings)
            if why is None:
                return state, problems
            problems.append((name, why))
        return None, problems
    finally:
        if tmp is not None:
            tmp.cleanup()


class Checkpointer:
    """The module's checkpoints: restored at its start (``PolicyModule.on_train_start``), and at the end of each
    step (``PolicyModule.on_train_batch_end``) a heartbeat, a checkpoint every
    ``every`` steps, and on a pending SIGINT/SIGTERM a checkpoint and ``interrupts.Interrupted``."""

    def __init__(self, client, run_id: str, every: int, digest: str, elapsed_before: float = 0.0, log=print,
                 settings: dict | None = None):
        self.client, self.run_id, self.every, self.digest, self.log = client, run_id, every, digest, log
        self.settings = settings or {}
        self.clock, self.t0, self.before = time.perf_counter, time.perf_counter(), elapsed_before
        self.saved_step: int | None = None

    def restore(self, module, state: dict) -> None:
        """Put a checkpoint back into ``module`` (``restore``), at its ``on_train_start``."""
        restore(module, state)

    def elapsed(self) -> float:
        return self.before + self.clock() - self.t0

    def save(self, module) -> None:
        save(self.client, self.run_id, capture(module, self.elapsed(), self.digest, self.settings))
        self.saved_step = module.rl_step
        self.client.set_tag(self.run_id, "gspo_bench.checkpoint_step", str(module.rl_step))

    def after_step(self, module) -> None:
        import signal

        from gspo_bench.train import interrupts

        last = module.rl_step >= module.cfg.train.steps  # the run is about to end: nothing left to resume
        signum = interrupts.requested()
        if module.world > 1:  # the ranks stop at the same step, or the others would wait for it forever
            stop = not collectives.all_true(signum is None, module.device)  # NCCL: a device tensor
            signum = (signum or signal.SIGTERM) if stop else None
        if self.run_id is None:  # a rank other than 0: rank 0 keeps the run's checkpoint and heartbeat
            if signum is not None and not last:
                raise interrupts.Interrupted(signum, f"at RL step {module.rl_step}")
            return
        self.client.set_tag(self.run_id, "gspo_bench.heartbeat", f"{time.time():.0f}")
        if not last and (signum is not None or (self.every and module.rl_step % self.every == 0)):
            self.save(module)
        if signum is not None and not last:
            exc = interrupts.Interrupted(signum, f"at RL step {module.rl_step}")
            exc.checkpoint_step = self.saved_step
            raise exc
