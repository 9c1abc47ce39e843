"""A grading command stopped by a signal ends what it started, and says so.

Slurm (at a job's time limit, or ``scancel``) and ``timeout`` send SIGTERM; a person at the
terminal sends SIGINT (Ctrl-C). Python's default for SIGTERM is to die at once: no ``finally`` runs,
so a submission's sandbox lived on (its kernel's parent is ``timeout``, not the grader, so bwrap's
``--die-with-parent`` never fired), its tmpfs stayed mounted and no CSV was written. Under
:func:`on_signals` both signals raise :class:`Stopped` in the main thread instead, once: every
``finally`` on the way out runs (the submission's cgroup killed, its folders unmounted), and the
command records what it decided and what it did not before it exits with ``128 + signal``.

nbgrader runs an app under a bare ``except:`` (``nbgrader.utils.capture_log``), which would swallow
the exception raised inside it: :func:`check` raises it again where the app has returned.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STATE = {"signum": None}


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal (``signum``); ``grades`` holds what was decided so far."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.grades: list = []

    @property
    def exit_code(self) -> int:
        """The shell's convention for a command ended by a signal: 128 + its number."""
        return 128 + self.signum


def stopped_by() -> int | None:
    """The signal that stopped this command (None while none has)."""
    return _STATE["signum"]


def check() -> None:
    """Raise :class:`Stopped` if a signal has stopped this command (where something swallowed it)."""
    if _STATE["signum"] is not None:
        raise Stopped(_STATE["signum"])


def _handler(signum, frame):
    first = _STATE["signum"] is None
    _STATE["signum"] = _STATE["signum"] or signum
    if first:
        print(f"\n{signal.Signals(signum).name}: stopping: ending this batch's sandboxes, then writing "
              "what was decided", file=sys.stderr, flush=True)
        raise Stopped(signum)
    # a second signal while the first is handled: the cleanup it interrupts would leave more behind


@contextlib.contextmanager
def on_signals():
    """SIGINT and SIGTERM raise :class:`Stopped` in this block (main thread only; elsewhere, or
    nested, it does nothing). The handlers in place before come back after it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _handler:
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _STATE["signum"] = None
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
