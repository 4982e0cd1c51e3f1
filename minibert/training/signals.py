"""How a run stops on SIGINT (Ctrl-C) or SIGTERM (a scheduler's notice): cleanly, and said.

Inside the training loop `StopFlag` only records the signal: the loop finishes its step,
saves a checkpoint and returns, and --resume continues the run exactly (under DDP every rank
stops at the same step, engine.py). Outside it `StopOnSignals` stops a script where it is,
with one line rather than a traceback and the exit status 128 + N (`cli`).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Stopped(Exception):
    """A run stopped by a signal after saving its checkpoint: exit status 128 + `signal`."""

    def __init__(self, signal: int, step: int) -> None:
        super().__init__(f"stopped by signal {signal} at step {step}")
        self.signal, self.step = signal, step


class Interrupted(BaseException):
    """SIGINT or SIGTERM outside the training loop: a BaseException, as KeyboardInterrupt
    is, so that no `except Exception` takes it for an error, and every `finally` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signum


class StopOnSignals:
    """`with StopOnSignals() as signals:` SIGINT and SIGTERM raise `Interrupted` in the main
    thread (`signals.received`): only the first (a second Ctrl-C would cut short the
    clean-up), and none once `settle()`d. `let_through()` releases the signals a script's
    first lines held back (`signal.pthread_sigmask`) while Python imported torch."""

    def __enter__(self) -> "StopOnSignals":
        self.received: Optional[int] = None
        self._settled = False
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # else signals are not ours
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._raise)
        return self

    def let_through(self) -> None:
        if self._previous and hasattr(signal, "pthread_sigmask"):  # not on Windows
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def settle(self) -> None:
        self._settled = True

    def _raise(self, signum: int, frame: Any) -> None:
        if self.received is None and not self._settled:
            self.received = signum
            raise Interrupted(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class StopFlag:
    """Set by SIGTERM / SIGINT: the loop finishes its step, saves and returns (if `enabled`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.signal: Optional[int] = None
        self.enabled = enabled
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopFlag":
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:  # off the main thread, signals are not ours to take
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
