"""Places this process cannot write, for the tests of what a refused write says.

`chmod 0o555` on a folder is the real thing, but root writes into it anyway (permissions are
not enforced for root, and tests may run as root), so `refuse` makes the calls that create,
open for writing or rename into a path fail as the kernel would: an OSError with the errno
given (EROFS, EACCES) and the very path the call was given, temporary names included, for
every path that `where(path)` picks.

    refuse(monkeypatch, inside(folder), errno.EROFS)   # folder is on a read-only disk
    refuse(monkeypatch, lambda p: p.parent == folder, errno.EACCES)   # folder is 0o555
"""

import builtins
import io
import os
from pathlib import Path

ROOT = os.name == "posix" and os.geteuid() == 0

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def inside(folder):
    """`where` for a folder on a read-only disk: the folder and everything under it."""
    folder = Path(folder)
    return lambda p: p == folder or folder in p.parents


def refuse(monkeypatch, where, code):
    real_open, real_os_open, real_mkdir = io.open, os.open, os.mkdir
    real_replace, real_rename = os.replace, os.rename

    def check(path):
        if isinstance(path, (str, bytes, os.PathLike)) and where(Path(os.fsdecode(path))):
            raise OSError(code, os.strerror(code), os.fsdecode(path))

    def fake_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            check(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if flags & _WRITES:
            check(path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        check(path)
        return real_mkdir(path, *args, **kwargs)

    def fake_replace(src, dst, *args, **kwargs):
        check(dst)
        return real_replace(src, dst, *args, **kwargs)

    def fake_rename(src, dst, *args, **kwargs):
        check(dst)
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", fake_replace)
    monkeypatch.setattr(os, "rename", fake_rename)
