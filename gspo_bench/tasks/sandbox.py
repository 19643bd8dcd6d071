"""Verifier calls under a time limit: a completion that takes a verifier too long scores 0, never hangs a run.

A pure-Python verifier cannot be stopped from another thread, and a signal cannot stop one C call (Python's
``9**9**9**9`` is one). So the calls run in a worker process: ``VerifierSandbox.score`` sends the batch to it
and waits for each result at most ``timeout`` seconds. When one is late, the worker is killed, that
completion scores 0 and counts as a timeout, and a fresh worker takes the rest of the batch. The worker is
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

DEFAULT_TIMEOUT = 1.0  # seconds per completion (``rollout.verify_timeout``)
STARTUP_TIMEOUT = 120.0  # seconds a new worker may take to be ready (a loaded 2-core machine, a spawn start)


def _serve(conn, parent_end, verifier: str, params: dict) -> None:
    """The worker: score (completion, answer) pairs in order, one message per result."""
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
        for c, a in zip(completions, answers):
            try:
                conn.send(("ok", float(fn(c, a, **params))))
            except Exception as e:  # a verifier raising is a data bug (a malformed answer): the parent says so
                conn.send(("error", f"{type(e).__name__}: {e}"[:300]))
                break


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
        self._proc = self._ctx.Process(target=_serve, args=(child, parent, self.verifier, self.params), daemon=True,
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
            self._conn.send((completions[i:], answers[i:]))
            while i < n:
                if not self._conn.poll(self.timeout):  # completion i is past its limit: kill, 0, go on
                    self.close()
                    out.append(0.0)
                    late, i = late + 1, i + 1
                    break
                kind, value = self._conn.recv()
                if kind == "error":
                    raise ValueError(f"verifier {self.verifier!r} failed on the answer {answers[i][:200]!r}: {value}")
                out.append(value)
                i += 1
        self.timeouts += late
        return out, late
