"""Run directories: one training run at a time in each, and whether a run already lives there.

Two runs started with the same --out would otherwise both proceed, overwrite each other's
checkpoints and interleave their lines in metrics.jsonl. A script holds `RunLock(out)` for
the whole run, and the second run stops at once with `RunLockedError`, which names the first:

    with RunLock(args.out):
        if run_exists(args.out) and not args.resume: refuse to overwrite
        train(...)

Take the lock *before* looking at what the directory holds, so that the check and the writes
after it belong to the same run. Under torchrun only the main rank takes it (every rank of
one run shares the directory, and a second rank's lock would refuse its own run).

How it works: an exclusive, non-blocking `fcntl.flock` on `out/.lock`, a file that also
records the holder's process id, host and start time for the error message. The kernel owns
the lock, not the file: when the process ends, however it ends (kill -9 included), the lock
goes with it, so there is never a stale lock to delete by hand. A clean release empties the
file; a file that still names a holder while nobody holds the lock is what a killed run
leaves behind, and the next run takes it over and logs that the old holder is gone.

Limits, all of them the kernel's rules for flock:
* The lock belongs to the open file, so processes forked from the holder (DataLoader workers
  under the "fork" start method) share it and the lock ends when the last of them exits.
* On NFS, Linux emulates flock with POSIX byte-range locks, which needs a working lock daemon.
* Without fcntl (Windows) or on a filesystem that refuses locks, `RunLock` logs a warning and
  does nothing: runs go ahead as they did before this module existed.

The module needs only the standard library.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator, Optional, Union

try:
    import fcntl
except ImportError:  # Windows: see the module docstring
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# What a run leaves in its directory; a folder counts only when something is in it.
RUN_OUTPUTS = ("final/", "eval.json", "metrics.jsonl", "checkpoints/")


class RunLockedError(OSError):
    """Another live run holds the directory.

    An OSError, so that a script's existing `except OSError` prints it as one line. `holder`
    is what that run recorded: {"pid", "host", "started"}, or {} if it had not written yet.
    """

    def __init__(self, message: str, holder: Optional[dict] = None):
        super().__init__(message)
        self.holder = holder or {}


class RunLock:
    """An exclusive lock on a run directory for as long as a run uses it.

    `with RunLock(out_dir): ...` creates out_dir if needed, takes the lock or raises
    `RunLockedError`, and releases it on exit. `previous` is what a killed run had recorded
    in the lock file when this one took it over, else None.
    """

    def __init__(self, out_dir: Union[str, os.PathLike]):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self.previous: Optional[dict] = None
        self._fd: Optional[int] = None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            raise RuntimeError(f"this RunLock on {self.out_dir} is already held")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            log.warning("cannot lock %s on this platform (no fcntl): nothing stops another run "
                        "from using the same directory", self.out_dir)
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd, wait=True)
            os.close(fd)
            raise RunLockedError(_locked_message(self.out_dir, holder), holder) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("cannot lock %s (%s): nothing stops another run from using the same "
                        "directory", self.out_dir, e.strerror)
            return self
        # We hold the lock, so whoever wrote a non-empty file is no longer running.
        self.previous = _read_holder(fd) or None
        if self.previous:
            log.info("%s: the previous run (process %s on host %s) is gone; taking its lock "
                     "over", self.out_dir, self.previous.get("pid"), self.previous.get("host"))
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # empty = released cleanly; only a killed run leaves a record
        finally:
            os.close(fd)  # closing the file is what drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def run_exists(out_dir: Union[str, os.PathLike]) -> list[str]:
    """Which of RUN_OUTPUTS are in out_dir (folders only when not empty), in that order.

    Non-empty means a run lives there; the scripts use it to refuse to overwrite one.
    """
    out = Path(out_dir)
    found = []
    for name in RUN_OUTPUTS:
        path = out / name.rstrip("/")
        if name.endswith("/"):
            present = path.is_dir() and any(path.iterdir())
        else:
            present = path.exists()
        if present:
            found.append(name)
    return found


@contextlib.contextmanager
def open_run(out_dir: Union[str, os.PathLike], resume: bool, main: bool = True) -> Iterator[None]:
    """Hold `out_dir` for one run (the main rank locks it) and refuse to mix runs there.

    Without `resume`, the folder must hold no run (`run_exists`); with it, an intact
    checkpoint under `checkpoints/`. The lock is taken before looking, so the check and
    every write after it belong to this run alone. Other ranks (`main=False`) check nothing.
    """
    if not main:
        yield
        return
    # here, so the module alone stays stdlib-only
    from .checkpoint import checkpoint_written, latest_checkpoint

    out_dir = Path(out_dir)
    if resume and not out_dir.is_dir():  # said before the lock would make the folder
        raise FileNotFoundError(f"--resume: no intact checkpoint: {out_dir} does not exist, "
                                f"so it holds no run to continue; check --out, or start "
                                f"without --resume")
    with RunLock(out_dir):
        ckpts = out_dir / "checkpoints"
        resumable = latest_checkpoint(ckpts) is not None
        found = run_exists(out_dir)
        # A run stopped before its first checkpoint left a log but nothing to resume from:
        # say so, rather than send a fresh start to --resume and --resume back again.
        # (Checkpoints that are there but damaged are another matter: never advise deleting.)
        stuck = (f"; it saved no checkpoint, so it cannot be resumed: delete "
                 f"{', '.join(found)} in it to start again, or choose another --out"
                 if found and not checkpoint_written(ckpts) else "")
        if resume and not resumable:
            raise FileNotFoundError(f"--resume: no intact checkpoint in {ckpts}"
                                    + (f" ({out_dir} holds {', '.join(found)}{stuck})"
                                       if stuck else ""))
        if not resume and found:
            raise FileExistsError(f"{out_dir} already holds a run ({', '.join(found)})"
                                  + (stuck or "; pass --resume to continue it, or choose "
                                     "another --out"))
        yield


def _read_holder(fd: int, wait: bool = False) -> dict:
    """The record in the lock file, or {} if it is empty or unreadable.

    With `wait`, allow the holder a moment: between its flock and its write the file is
    empty or half-written.
    """
    for _ in range(10 if wait else 1):
        try:
            holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            holder = {}
        if holder or not wait:
            return holder if isinstance(holder, dict) else {}
        time.sleep(0.05)
    return {}


def _locked_message(out_dir: Path, holder: dict) -> str:
    who = "another run"
    if holder.get("pid"):
        who += (f" (process {holder['pid']} on host {holder.get('host', '?')}, started "
                f"{holder.get('started', '?')})")
    return f"{who} is using {out_dir}; wait for it to finish or choose another --out"
