"""Files and folders written whole or not at all, as the user's own files would be.

Each writer puts the new content under a temporary name beside the target, flushes it to
disk (fsync) and publishes it with a rename, which the file system performs in one step:
after a crash the target holds the old content or the new, never a mix or half a file.

`write_files_atomically` writes small text files, `atomic_file` one file as a stream,
`publish_file` one finished elsewhere, `replace_folder` a whole folder (an export, a
checkpoint) and `publish_folder` a folder written once (a cache entry). The modes, the locked
temporaries that `sweep` removes, and the `WriteError` that says what stopped a write
(`write_failure`): docs/runs.md, "Files that are yours".
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import stat
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Optional, Union

try:
    import fcntl
except ImportError:  # Windows: no locks, so no temporary is ever proven abandoned
    fcntl = None

PathLike = Union[str, os.PathLike]

logger = logging.getLogger(__name__)

# Every temporary file and folder a writer makes beside its target: `.{name}.{pid}-{hex}.tmp`.
_TEMPORARY = re.compile(r"^\..+\.\d+-[0-9a-f]{8}\.tmp$")
# This process's temporaries, which `sweep` leaves alone even where the lock is the
# process's rather than the open file's (NFS emulates flock with POSIX locks).
_writing: set[str] = set()


class WriteError(OSError):
    """A failed write of `target`, the path the caller gave; `error` is its cause."""

    def __init__(self, message: str, target: Optional[PathLike] = None,
                 code: Optional[int] = None, error: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.target = None if target is None else Path(target)
        self.errno = code
        self.error = error

    def __reduce__(self):  # the message, target and errno survive a pickle (to other ranks)
        return type(self), (str(self), self.target, self.errno)

    def as_output(self, flag: str, given: PathLike) -> Optional[WriteError]:
        """This error led by `flag` and `given` ("--out runs/a: ..."), if `target` lies there."""
        if self.target is None or not _within(self.target, Path(given)):
            return None
        message = str(self)
        said = f"cannot write {given}: "
        if message.startswith(said):  # the flag's path itself: said once
            message = "cannot write: " + message[len(said):]
        return WriteError(f"{flag} {given}: {message}", self.target, self.errno, self.error)


def _within(path: Path, folder: Path) -> bool:
    if path == folder or folder in path.parents:
        return True
    real, real_folder = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real == real_folder or real_folder in real.parents


@contextmanager
def reported(target: PathLike) -> Iterator[None]:
    """An OSError inside raised as the `WriteError` of writing `target` (words pass as they are)."""
    try:
        yield
    except OSError as e:
        if isinstance(e, WriteError) or e.errno is None:
            raise
        raise _failure(e, target, str(target)) from None


def make_folders(path: PathLike) -> None:
    """`path` and the folders above it, made where missing, or a `WriteError` saying why not."""
    with reported(path):
        Path(path).mkdir(parents=True, exist_ok=True)


def _failure(error: BaseException, target: PathLike, what: str,
             folder: Optional[PathLike] = None) -> WriteError:
    """The WriteError of writing `target` (`what`, in words) into `folder` (its own)."""
    folder = Path(target).parent if folder is None else folder
    return WriteError(write_failure(error, what, folder, ""), target, _os_error(error)[0], error)


def write_files_atomically(directory: PathLike, contents: Mapping[str, str]) -> None:
    """Write `{file name: text}` into `directory`: all flushed, then renamed in the order
    given (put last the file whose arrival marks the new version complete)."""
    directory = Path(directory)
    names = list(contents)
    target = directory / names[0] if len(names) == 1 else directory
    what = str(target) if len(names) == 1 else f"{', '.join(names)} in {directory}"
    written: dict[str, tuple[Path, int]] = {}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        sweep(directory)
        for name, text in contents.items():
            tmp, fd = written[name] = _temporary(directory / name)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n", closefd=False) as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for name, (tmp, _) in written.items():
            os.replace(tmp, directory / name)
        fsync(directory)
    except OSError as e:
        raise _failure(e, target, what, directory) from None
    finally:
        for tmp, fd in written.values():
            tmp.unlink(missing_ok=True)  # only still there when something failed
            _release(tmp, fd)


@contextmanager
def atomic_file(path: PathLike, mode: str = "wb") -> Iterator[IO]:
    """`with atomic_file(path) as f:` `f` is renamed over `path` when the block ends, removed
    if it raises. A failed write is a `WriteError`; the block's other errors pass."""
    path = Path(path)
    with reported(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep(path.parent)
        tmp, fd = _temporary(path)
    ours = True  # whether an error comes from this writer, not from the block
    try:
        with os.fdopen(fd, mode, closefd=False) as f:
            ours = False
            yield f
            ours = True
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # still locked: a sweep never sees it unlocked and unpublished
        fsync(path.parent)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and (ours or _writes_to(e, tmp)):
            raise _failure(e, path, str(path)) from None
        raise
    finally:
        _release(tmp, fd)


def _writes_to(error: OSError, tmp: Path) -> bool:
    """Whether an OSError in the block is its file's write (no file name, or the temporary's)."""
    if isinstance(error, WriteError) or error.errno is None:  # words of its own: not ours
        return False
    return error.filename is None or Path(os.fsdecode(error.filename)) == tmp


def publish_file(written: PathLike, path: PathLike) -> None:
    """Publish `written`, a finished file beside `path` (written across processes), as `path`."""
    with reported(path):
        fsync(written)
        os.replace(written, path)
        fsync(Path(path).parent)


def _temporary(target: Path, folder: bool = False) -> tuple[Path, int]:
    """A new temporary beside `target`, and a descriptor holding its lock (`_release` it).
    A lock not had at once is a `sweep` removing the name first: a fresh one is tried."""
    for _ in range(100):
        tmp = target.with_name(f".{target.name[:200]}.{os.getpid()}-"
                               f"{secrets.token_hex(4)}.tmp")
        if folder:
            os.mkdir(tmp, 0o777)
            if fcntl is None:  # nothing to lock with (Windows, which cannot open a folder)
                _writing.add(str(tmp))
                return tmp, -1
            fd = os.open(tmp, os.O_RDONLY)
        else:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        locked = _lock(fd)
        if locked is None or (locked and _same_file(fd, tmp)):
            _writing.add(str(tmp))
            return tmp, fd
        os.close(fd)
    raise OSError(errno.EAGAIN, "no temporary name could be kept locked", str(target))


def _release(tmp: Path, fd: int) -> None:
    _writing.discard(str(tmp))
    if fd >= 0:
        os.close(fd)  # the lock goes with the last descriptor of the file


def _lock(fd: int) -> Optional[bool]:
    """Lock `fd` without waiting: True, False (held elsewhere), None (no locks here)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK, EOPNOTSUPP; EBADF for a folder on NFS
        return None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except OSError:
        return False


def is_temporary(name: str) -> bool:
    """Whether `name` is one of the temporary names these writers give."""
    return bool(_TEMPORARY.match(name))


def sweep(folder: PathLike) -> list[Path]:
    """Remove from `folder` the temporaries of writers that are gone, whose lock the kernel
    dropped with the process; return them. Where nothing locks, nothing is removed."""
    folder = Path(folder)
    try:
        names = [n for n in os.listdir(folder) if _TEMPORARY.match(n)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = folder / name
        if fcntl is None or str(path) in _writing:
            continue
        try:
            st = os.lstat(path)
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or stat.S_ISREG(st.st_mode)):  # a link, a pipe: not a writer's
                continue
            # NFS grants an exclusive lock only on a file open for writing.
            fd = os.open(path, os.O_RDONLY if is_dir else os.O_RDWR)
        except OSError:
            continue
        try:
            if not (_lock(fd) and _same_file(fd, path)):
                continue
            if is_dir:
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
            logger.info("removed %s, left by a writer that is gone", path)
        finally:
            os.close(fd)
    return removed


def usual_mode(path: PathLike) -> None:
    """Give `path` (safetensors makes it for its owner alone) a new file's mode, read off a
    file made for it: reading the umask means setting it, for every thread at once."""
    path = Path(path)
    tmp, fd = _temporary(path)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        tmp.unlink(missing_ok=True)
        _release(tmp, fd)
    os.chmod(path, mode)


def replace_folder(path: Path, write: Callable[[Path], None],
                   owns: Callable[[str], bool] = lambda name: False,
                   failed: Optional[Callable[[BaseException], str]] = None) -> None:
    """Make `path` the folder that `write` fills, keeping the old entries with `owns(name)`
    False (a tokenizer, notes). After an fsync two renames swap it in: the old folder steps
    aside under a hidden name (put back by the next save, if this one dies between them).
    A failed write is a `WriteError`, in `failed(error)`'s words where given."""
    given = Path(path).expanduser()
    # Through a link: replace the folder it points to. (Path.resolve would raise a
    # RuntimeError on a link loop; the loop is named when the folder cannot be made.)
    path = Path(os.path.realpath(given))
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"cannot save into {given}: it is a file, not a folder")
    if path == Path.cwd() or path in Path.cwd().parents:
        raise ValueError(f"cannot save into {given}: it holds the working directory, which "
                         f"the save replaces; save into a subfolder such as {given / 'model'}")
    new = fd = old = None
    try:
        # The folders above as the user named them: never through a link to nothing (an
        # unmounted disk's folder), which the resolved path would follow.
        given.parent.mkdir(parents=True, exist_ok=True)
        path = Path(os.path.realpath(given))
        if not path.exists():  # a save killed between the two renames below: put the old one back
            for p in path.parent.iterdir():
                if p.name.startswith(f".{path.name}.old-"):
                    os.rename(p, path)
                    break
        sweep(path.parent)
        new, fd = _temporary(path, folder=True)
        write(new)
        if path.is_dir():
            _carry_over(path, new, owns)
        _fsync_tree(new)
        if path.exists():
            # os.rename cannot replace a folder that holds files: for a moment `path` is
            # absent, never a mix, and the old export is whole under `old`.
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
        os.rename(new, path)
        fsync(path.parent)
    except BaseException as e:
        if old is not None and not path.exists():
            os.rename(old, path)  # put the previous export back
        if new is not None:
            shutil.rmtree(new, ignore_errors=True)
        if isinstance(e, (OSError, RuntimeError, *_safetensors_error())):
            # A full disk reaches us as "os error 28" inside a SafetensorError, or as torch's
            # "unexpected pos": say what was being written, why it stopped, and what is safe.
            raise WriteError(failed(e) if failed else
                             write_failure(e, str(given), path.parent, "save again") +
                             f"; what {given} held before is intact", given,
                             _os_error(e)[0], e) from None
        raise
    finally:
        if fd is not None:
            _release(new, fd)
    # Done: drop the previous export, and what killed saves (and older minibert's) left.
    for p in path.parent.iterdir():
        if p.name.startswith((f".{path.name}.old-", f".{path.name}.tmp-")) or p == new:
            shutil.rmtree(p, ignore_errors=True)


