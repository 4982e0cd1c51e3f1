"""How a run stops on SIGINT (Ctrl-C) or SIGTERM (a scheduler's notice): cleanly, and said.

There are two moments, and each has its own handler:

* **Inside the training loop**, `StopFlag`: the handler only records the signal. The loop
  finishes the step in progress, saves a checkpoint and returns, and `train`'s result says
  `interrupted`; the same command with --resume continues the run exactly. Under DDP, a
  signal that reaches one rank stops them all at the same step (engine.py tells the others
  through the step's all-reduce).
* **Outside it**, in a script (`StopOnSignals`): reading data, building the model, writing
  final/. The script stops where it is, as Ctrl-C stops any Python program, but with one
  line instead of a traceback and the exit status 128 + N (cli.py).

A script's first lines hold both signals back (`signal.pthread_sigmask`) while Python
imports torch, so that a Ctrl-C then is not lost in an import; `StopOnSignals.let_through`
lets them through once the script can take them.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional


# The signals that stop a script cleanly; a script's first lines hold them back while Python
# imports torch (see the module docstring).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Stopped(Exception):
    """A run stopped by a signal after saving its checkpoint: exit status 128 + `signal`."""

    def __init__(self, signal: int, step: int) -> None:
        super().__init__(f"stopped by signal {signal} at step {step}")
        self.signal, self.step = signal, step


class Interrupted(BaseException):
    """SIGINT or SIGTERM outside the training loop: the script stops where it is.

    A BaseException, as KeyboardInterrupt is, so that no `except Exception` on the way
    takes it for an error, and every `finally` and cleanup on the way still runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signum


class StopOnSignals:
    """`with StopOnSignals() as signals:` SIGINT and SIGTERM raise `Interrupted` in the
    main thread, and `signals.received` is the signal.

    Only the first signal raises: a second one (an impatient Ctrl-C) would otherwise cut
    short the clean-up the first set off; and none does once the script's outcome is
    decided (`settle()`), while it says so and leaves. The training loop puts its own
    handlers in place for its steps (`StopFlag`) and these back after them.
    `let_through()`, called inside the `try` that handles `Interrupted`, lets through the
    signals a script's first lines held back, so that a Ctrl-C while Python imported torch
    stops the script there."""

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
    """Set by SIGTERM / SIGINT; the loop finishes its step, saves and returns. Not `enabled`
    (TrainConfig.handle_signals off), it installs nothing and the process's handlers act."""

    def __init__(self, enabled: bool = True) -> None:
        self.signal: Optional[int] = None
        self.enabled = enabled
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopFlag":
        for sig in STOP_SIGNALS if self.enabled else ():
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
