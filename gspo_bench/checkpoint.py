"""Checkpoints for an exact ``run --resume``: what they hold, where they live, how they are written.

A checkpoint is taken at the end of an RL step (after that step's evaluation, if any), every
``train.checkpoint_every`` steps and when a signal stops the run. It holds everything the rest of the run
depends on, so a resumed run continues bit for bit on CPU:

- the module's weights (policy, PPO's critic; not the frozen reference, which the warm start rebuilds) and
  every optimiser's state;
- ``rl_step`` and the module's records (first/last metrics, the eval history);
- the datamodule's position (the next RL step; prompts of step ``s`` are seeded by ``(seed, s)``) and the
  sampler's queue of past policies (``rollout.staleness``); dynamic sampling fills each step within that
  step, so it carries nothing over;
- every callback's ``state_dict()`` (the collapse detector's running means, bests and events);
- the RNG states (torch, CUDA, Python, NumPy), restored just before the next rollout samples;
- the wall time spent so far.

Where: next to the run, ``<run's artifact dir>/checkpoint/last.pt`` when the artifact store is a local
directory (the default for a ``sqlite:///`` store); otherwise written to a local temporary file and logged
as the run's artifact ``checkpoint/last.pt``. Either way only the last one is kept, and a local one is
deleted when the run finishes (nothing is left to resume). Writes are atomic: the
file is written under a temporary name, flushed, then renamed over the old one, so a kill at any moment
leaves the previous checkpoint or the new one, never half of one.

Format: ``torch.save`` of plain containers, tensors and numbers only, loaded with ``weights_only=True``
(no arbitrary unpickling).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

VERSION = 1
ARTIFACT_DIR, FILENAME = "checkpoint", "last.pt"


# -- what a checkpoint holds --------------------------------------------------------------------------------------
def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def capture(module, elapsed_s: float, config_hash: str) -> dict:
    """The state of a run at the end of its RL step ``module.rl_step`` (see the module docstring)."""
    trainer, dm = module.trainer, module.trainer.datamodule
    return {
        "version": VERSION, "config_hash": config_hash, "rl_step": module.rl_step, "elapsed_s": float(elapsed_s),
        "weights": {k: v.detach().cpu() for k, v in module.state_dict().items() if not k.startswith("ref.")},
        "optimizers": [opt.optimizer.state_dict() for opt in module.optimizer_list()],
        "records": module.records_state(),
        "sampler": dm.sampler.state_dict(), "verify_timeouts": dm.timeouts,
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks if cb.state_dict()},
        "rng": rng_state(),
    }


def restore(module, state: dict) -> None:
    """Put ``state`` back into a module whose trainer has set up its optimisers (``on_train_start``)."""
    trainer, dm = module.trainer, module.trainer.datamodule
    missing, unexpected = module.load_state_dict(state["weights"], strict=False)
    if unexpected or [k for k in missing if not k.startswith("ref.")]:
        raise RuntimeError(f"the checkpoint does not fit this model (missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]})")
    for opt, sd in zip(module.optimizer_list(), state["optimizers"], strict=True):
        opt.optimizer.load_state_dict(sd)
    module.load_records_state(state["records"])
    dm.sampler.load_state_dict(state["sampler"])
    dm.timeouts = int(state["verify_timeouts"])
    for cb in trainer.callbacks:
        if cb.state_key in state["callbacks"]:
            cb.load_state_dict(state["callbacks"][cb.state_key])
    # the RNG goes back right before the next rollout samples: Lightning draws from it when it makes the
    # dataloader's iterator, which an uninterrupted run did once, at step 0
    dm.resume_rng = state["rng"]


# -- where it lives ----------------------------------------------------------------------------------------------
def _local_dir(artifact_uri: str) -> Path | None:
    from mlflow.utils.uri import is_local_uri

    if not is_local_uri(artifact_uri, is_tracking_or_registry_uri=False):
        return None
    from mlflow.utils.file_utils import local_file_uri_to_path

    return Path(local_file_uri_to_path(artifact_uri)) / ARTIFACT_DIR


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


def save(client, run_id: str, state: dict) -> str:
    """Write ``state`` as the run's last checkpoint; returns where it went."""
    local = _local_dir(client.get_run(run_id).info.artifact_uri)
    if local is not None:
        atomic_save(state, local / FILENAME)
        return str(local / FILENAME)
    with tempfile.TemporaryDirectory(prefix="gspo-bench-ckpt-") as d:
        atomic_save(state, Path(d) / FILENAME)
        client.log_artifact(run_id, str(Path(d) / FILENAME), ARTIFACT_DIR)
    return f"artifact {ARTIFACT_DIR}/{FILENAME} of run {run_id}"


def discard(client, run_id: str) -> None:
    """Delete a FINISHED run's checkpoint (nothing is left to resume): the file on local disk, or the remote
    artifact where the artifact store can delete (a tracking server's proxied artifacts can); elsewhere it
    stays."""
    uri = client.get_run(run_id).info.artifact_uri
    local = _local_dir(uri)
    if local is not None:
        (local / FILENAME).unlink(missing_ok=True)
        return
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    try:
        get_artifact_repository(uri, tracking_uri=client.tracking_uri).delete_artifacts(ARTIFACT_DIR)
    except Exception:  # a store without deletion (or without the artifact): leave it
        pass


def load(client, run_id: str) -> dict | None:
    """The run's last checkpoint, or None when it has none."""
    local = _local_dir(client.get_run(run_id).info.artifact_uri)
    if local is not None:
        path = local / FILENAME
        return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None
    with tempfile.TemporaryDirectory(prefix="gspo-bench-ckpt-") as d:
        try:
            got = client.download_artifacts(run_id, f"{ARTIFACT_DIR}/{FILENAME}", d)
        except Exception:  # no such artifact (the store's error type varies)
            return None
        return torch.load(got, map_location="cpu", weights_only=True)


class Checkpointer:
    """The module's end-of-step duty (``PolicyModule.on_train_batch_end``): a heartbeat, a checkpoint every
    ``every`` steps, and on a pending SIGINT/SIGTERM a checkpoint and ``interrupts.Interrupted``."""

    def __init__(self, client, run_id: str, every: int, digest: str, elapsed_before: float = 0.0, log=print):
        self.client, self.run_id, self.every, self.digest, self.log = client, run_id, every, digest, log
        self.clock, self.t0, self.before = time.perf_counter, time.perf_counter(), elapsed_before
        self.saved_step: int | None = None

    def elapsed(self) -> float:
        return self.before + self.clock() - self.t0

    def save(self, module) -> None:
        save(self.client, self.run_id, capture(module, self.elapsed(), self.digest))
        self.saved_step = module.rl_step
        self.client.set_tag(self.run_id, "gspo_bench.checkpoint_step", str(module.rl_step))

    def after_step(self, module) -> None:
        import signal

        from gspo_bench import distributed, interrupts

        last = module.rl_step >= module.cfg.train.steps  # the run is about to end: nothing left to resume
        signum = interrupts.requested()
        if module.world > 1:  # the ranks stop at the same step, or the others would wait for it forever
            stop = not distributed.all_true(signum is None, module.device)  # NCCL: a device tensor
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