def _safetensors_error() -> tuple[type, ...]:
    """safetensors' error class where it is installed (an optional extra), else none."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return ()
    return (SafetensorError,)


def publish_folder(path: Path, write: Callable[[Path], None]) -> bool:
    """Make `path` the folder that `write` fills, unless another process did first: False."""
    new = fd = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep(path.parent)
        new, fd = _temporary(path, folder=True)
        write(new)
        _fsync_tree(new)
        try:
            os.rename(new, path)  # onto a non-empty folder: EEXIST or ENOTEMPTY
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and path.is_dir():
                return False
            raise
        fsync(path.parent)
        return True
    except OSError as e:
        raise _failure(e, path, str(path)) from None
    finally:
        if fd is not None:
            shutil.rmtree(new, ignore_errors=True)  # nothing left once renamed
            _release(new, fd)


def _carry_over(old: Path, new: Path, owns: Callable[[str], bool]) -> None:
    """Hard-link (else copy) into `new` the entries of `old` not owned and not in `new`."""
    for entry in old.iterdir():
        target = new / entry.name
        if owns(entry.name) or target.exists():
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        elif entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, target)


def _link_or_copy(src: PathLike, dst: PathLike) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder under `folder` to disk before the swap publishes it."""
    for root, _, files in os.walk(folder):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                fsync(os.path.join(root, name))
        fsync(root)


