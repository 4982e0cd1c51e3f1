"""Files and folders written whole or not at all.

A training run writes results a user keeps (an exported model, a tokenizer, eval.json)
and may be killed, or run out of disk, at any moment. Each writer here first puts the new
content under a temporary name beside the target and flushes it to disk (fsync), then
publishes it with a rename, which the file system performs in one step. After a crash the
target holds the old content or the new, never a mix of the two and never half a file.

* `write_files_atomically(dir, {name: text})`: small text files (a tokenizer, eval.json).
* `atomic_file(path)`: one file written as a stream (a token file), published whole when
  the `with` block ends.
* `publish_file(written, path)`: a file finished elsewhere (a download resumed across
  runs, then verified), published under its name.
* `replace_folder(path, write)`: a whole folder (a model export), swapped in one step.
* `publish_folder(path, write)`: a folder written once (a cache entry); the first writer wins.
* `fsync(path)`: make a file's data or a folder's entries durable.
* `write_failure(error, what, folder, then)`: what stopped a write, said so that the user
  knows what to do: a full disk, a quota, a file-size limit are three different fixes.

Checkpoints (`checkpoint.py`) are folders published by `replace_folder`, one per step.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from contextlib import contextmanager
from typing import IO, Callable, Iterator, Mapping, Optional, Union

PathLike = Union[str, os.PathLike]


def write_files_atomically(directory: PathLike, contents: Mapping[str, str]) -> None:
    """Write `{file name: text}` into `directory` so that no file is ever half written.

    Every file is first written in full under a unique temporary name in the same
    directory and flushed to disk; only then are they renamed over the old files, in
    the order given, and the directory itself is flushed so the renames survive a
    power cut. A crash or a full disk before the renames leaves every old file whole;
    put last the file whose arrival should mark the new version complete.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    try:
        for name, text in contents.items():
            written[name] = _write_synced_temp(directory, name, text)
        for name, tmp in written.items():
            os.replace(tmp, directory / name)
    finally:
        for tmp in written.values():
            tmp.unlink(missing_ok=True)  # only still there when something failed
    fsync(directory)


@contextmanager
def atomic_file(path: PathLike, mode: str = "wb") -> Iterator[IO]:
    """`with atomic_file(path) as f:` write `f` in as many pieces as you like; when the block
    ends the file is flushed to disk and renamed over `path`, and if it raises, the
    temporary file goes and `path` keeps what it held. The temporary name is unique to this
    process, beside `path`, and a dot name, so no reader of the folder takes it for data."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)


def publish_file(written: PathLike, path: PathLike) -> None:
    """Publish `written`, a file complete on disk (a download verified after its last
    piece), under the name `path`: flushed, renamed over it in one step, the rename made
    durable. For a file written across several processes, where `atomic_file` cannot hold
    it open; `written` must sit beside `path`, on the same file system."""
    fsync(written)
    os.replace(written, path)
    fsync(Path(path).parent)


def _write_synced_temp(directory: Path, name: str, text: str) -> Path:
    """Write `text` to a new uniquely named file in `directory`, fsync it, return its path.

    A unique name (not `name + ".tmp"`) keeps two processes saving into the same
    directory from writing into each other's temporary file. `os.open` with mode
    0o666 lets the umask decide the permissions, as for any other new file
    (`tempfile.mkstemp` would make the file readable by its owner only).
    """
    tmp = directory / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def replace_folder(path: Path, write: Callable[[Path], None],
                   owns: Callable[[str], bool] = lambda name: False,
                   failed: Optional[Callable[[BaseException], str]] = None) -> None:
    """Make `path` the folder that `write` fills, in one step, keeping files it does not own.

    `write` fills a fresh hidden sibling; the entries of the old `path` that the writer does
    not own (`owns(name)` is False: a tokenizer, notes) are carried over; everything is
    flushed to disk; then the two folders swap names. A crash at any moment leaves `path`
    holding the complete old export or the complete new one, never new weights beside an
    old config. A write that fails is an OSError saying what stopped it: `failed(error)`'s
    words where given, else `write_failure`'s and that the old folder is intact.
    """
    path = path.expanduser().resolve()  # through a link: replace the folder it points to
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"cannot save into {path}: it is a file, not a folder")
    if path == Path.cwd() or path in Path.cwd().parents:
        raise ValueError(f"cannot save into {path}: it holds the working directory, which the "
                         f"save replaces; save into a subfolder such as {path / 'model'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():  # a save killed between the two renames below: put the old one back
        for p in path.parent.iterdir():
            if p.name.startswith(f".{path.name}.old-"):
                os.rename(p, path)
                break
    new = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write(new)
        if path.is_dir():
            _carry_over(path, new, owns)
        _fsync_tree(new)
        if _exchange(new, path):
            old = new  # `new` now holds the previous export
        elif path.exists():
            # Without an atomic exchange the old folder steps aside first: for a moment
            # `path` is absent (never a mix), and the old export is complete under `old`.
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
            os.rename(new, path)
        else:
            os.rename(new, path)
        fsync(path.parent)
    except BaseException as e:
        if old is not None and not path.exists():
            os.rename(old, path)  # put the previous export back
        shutil.rmtree(new, ignore_errors=True)
        if isinstance(e, (OSError, RuntimeError)) or type(e).__name__ == "SafetensorError":
            # A full disk reaches us as "os error 28" inside a SafetensorError, or as torch's
            # "unexpected pos": say what was being written, why it stopped, and what is safe.
            raise OSError(failed(e) if failed else
                          write_failure(e, str(path), path.parent, "save again") +
                          f"; what {path} held before is intact") from None
        raise
    # Done: drop the previous export, and what saves killed mid-way left behind.
    for p in path.parent.iterdir():
        if p.name.startswith((f".{path.name}.tmp-", f".{path.name}.old-")):
            shutil.rmtree(p, ignore_errors=True)


def publish_folder(path: Path, write: Callable[[Path], None]) -> bool:
    """Make `path` the folder that `write` fills, unless it is there already: a cache entry,
    whose name fixes its content, so the first process to publish it wins and the others
    keep its copy. `write` fills a hidden sibling, which is flushed to disk and renamed into
    place; readers see the whole entry or none. Returns False where another process
    published `path` first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        write(new)
        _fsync_tree(new)
        os.rename(new, path)  # onto a non-empty folder: EEXIST or ENOTEMPTY
        fsync(path.parent)
        return True
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and path.is_dir():
            return False
        raise
    finally:
        shutil.rmtree(new, ignore_errors=True)  # nothing left once renamed


