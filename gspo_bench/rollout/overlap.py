"""Asynchronous rollouts: the producer in a process of its own, sampling while the trainer trains, under bounded
staleness (``rollout.max_staleness = K > 0``; ``K = 0`` is the synchronous loop of ``datamodule.py``).

The worker (``_serve``, started with ``spawn``) builds its own copy of the policy from the run's model folder,
its own engine from the registry and its own ``producer.RolloutProducer``, and is pinned to its share of the
CPU cores. The trainer side (``OverlappedRollouts``) hands it the policy's weights after every RL step, tagged
with their version (a copy in shared memory; ``rollout.sync_every`` thins the hand-overs), and takes the
rollouts it made, in order, from a bounded queue.

Staleness. A response the trainer trains on at version ``v_train`` has staleness ``v_train - v``, ``v`` the
version of its oldest token. Without partial rollouts every token of a rollout carries the version it was
started with; with them (``rollout.partial``) weights that arrive while the worker generates are loaded between
two decode steps and the responses under way continue under them, so a response can span versions and its
later tokens are fresher than its first. ``rollout.stale_policy`` (on the version a rollout was started with):

- ``wait``: the worker samples rollout ``s`` only once it holds weights of version ``s - K`` or newer, so no
  rollout is ever more than ``K`` versions old and the trainer's step ``s`` trains on rollout ``s`` (the
  prompts of step ``s``, as in the synchronous loop);
- ``drop``: the worker samples with whatever weights it holds, without waiting; the trainer drops a rollout
  more than ``K`` versions old (counted in ``async/dropped_frac``) and takes the next, so its steps train on
  later rollouts' prompts.

Each completion draws from its own generator, seeded from its key (the worker samples as ``rollout.seeding:
request`` whatever the setting, and never touches torch's global generator), so a rollout's tokens depend on
its key and the weights it was sampled with, not on timing or on a restart.

Faults. A worker that dies stops the run with one line naming it and its exit code, instead of a trainer that
waits forever. A run resumed after a kill (of either process) starts a new worker from the checkpoint's
weights: the rollouts in flight when it stopped are sampled again, never counted twice.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from gspo_bench.config import RolloutConfig

POLL_S = 0.2  # how often a waiting side looks whether the other is still alive


@dataclass
class WorkerSpec:
    """What the worker builds its producer from (everything picklable)."""

    task: object
    tokenizer: object
    settings: RolloutConfig
    seed: int
    model_dir: str
    record_routes: bool
    group_advantages: bool
    sampler_logp: bool
    start_step: int
    steps: int
    cores: tuple[int, ...]
    verifier: object = None
    """The task's verifier function (by reference: the worker imports its module), for one registered in this
    process only (a script's own, a test's)."""
    episodes: object = None
    """How a multi-turn environment is played (``episodes.Episodes``); None: single-turn."""


def split_cores() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the trainer's cores, the worker's): the cores this process may use, the second half to the worker (one
    core alone is shared)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if len(cores) < 2:
        return tuple(cores), tuple(cores)
    half = len(cores) // 2
    return tuple(cores[:half]), tuple(cores[half:])


def _serve(spec: WorkerSpec, weights: mp.Queue, out: mp.Queue, stop, busy) -> None:
    """The worker's loop: take the newest weights, sample the next rollout when the staleness rule allows, put
    it in the queue (blocking while it is full)."""
    from transformers import AutoModelForCausalLM

    from gspo_bench.rollout.draws import StreamDraws
    from gspo_bench.rollout.engines import EngineSetup
    from gspo_bench.rollout.producer import EngineHandle, RolloutProducer

    parent = mp.parent_process()
    stop = _Stop(stop, parent)  # the trainer's process gone (killed) counts as a stop
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec.cores)
    torch.set_num_threads(max(1, len(spec.cores)))
    from gspo_bench.tasks.verifiers import VERIFIERS

    if spec.verifier is not None:  # the task's verifier, where it was registered in the trainer's process only
        VERIFIERS.setdefault(spec.task.spec.verifier, spec.verifier)
    # every completion from its own generator, keyed by (seed, step, round, row), whatever rollout.seeding says:
    # a stream here would depend on this process's history, and a resumed run could not sample the same again
    s = dataclasses.replace(spec.settings, seeding="request")
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32).eval()
    setup = EngineSetup(s, seed=spec.seed, model_dir=spec.model_dir, record_routes=spec.record_routes,
                        prompts=lambda: [*spec.task.train["prompt"], *spec.task.eval["prompt"]],
                        max_prompt_tokens=spec.task.spec.max_prompt_tokens)
    handle = EngineHandle(s, spec.tokenizer, seed=spec.seed, kind="train", engine=None, setup=setup,
                          stream=StreamDraws())
    producer = RolloutProducer(spec.task, spec.tokenizer, s, seed=spec.seed, handle=handle, model=model,
                               record_routes=spec.record_routes, group_advantages=spec.group_advantages,
                               sampler_logp=spec.sampler_logp, episodes=spec.episodes)
    have = -1  # the version of the weights it holds; -1: none yet
    synced: dict[str, float] = {}  # the last hand-over's seconds, from the trainer's copy to the worker's load
    if s.partial:  # between two decode steps: newer weights if any came, and the responses continue under them
        producer.refresh = lambda: take_weights(block=False)

    def take_weights(block: bool) -> bool:
        nonlocal have
        got = False
        while True:
            try:
                version, state, sent = weights.get(block=block and not got, timeout=POLL_S)
            except queue.Empty:
                return got
            producer.sync_weights(state, version)
            synced["time/weight_sync_s"] = time.time() - sent
            have, got = version, True

    index = spec.start_step
    limit = spec.steps if s.stale_policy == "wait" else None
    while not stop.is_set() and (limit is None or index < limit):
        take_weights(block=have < 0)
        while s.stale_policy == "wait" and have < index - s.max_staleness and not stop.is_set():
            take_weights(block=True)  # bounded staleness: wait for weights of version index - K
        if stop.is_set():
            break
        busy[1] = time.time()  # generating since (the trainer reads both to measure the overlap)
        batch = producer.rollout(index)
        with busy.get_lock():
            busy[0], busy[1] = busy[0] + time.time() - busy[1], 0.0
        batch.stats.update(synced)
        synced.clear()
        while not stop.is_set():
            try:
                out.put((index, have, batch), timeout=POLL_S)
                break
            except queue.Full:
                continue
        index += 1
    # the trainer takes the last rollouts' tensors from this process (torch shares them by file descriptor, which
    # the receiver fetches from the sender): stay until told to stop
    while not stop.is_set():
        time.sleep(POLL_S)


class _Stop:
    """The worker's stop signal: the trainer set it, or the trainer's process is gone."""

    def __init__(self, event, parent):
        self.event, self.parent = event, parent

    def is_set(self) -> bool:
        return self.event.is_set() or (self.parent is not None and not self.parent.is_alive())


class ProducerDied(RuntimeError):
    """The rollout worker ended before the run did."""


class OverlappedRollouts:
    """The trainer's side of an asynchronous producer (see the module docstring): ``start`` the worker,
    ``sync_weights`` after each step, ``take`` each step's rollout, ``close`` at the end."""

    def __init__(self, spec: WorkerSpec):
        self.spec, self.s = spec, spec.settings
        ctx = mp.get_context("spawn")
        self.weights: mp.Queue = ctx.Queue()
        self.out: mp.Queue = ctx.Queue(maxsize=max(1, self.s.max_staleness))
        self.stop = ctx.Event()
        # [seconds the worker spent generating, when its current generation began (0: idle)]
        self.busy = ctx.Array("d", [0.0, 0.0])
        # not a daemon: it starts verifier workers of its own; it ends on ``stop``, or when this process is gone
        self.proc = ctx.Process(target=_serve, args=(spec, self.weights, self.out, self.stop, self.busy),
                                name="gspo-bench-rollout-producer")
        self.started = False
        self.last_sent = -1  # the newest version handed over
        self.trainer_threads: int | None = None  # the trainer's torch threads before the worker took its cores
        self.trainer_cores: set[int] | None = None
        self.taken = self.dropped = 0
        self.handed_tokens = 0.0  # response tokens of the rollout handed to the trainer last
        self.train_from: tuple[float, float] | None = None  # (when the trainer last began training, busy() then)

    def start(self) -> None:
        """Start the worker on its share of the cores, and keep the trainer to the rest while it runs."""
        self.proc.start()
        self.started = True
        trainer, worker = split_cores()
        if trainer != worker and hasattr(os, "sched_setaffinity"):
            self.trainer_cores, self.trainer_threads = os.sched_getaffinity(0), torch.get_num_threads()
            os.sched_setaffinity(0, trainer)
            torch.set_num_threads(len(trainer))

    def sync_weights(self, state: dict[str, torch.Tensor], version: int) -> float:
        """Hand the worker ``state`` (copied: the trainer goes on updating its own), tagged ``version``; the
        seconds the copy took."""
        if not self.started:
            self.start()
        # rollout.sync_every thins the hand-overs, but never so far that the worker could not go on (under wait
        # it needs version s - K for rollout s), nor the first
        due = version % max(1, self.s.sync_every) == 0 or version - self.last_sent > self.s.max_staleness
        if not due and self.last_sent >= 0:
            return 0.0
        self.last_sent = version
        t0 = time.perf_counter()
        copy = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        self.weights.put((version, copy, time.time()))
        return time.perf_counter() - t0

    def take(self, step: int):
        """The rollout RL step ``step`` (at version ``step``) trains on: the next in the queue not more than
        ``max_staleness`` versions old (older ones dropped under ``drop``), with its ``async/*`` statistics."""
        t_wait = time.perf_counter()
        trained = None if self.train_from is None else (time.time(), self.generating())
        depth = self.out.qsize() if hasattr(self.out, "qsize") else 0
        while True:
            try:
                index, version, batch = self.out.get(timeout=POLL_S)
            except (queue.Empty, OSError, EOFError):  # nothing yet, or a rollout its dead sender cannot hand over
                if not self.proc.is_alive():
                    raise ProducerDied(f"the rollout producer (pid {self.proc.pid}) died with exit code "
                                       f"{self.proc.exitcode} before RL step {step}'s rollout") from None
                continue
            self.taken += 1
            if step - version > self.s.max_staleness:  # only under drop: wait never samples that stale
                self.dropped += 1
                continue
            break
        # a response's staleness: this step's version minus its oldest token's (-1 marks no token)
        v = batch.versions.masked_fill(batch.versions < 0, step).min(-1).values
        stale = (step - v).float()
        spans = ((batch.versions >= 0) & (batch.versions != batch.versions.max(-1, keepdim=True).values)).any(-1)
        if trained is not None:
            (t0, busy0), (t1, busy1) = self.train_from, trained
            span = max(t1 - t0, 1e-9)
            # overlap: the share of the last step's training during which the worker was generating
            batch.stats["async/overlap"] = min(1.0, max(0.0, busy1 - busy0) / span)
            # the trainer's own rate: the last rollout's loss tokens over that training
            batch.stats["throughput/train_tokens_per_s"] = self.handed_tokens / span
        self.handed_tokens = float(batch.loss_mask.sum())
        batch.stats.update({
            "async/staleness_mean": float(stale.mean()), "async/staleness_max": float(stale.max()),
            # partial rollouts: the share of responses whose tokens came from more than one version
            "async/partial_frac": float(spans.float().mean()),
            "async/dropped_frac": self.dropped / max(self.taken, 1),
            "async/buffer_depth": float(depth), "time/wait_rollout_s": time.perf_counter() - t_wait,
        })
        self.train_from = (time.time(), self.generating())
        return batch

    def generating(self) -> float:
        """Seconds the worker has spent generating so far, the generation under way included."""
        with self.busy.get_lock():
            done, since = self.busy[0], self.busy[1]
        return done + (time.time() - since if since else 0.0)

    def close(self) -> None:
        """Stop the worker (it finishes nothing more) and wait for it a moment; then make sure it is gone."""
        if not self.started:
            return
        self.stop.set()
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        for q in (self.out, self.weights):
            q.cancel_join_thread()
            q.close()
        self.started = False
        if self.trainer_cores is not None:  # the trainer's cores and threads back as they were
            os.sched_setaffinity(0, self.trainer_cores)
            torch.set_num_threads(self.trainer_threads)
            self.trainer_cores = None