def fsync(path: PathLike) -> None:
    """Make a file's data or a folder's entries durable. POSIX only; a no-op elsewhere."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_mb(path: PathLike) -> float:
    """Free space on the disk that holds `path`, in MiB (NaN when it cannot be read)."""
    try:
        return shutil.disk_usage(path).free / 2**20
    except OSError:
        return float("nan")


def out_of_inodes(path: PathLike) -> bool:
    """Whether the disk that holds `path` has bytes free but no inode left for a new file
    (many small files, or a small file system). A disk that counts no inodes (btrfs, some
    network file systems: 0 in all) is never said to be out of them."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # AttributeError: no statvfs on Windows
        return False
    return st.f_files > 0 and st.f_favail == 0 and st.f_bavail > 0


# What stops a write that no check could foresee: a full disk, a quota, a file-size limit.
NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})


@contextmanager
def writing(what: Any) -> Iterator[None]:
    """`with writing(path):` an OSError inside records `path` as what it was writing (a failed
    `write` names no file), for `could_not_write`; the innermost `writing` wins."""
    try:
        yield
    except OSError as error:
        if getattr(error, "writing", None) is None:
            error.writing = str(what)
        raise


def could_not_write(error: BaseException) -> bool:
    """Whether `error` is a failed write: named by `writing`, or NO_ROOM deep in its chain."""
    return getattr(error, "writing", None) is not None or _os_error(error)[0] in NO_ROOM


