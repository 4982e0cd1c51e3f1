"""Run directories: one training run at a time in each, and whether a run already lives there.

A run holds `RunLock(out)`, an exclusive `fcntl.flock` on `out` and on `out/.lock`, so that a
second run with the same --out stops at once with `RunLockedError`, naming the first
(docs/runs.md, "One run per folder: the lock"). Check, then write: `check_run_folder` says,
reading only, whether the folder can take the start; `open_run` holds it (`RunFolder`), looks
again under the lock, and takes back what a start made if it ends before it trained. The
module needs only the standard library, so that it loads by its path alone: minibert's own
modules are imported inside the functions that use them.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # only for the annotations: the module runs on the standard library alone
    from ..atomic import PathLike

try:
    import fcntl
except ImportError:  # Windows: no locks
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# What a run leaves in its directory; a folder counts only when something is in it.
RUN_OUTPUTS = ("final/", "eval.json", "metrics.jsonl", "checkpoints/")


class RunLockedError(OSError):
    """Another live run holds the directory (an OSError: a script says it in one line).
    `holder` is what that run recorded: {"pid", "host", "started"}, or {}."""

    def __init__(self, message: str, holder: Optional[dict] = None):
        super().__init__(message)
        self.holder = holder or {}


class RunLock:
    """`with RunLock(out_dir):` makes out_dir if needed and holds its lock, or raises
    `RunLockedError`. `previous`: what a killed run had recorded in the lock file, or None.

    Two flocks: one on the folder itself, which a hand that deletes `.lock` cannot take away
    from a live run, and one on `.lock`, which holds the holder's record and, on NFS (where a
    folder's flock is seen by its own host alone), is the lock other hosts see."""

    def __init__(self, out_dir: PathLike):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self.previous: Optional[dict] = None
        self._fd: Optional[int] = None
        self._folder_fd: Optional[int] = None

    def acquire(self) -> RunLock:
        if fcntl is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            log.warning("cannot lock %s on this platform (no fcntl): nothing stops another run "
                        "from using the same directory", self.out_dir)
            return self
        for attempt in range(10):
            self.out_dir.mkdir(parents=True, exist_ok=True)
            folder = _lock_folder(self.out_dir)  # first: a refused start makes no lock file
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides its mode
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd, wait=True)
                _close(fd, folder)
                raise RunLockedError(_locked_message(self.out_dir, holder), holder) from None
            except OSError as e:
                _close(fd, folder)
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                log.warning("cannot lock %s (%s): nothing stops another run from using the "
                            "same directory", self.out_dir, e.strerror)
                return self
            # A file opened just before another start removed it (`release(remove=True)`) and
            # locked just after is one nobody else will find, and so is a folder another
            # start removed and made again: the locks count only on what the paths still
            # name (after ten tries, the file system is taken at its word).
            if (_names(self.path, fd) and (folder is None or _names(self.out_dir, folder))
                    or attempt == 9):
                break
            _close(fd, folder)
        self._fd, self._folder_fd = fd, folder
        # We hold the lock: whoever wrote a non-empty file is gone.
        self.previous = _read_holder(fd) or None
        if self.previous:
            log.info("%s: the previous run (process %s on host %s) is gone; taking its lock "
                     "over", self.out_dir, self.previous.get("pid"), self.previous.get("host"))
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, remove: bool = False) -> None:
        """Let the lock go; `remove`: delete the lock file first (a start that found none)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        folder, self._folder_fd = self._folder_fd, None
        try:
            if remove:
                self.path.unlink(missing_ok=True)
            else:
                os.ftruncate(fd, 0)  # empty = released cleanly; only a killed run leaves one
        finally:
            _close(fd, folder)  # closing the files is what drops the flocks

    def check_free(self) -> None:
        """Refuse, as `acquire` would, a folder another run holds, but writing nothing."""
        if fcntl is None:
            return
        folder = _lock_folder(self.out_dir)  # raises RunLockedError for a live run
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # no lock file, and the folder's lock was free: no run holds it
            _close(folder)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd, wait=True)
            raise RunLockedError(_locked_message(self.out_dir, holder), holder) from None
        except OSError:  # a file system that refuses locks: as `acquire`, go ahead
            pass
        finally:
            _close(fd, folder)  # which drops the flocks, if they were taken

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _lock_folder(out_dir: Path) -> Optional[int]:
    """The folder `out_dir` opened and flocked: its descriptor, or None where there is no
    folder or it cannot be locked (the lock file's flock then stands alone). A folder another
    run holds raises RunLockedError, named by the holder's record in the lock file if that
    is still there."""
    try:
        fd = os.open(out_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            record = os.open(out_dir / LOCK_FILE, os.O_RDONLY)
        except OSError:  # deleted by hand while its run lives
            raise RunLockedError(_locked_message(out_dir, None)) from None
        try:
            holder = _read_holder(record, wait=True)
        finally:
            os.close(record)
        raise RunLockedError(_locked_message(out_dir, holder), holder) from None
    except OSError:
        os.close(fd)
        return None
    return fd


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file or folder open as `fd`."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _close(*fds: Optional[int]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def run_exists(out_dir: PathLike) -> list[str]:
    """Which of RUN_OUTPUTS are in out_dir (folders only when not empty): a run lives there."""
    found = []
    for name in RUN_OUTPUTS:
        path = Path(out_dir) / name.rstrip("/")
        if (path.is_dir() and any(path.iterdir())) if name.endswith("/") else path.exists():
            found.append(name)
    return found


def check_run_folder(out_dir: PathLike, resume: bool) -> None:
    """Refuse a start that `out_dir` cannot take, reading only: without `resume`, it must
    hold no run (`run_exists`); with it, an intact checkpoint under `checkpoints/`."""
    from .checkpoint import checkpoint_written, latest_checkpoint
    out_dir = Path(out_dir)
    if resume and not out_dir.is_dir():
        raise FileNotFoundError(f"--resume: no intact checkpoint: {out_dir} does not exist, "
                                f"so it holds no run to continue; check --out, or start "
                                f"without --resume")
    ckpts = out_dir / "checkpoints"
    found = run_exists(out_dir)
    # A run stopped before its first checkpoint cannot be resumed: say so, rather than send
    # a fresh start to --resume and back (damaged checkpoints: never advise deleting).
    stuck = (f"; it saved no checkpoint, so it cannot be resumed: delete "
             f"{', '.join(found)} in it to start again, or choose another --out"
             if found and not checkpoint_written(ckpts) else "")
    if resume and latest_checkpoint(ckpts) is None:
        raise FileNotFoundError(f"--resume: no intact checkpoint in {ckpts}"
                                + (f" ({out_dir} holds {', '.join(found)}{stuck})"
                                   if stuck else ""))
    if not resume and found:
        raise FileExistsError(f"{out_dir} already holds a run ({', '.join(found)})"
                              + (stuck or "; pass --resume to continue it, or choose "
                                 "another --out"))


class RunFolder:
    """A run folder held by one start (`open_run`), put back as it was found if the start
    ends by an exception before its run trained (saved a checkpoint or logged a row), or
    could not write with no intact checkpoint to resume from. Then `trained` (None: never
    held), `kept`, `resume_from` (after a failed write), `made` (the folder it made is gone)
    and `left` (what was not taken back) say what it left."""

    def __init__(self, path: Path, resume: bool, main: bool = True) -> None:
        self.path, self.resume, self.main = path, resume, main
        self.made = False
        self.trained: Optional[bool] = None
        self.kept = False
        self.resume_from: Optional[Path] = None
        self.left: list[str] = []
        self._lock = RunLock(path)
        self._had_lock = False
        self._first_made: Optional[Path] = None  # the outermost folder this start makes
        self._before: Optional[dict[str, tuple]] = None

    def check(self) -> None:
        """Refuse a start the folder cannot take, before anything is made (main rank)."""
        if not self.main:
            return
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        self._first_made = missing[-1] if missing else None
        self._before = _listing(self.path)
        self._had_lock = os.path.lexists(self.path / LOCK_FILE)
        # A live run's folder is refused by its lock before what it holds is judged.
        self._lock.check_free()
        check_run_folder(self.path, self.resume)

    def finished(self, steps: list[tuple[Optional[int], int]]) -> bool:
        """Whether the folder holds a finished run that no other run holds (main rank): each
        training's newest intact checkpoint is at its max_steps (`steps`: per training, (the
        checkpoint's step or None, max_steps)), and eval.json, written last, records those
        steps (not those of an earlier finish)."""
        if not self.main or not steps or any(step != last for step, last in steps):
            return False
        try:
            record = json.loads((self.path / "eval.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return False
        # eval.json's `steps`, or its rows' (distillation: one row per student trained)
        rows = [record, *record.values()] if isinstance(record, dict) else []
        recorded = {row["steps"] for row in rows if isinstance(row, dict) and "steps" in row}
        if recorded != {last for _, last in steps}:
            return False
        self._lock.check_free()
        return True

    def __enter__(self) -> RunFolder:
        if not self.main:
            return self
        from ..atomic import reported
        if self._before is None:
            self.check()
        try:
            with reported(self.path):  # the first write to the folder: why it fails, said
                self._lock.acquire()
            # Another start may have come and gone since the check: look, and check, again.
            now = _listing(self.path)
            if now != self._before:
                self._before = now
                check_run_folder(self.path, self.resume)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, exc_type: Any, error: Optional[BaseException], *exc: Any) -> None:
        if not self.main:
            return
        if exc_type is None:
            self._lock.release()
        else:
            from ..atomic import could_not_write
            self._leave(error is not None and could_not_write(error))

    def _leave(self, write_failed: bool = False) -> None:
        if self._lock.held:  # only the holder may look at what changed, and take it back
            self._put_back(write_failed)
            self._lock.release(remove=not self._had_lock and not self.kept)
        if not self.kept:
            self._remove_made_folders()

    def _put_back(self, write_failed: bool) -> None:
        before, now = self._before or {}, _listing(self.path)
        changed = [rel for rel, entry in now.items() if before.get(rel) != entry]
        self.trained = any(_training_output(rel) for rel in changed)
        if write_failed:
            from .checkpoint import latest_checkpoint
            self.resume_from = latest_checkpoint(self.path / "checkpoints")
        self.kept = self.trained and not (write_failed and self.resume_from is None)
        if self.kept:
            return
        for rel in changed:
            if rel in before:  # a file that was there, written over
                self.left.append(rel)
            elif "/" not in rel or rel.rsplit("/", 1)[0] in before:  # new, its parent not
                path = self.path / rel
                try:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
                except OSError:
                    self.left.append(rel)

    def _remove_made_folders(self) -> None:
        """Innermost first, each only if empty: another start may have come in since."""
        if self._first_made is None:
            return
        for folder in (self.path, *self.path.parents):
            try:
                folder.rmdir()
            except OSError:
                break
            if folder == self._first_made:
                break
        self.made = not self.path.exists()
        if not self.made and self.trained is not None and not self.left:
            self.left = sorted(p.name for p in self.path.iterdir())


def open_run(out_dir: PathLike, resume: bool, main: bool = True) -> RunFolder:
    """`with open_run(out_dir, resume) as folder:` hold `out_dir` for one run, checked
    before anything is made and again under the lock (`RunFolder`); other ranks
    (`main=False`) check nothing."""
    return RunFolder(Path(out_dir), resume, main)


def _listing(folder: Path) -> dict[str, tuple]:
    """Every path under `folder` but the lock file, relative: ("dir",) or a file's (size, mtime)."""
    found: dict[str, tuple] = {}
    for root, dirs, files in os.walk(folder):
        base = Path(root).relative_to(folder)
        for name in dirs:
            found[(base / name).as_posix()] = ("dir",)
        for name in files:
            try:
                st = os.stat(Path(root) / name, follow_symlinks=False)
            except OSError:
                continue
            found[(base / name).as_posix()] = (st.st_size, st.st_mtime_ns)
    found.pop(LOCK_FILE, None)
    return found


_STEP_DIR = re.compile(r"(^|/)checkpoints/step_\d+(/|$)")


def _training_output(rel: str) -> bool:
    """Whether the path (relative to a run folder) is what training writes: a log or a
    checkpoint, of the run or of one in a subfolder (distillation's baseline)."""
    return rel.rsplit("/", 1)[-1] == "metrics.jsonl" or bool(_STEP_DIR.search(rel))


def _read_holder(fd: int, wait: bool = False) -> dict:
    """The record in the lock file, or {}; with `wait`, allow the holder a moment to write
    it (between its flock and its write the file is empty or half-written)."""
    for _ in range(10 if wait else 1):
        try:
            holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            holder = {}
        if holder or not wait:
            return holder if isinstance(holder, dict) else {}
        time.sleep(0.05)
    return {}


def _locked_message(out_dir: Path, holder: Optional[dict]) -> str:
    """The refusal of a folder another run holds; `holder`: its record, None where the lock
    file is gone (deleted by hand), {} where it is empty."""
    if holder is None:
        return (f"another run is using {out_dir}: it holds the folder's lock, though its lock "
                f"file {out_dir / LOCK_FILE} was deleted, so which process it is cannot be "
                f"said; wait for it to finish or choose another --out")
    who = "another run"
    if holder.get("pid"):
        who += (f" (process {holder['pid']} on host {holder.get('host', '?')}, started "
                f"{holder.get('started', '?')})")
    return f"{who} is using {out_dir}; wait for it to finish or choose another --out"
