"""Verifier calls under a time limit: a completion that takes a verifier too long scores 0, never hangs a run.

A pure-Python verifier cannot be stopped from another thread, and a signal cannot stop one C call (Python's
``9**9**9**9`` is one). So the calls run in a worker process: ``VerifierSandbox.score`` sends the batch to it
and gives each completion at most ``timeout`` seconds. The worker writes each reward into shared memory and
counts the completions done there (one message per batch, not per completion: pipe round trips cost more
than an exact-match verifier); the parent watches that count, and when it stops moving for ``timeout``, the
worker is killed, the completion it was on scores 0 and counts as a timeout, and a fresh worker takes the
rest of the batch. The worker is
forked (where the platform can), so verifiers registered at run time exist in it too; it ignores SIGINT
(the parent decides what a Ctrl-C does), exits when the parent's end of the pipe closes (even after a
``kill -9`` of the parent: it closes its inherited copy of that end first), and holds none of the parent's
standard streams: they go to ``/dev/null``, so no completion is ever echoed (``math-verify`` logs the input
of every timeout) and a reader of the parent's output gets its EOF when the parent ends.

``timeout = 0`` calls the verifier in this process, without a limit.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time

DEFAULT_TIMEOUT = 1.0  # seconds per completion (``rollout.verify_timeout``)
CHUNK = 8192  # completions per message to the worker (the shared result buffer's size)
WATCH_S = 0.05  # how often the parent looks at the worker's progress while it waits
STARTUP_TIMEOUT = 120.0  # seconds a new worker may take to be ready (a loaded 2-core machine, a spawn start)


def _serve(conn, parent_end, verifier: str, params: dict, rewards, progress) -> None:
    """The worker: score (completion, answer) pairs in order into ``rewards``, counting them in ``progress``;
    then one message for the batch."""
    # a forked worker holds copies of the parent's descriptors: drop the parent's end of the pipe, so the
    # parent's death (even a kill -9) reaches this end as EOF, and its stdin/stdout/stderr, so a reader of
    # the parent's output is not kept waiting by this process
    parent_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    logging.disable(logging.CRITICAL)
    from gspo_bench.tasks.verifiers import VERIFIERS

    fn = VERIFIERS[verifier]
    conn.send(("ready", None))
    while True:
        try:
            completions, answers = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        for k, (c, a) in enumerate(zip(completions, answers)):
            try:
                rewards[k] = float(fn(c, a, **params))
            except Exception as e:  # a verifier raising is a data bug (a malformed answer): the parent says so
                conn.send(("error", f"{type(e).__name__}: {e}"[:300]))
                break
            progress.value = k + 1  # after the reward: the parent reads rewards[:progress] only
        else:
            conn.send(("done", len(completions)))


class VerifierSandbox:
    """``score(completions, answers) -> (rewards, timeouts)`` through a worker process (see the module)."""

    def __init__(self, verifier: str, params: dict | None = None, timeout: float = DEFAULT_TIMEOUT):
        if not (isinstance(timeout, (int, float)) and timeout >= 0):
            raise ValueError(f"verifier timeout must be a number of seconds >= 0, got {timeout!r}")
        self.verifier, self.params, self.timeout = verifier, dict(params or {}), float(timeout)
        self.timeouts = 0  # over the sandbox's life
        self._proc = self._conn = None
        self._warm = False
        methods = mp.get_all_start_methods()
        self._ctx = mp.get_context("fork" if "fork" in methods else "spawn")
        # shared with every worker: the batch's rewards and how many are done (written by the worker only)
        self._rewards = self._ctx.RawArray("d", CHUNK)
        self._progress = self._ctx.RawValue("q", 0)

    def _warm_up(self) -> None:
        """One trivial call here first, so every forked worker starts with the verifier's imports done
        (``math-verify`` loads sympy on its first call, which can take longer than the limit)."""
        from gspo_bench.tasks.verifiers import VERIFIERS

        try:
            VERIFIERS[self.verifier]("0", "0", **self.params)
        except Exception:  # the call is only for its imports
            pass
        self._warm = True

    def _start(self) -> None:
        if not self._warm and self._ctx.get_start_method() == "fork":
            self._warm_up()
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, parent, self.verifier, self.params, self._rewards,
                                                            self._progress), daemon=True,
                                       name=f"gspo-bench-verifier-{self.verifier}")
        self._proc.start()
        child.close()
        self._conn = parent
        # start-up (a spawned worker imports gspo_bench) is not a completion's time: wait for it apart
        if not parent.poll(STARTUP_TIMEOUT) or parent.recv()[0] != "ready":
            self.close()
            raise RuntimeError(f"the verifier worker for {self.verifier!r} did not start within {STARTUP_TIMEOUT:.0f} s")

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _direct(self, completions: list[str], answers: list[str]) -> tuple[list[float], int]:
        from gspo_bench.tasks.verifiers import VERIFIERS

        fn = VERIFIERS[self.verifier]
        return [float(fn(c, a, **self.params)) for c, a in zip(completions, answers)], 0

    def score(self, completions: list[str], answers: list[str]) -> tuple[list[float], int]:
        """Each completion's reward (0 past the limit) and how many timed out."""
        if self.timeout == 0:
            return self._direct(completions, answers)
        n, out, late, i = len(completions), [], 0, 0
        while i < n:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            batch = min(n - i, CHUNK)
            self._progress.value = 0
            self._conn.send((completions[i:i + batch], answers[i:i + batch]))
            done, ok = self._wait(batch, answers, i)
            out.extend(self._rewards[:done])
            i += done
            if not ok:  # completion i is past its limit: the worker was killed; 0, and go on with the rest
                out.append(0.0)
                late, i = late + 1, i + 1
        self.timeouts += late
        return out, late

    def _wait(self, batch: int, answers: list[str], start: int) -> tuple[int, bool]:
        """(completions of the batch done, False when the next one ran past the limit and the worker was killed)."""
        seen, since = 0, time.monotonic()
        while True:
            if self._conn.poll(WATCH_S):
                kind, value = self._conn.recv()
                if kind == "error":
                    k = start + self._progress.value
                    raise ValueError(f"verifier {self.verifier!r} failed on the answer {answers[k][:200]!r}: {value}")
                return batch, True
            done = self._progress.value
            if done > seen:  # the limit is per completion: it restarts when one finishes
                seen, since = done, time.monotonic()
            elif time.monotonic() - since > self.timeout:
                self.close()
                return self._progress.value, False