def write_failure(error: BaseException, what: str, folder: PathLike, then: str,
                  freeing: str = "some space") -> str:
    """"cannot write WHAT: the problem; what to do, and THEN": the one place a write into
    `folder` that failed with `error` is put in words, the cause deciding the fix. No errno
    (torch's "unexpected pos") is taken for a full disk, the usual cause."""
    code, filename, said = _os_error(error)
    where = _place(filename, Path(folder))
    name = errno.errorcode.get(code, str(code))
    if code == errno.EFBIG:
        limit = _file_size_limit()
        problem = (f"the file reached this process's file-size limit"
                   f"{f' of {limit} bytes' if limit else ''} (EFBIG), not the end of the disk")
        fix = "raise the limit (`ulimit -f unlimited` in the shell that runs it)"
    elif code == getattr(errno, "EDQUOT", "none here"):  # not an errno on Windows
        problem = (f"the disk quota is used up (EDQUOT; {free_mb(where):.0f} MB are free on "
                   f"the disk, not for this user)")
        fix = f"free {freeing} within the quota, or have it raised"
    elif code == errno.ENOSPC and out_of_inodes(where):
        # Every file and folder takes an inode, whatever its size: bytes alone do not help.
        problem = (f"{os.strerror(errno.ENOSPC)} (ENOSPC): the disk has no inode left for a "
                   f"new file, though {free_mb(where):.0f} MB are free on it")
        fix = ("delete files you do not need on that disk (each takes an inode, however "
               "small), or choose another place")
    elif code in (None, errno.ENOSPC):
        problem = f"{os.strerror(errno.ENOSPC)} (ENOSPC; {free_mb(where):.0f} MB are free on it)"
        fix = f"free {freeing}"
    elif code in (errno.EACCES, errno.EPERM):
        problem = f"{os.strerror(code).lower()} on {where} ({name})"
        fix = f"give this user write permission on {where}, or choose another place"
    elif code == errno.EROFS:
        problem = f"{where} is on a read-only file system (EROFS)"
        fix = "choose a place on a disk that can be written"
    else:
        problem, fix = _on_the_way(filename, code) if filename else (None, None)
        if problem is None:
            problem = f"{os.strerror(code).lower()} ({name}) on {where}"
            fix = "correct it"
    if code is None or not isinstance(_cause(error), OSError):
        problem += f" ({said})"  # a library's own words, or no errno: the only trace
    return f"cannot write {what}: {problem}; {fix}" + (f", and {then}" if then else "")


def _cause(error: BaseException) -> BaseException:
    return error.error if isinstance(error, WriteError) and error.error is not None else error


def _os_error(error: BaseException) -> tuple[Optional[int], Optional[str], str]:
    """(errno, its path, a line saying it) of what stopped a write: the chain's OSError, else
    the number in safetensors' "os error 27" (or "code: 27")."""
    seen: Optional[BaseException] = _cause(error)
    for _ in range(8):  # the chain is short; the bound guards against a cycle
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno is not None:
            seen = _cause(seen)
            name = getattr(seen, "filename", None)
            return seen.errno, None if name is None else os.fsdecode(name), error_gist(seen)
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"os error (\d+)|code: (\d+)", str(error))
    return (int(found.group(1) or found.group(2)) if found else None), None, error_gist(error)


def _place(filename: Optional[str], folder: Path) -> Path:
    """The path a failed write is about, as the user knows it: the nearest one that exists."""
    path = folder if filename is None else _known(filename)
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _known(filename: str) -> Path:
    """`filename` as the user knows it: up to a writer's temporary in it, that one's folder."""
    path = Path(filename)
    for i, part in enumerate(path.parts):
        if _TEMPORARY.match(part):
            return Path(*path.parts[:i])
    return path


def _on_the_way(filename: str, code: int) -> tuple[Optional[str], Optional[str]]:
    """(problem, fix) where the way to `filename` meets a link loop, a link to nothing or a
    file (`filename` itself, for EEXIST); else (None, None)."""
    path = _known(filename)
    for step in [*reversed(path.parents), path][1:]:
        if step.is_symlink():
            try:
                os.stat(step)
            except OSError as e:
                fix = f"correct the link {step}, or choose another place"
                if e.errno == errno.ELOOP:
                    return f"{step} is a symbolic link loop (ELOOP)", fix
                if e.errno == errno.ENOENT:
                    return (f"{step} is a symbolic link to {os.readlink(step)}, which does not "
                            f"exist"), fix
                return None, None
        elif not step.exists():
            break
        elif not step.is_dir() and (step != path or code == errno.EEXIST):
            return (f"{step} is a file, not a folder",
                    f"move {step} away, or choose another place")
    return None, None


def _file_size_limit() -> Optional[int]:
    """This process's file-size limit in bytes (`ulimit -f`); None without one."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def error_gist(error: BaseException) -> str:
    """An error's informative line, at most 300 characters: its first, but past torch.load's
    advice to load with weights_only=False (which would run code from the file)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("Unsupported", "WeightsUnpickler error: Unsupported", "size mismatch")):
            return ln.removeprefix("WeightsUnpickler error: ").split(". Please")[0][:300]
    return lines[0][:300] if lines else type(error).__name__