def _carry_over(old: Path, new: Path, owns: Callable[[str], bool]) -> None:
    """Bring the entries of `old` the writer does not own into `new`, unless `new` has them.

    Hard links make this instant and free of space; where the file system has none, copies.
    """
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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False where the system cannot.

    Linux's renameat2(RENAME_EXCHANGE) (kernel 3.15, glibc 2.28) does it; os.rename cannot
    replace a non-empty folder, so elsewhere the caller falls back to two renames.
    """
    if sys.platform != "linux" or not b.exists():
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without it
        return False
    raise OSError(err, os.strerror(err), str(b))


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


def write_failure(error: BaseException, what: str, folder: PathLike, then: str,
                  freeing: str = "some space") -> str:
    """"could not write WHAT (the error); why, what to do, and THEN": the message of a write
    into `folder` that failed with `error`.

    The cause decides the fix, so it is named: EFBIG is this process's file-size limit
    (`ulimit -f`), which no free space lifts; EDQUOT is the user's quota on a disk that may
    have room; ENOSPC is a full disk, with the space left. An error that carries no number
    (torch's "unexpected pos" from a writer given a path) is taken for a full disk, the
    usual cause.
    """
    code, said = _os_error(error)
    if code == errno.EFBIG:
        limit = _file_size_limit()
        why = (f"EFBIG: the file reached this process's file-size limit"
               f"{f' of {limit} bytes' if limit else ''}, not the end of the disk. Raise the "
               f"limit (`ulimit -f unlimited` in the shell that runs it)")
    elif code == getattr(errno, "EDQUOT", "none here"):  # not an errno on Windows
        why = (f"EDQUOT: the disk quota is used up ({free_mb(folder):.0f} MB are free on the "
               f"disk, not for this user). Free {freeing} within the quota, or have it raised")
    elif code in (None, errno.ENOSPC):
        why = f"{free_mb(folder):.0f} MB are free on its disk. Free {freeing}"
    else:  # a folder not writable, a read-only disk...: nothing that space would fix
        why = (f"{errno.errorcode.get(code, code)}: {os.strerror(code)}, which no free space "
               f"would fix. Correct it")
    return f"could not write {what} ({said}); {why} and {then}"


def _os_error(error: BaseException) -> tuple[Optional[int], str]:
    """(errno, a line saying it) of what stopped a write. torch.save reports a failed write as
    "unexpected pos", with the OSError of the file object's write as its context;
    safetensors says "os error 27" (or "code: 27") inside its message."""
    seen: Optional[BaseException] = error
    for _ in range(8):  # the chain is short; the bound guards against a cycle
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno, error_gist(seen)
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"os error (\d+)|code: (\d+)", str(error))
    return (int(found.group(1) or found.group(2)) if found else None), error_gist(error)


def _file_size_limit() -> Optional[int]:
    """This process's file-size limit in bytes (`ulimit -f`); None without one."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def error_gist(error: BaseException) -> str:
    """The informative line of an error, for a one-line message (at most 300 characters).

    Its first non-empty line, except for torch.load's, whose first lines advise
    weights_only=False (which would run code from the file): there, the line that names
    what the file holds."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("Unsupported", "WeightsUnpickler error: Unsupported", "size mismatch")):
            return ln.removeprefix("WeightsUnpickler error: ").split(". Please")[0][:300]
    return lines[0][:300] if lines else type(error).__name__
