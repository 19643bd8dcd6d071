"""SIGINT (Ctrl-C) and SIGTERM (``kill``, a pre-empted SLURM job): stop cleanly, never with a traceback.

``handle_signals()`` installs one handler for both signals for the life of a command. Outside an RL run
(warm start, loading, writing a report) a signal raises ``Interrupted`` at once: nothing there is worth
saving, and the command prints one line and exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM).
Inside ``deferred()`` (``trainer.fit``) the first signal only sets ``requested``: the module finishes the
step it is in, saves a checkpoint, and raises ``Interrupted`` itself (``PolicyModule.on_train_batch_end``);
the run is marked KILLED and the command tells how to resume. A signal that lands after the last step
lets that run finish, and ``check()`` stops the command before the next one. A second signal abandons the step at once
(the last periodic checkpoint stays the resume point).

``Interrupted`` derives from ``BaseException``, like ``KeyboardInterrupt``: the ``except Exception``
blocks that keep one failed algorithm from ending a benchmark must not swallow it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass, field

NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class Interrupted(BaseException):
    """A command stopped by a signal; ``results`` are the runs that ended before it (``runner.RunResult``)."""

    def __init__(self, signum: int, where: str = ""):
        super().__init__(f"{NAMES.get(signum, signum)}{' ' + where if where else ''}")
        self.signum, self.where = signum, where
        self.results: list = []
        self.checkpoint_step: int | None = None  # the step the interrupted run can resume from

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)

    @property
    def name(self) -> str:
        return NAMES.get(self.signum, f"signal {self.signum}")


@dataclass
class _State:
    requested: int | None = None  # the first signal received while deferring
    deferring: int = 0
    echo: object = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))


STATE = _State()


def requested() -> int | None:
    """The signal waiting to end the current RL run at its step boundary, if any."""
    return STATE.requested


def _handler(signum, frame) -> None:
    if STATE.deferring and STATE.requested is None:
        STATE.requested = signum
        STATE.echo(f"\n{NAMES.get(signum, signum)}: finishing this RL step, then a checkpoint and a clean stop "
                   f"(send it again to stop at once)")
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def handle_signals(echo=None):
    """For the life of a command: SIGINT and SIGTERM end it through ``Interrupted``, never a traceback."""
    previous = {s: signal.getsignal(s) for s in NAMES}
    STATE.requested, STATE.deferring = None, 0
    if echo is not None:
        STATE.echo = echo
    try:
        for s in NAMES:
            signal.signal(s, _handler)
    except ValueError:  # not the main thread (a test calling main() from a worker thread): leave them be
        previous = {}
    try:
        yield STATE
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        STATE.requested = None


@contextlib.contextmanager
def deferred():
    """Inside an RL run: a first signal waits for the end of the step (see the module docstring)."""
    STATE.deferring += 1
    try:
        yield
    finally:
        STATE.deferring -= 1


def check(results: list | None = None, where: str = "") -> None:
    """Between runs: raise ``Interrupted`` for a signal that arrived too late to end a step (the last eval)."""
    if STATE.requested is not None:
        exc = Interrupted(STATE.requested, where)
        exc.results = list(results or [])
        raise exc
