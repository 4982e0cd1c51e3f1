"""The paths a user gives, checked before they are read: what is wrong, said as what it is.

`Path.is_file()` answers False alike for a missing path, a link to nothing, a loop of links
and a path under a folder this user may not enter; `check_readable` tells them apart:

    check_readable("data/train.tsv", "--train")
    # --train data/train.tsv is a symbolic link to ../old/train.tsv, which does not exist; ...

Every input a script reads goes through it, and each reader of a file in a model folder
(whose links a download cache makes).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional

from .atomic import PathLike


def check_readable(path: PathLike, name: Optional[str] = None,
                   expected: Optional[str] = None) -> os.stat_result:
    """The `os.stat` of `path`, a file this user may read or a folder it may enter; else an
    `OSError` saying which way it fails. `name` (the flag, `--train`) opens the message;
    `expected` (`"a model folder: config.json, ..."`) ends it for a path not found."""
    shown = f"{name} {os.fspath(path)}" if name else os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise _unreachable(Path(path), shown, e, expected) from None
    folder = stat.S_ISDIR(st.st_mode)
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        what = "list or enter this folder" if folder else "read this file"
        raise PermissionError(f"{shown}: permission denied: this user may not {what} "
                              f"({stat.filemode(st.st_mode)}, owner uid {st.st_uid}); "
                              f"give it read{' and execute' if folder else ''} permission "
                              f"(chmod), or run as a user who has it")
    return st


def _unreachable(path: Path, shown: str, error: OSError, expected: Optional[str]) -> OSError:
    """What `os.stat(path)` failing with `error` means, as the error to raise."""
    # The part of the path where the way ends (`path` itself if none now does).
    at = next((p for p in (*reversed(path.parents), path) if not os.path.exists(p)), path)
    it = f"{shown} is" if at == path else f"{shown} cannot be reached: {at} on the way is"
    if error.errno == errno.ELOOP:
        return OSError(f"{it} a loop of symbolic links ({_chain(at)}), which leads back to "
                       f"itself and names nothing; point the link at the file or folder "
                       f"itself")
    if error.errno == errno.EACCES:
        return PermissionError(f"{shown}: permission denied: this user may not enter the "
                               f"folder {at.parent} on the way to it; give that folder "
                               f"execute permission (chmod +x), or run as a user who has it")
    if error.errno == errno.ENOTDIR:
        file = next((p for p in reversed(path.parents) if os.path.isfile(p)), path.parent)
        return NotADirectoryError(f"{shown} not found: {file} is a file, "
                                  f"not a folder, so nothing lies under it")
    if error.errno == errno.ENOENT and os.path.islink(at):
        return FileNotFoundError(f"{it} a symbolic link to nothing ({_chain(at)}, which does "
                                 f"not exist); point the link at the file or folder, or "
                                 f"give its own path")
    if error.errno == errno.ENOENT:
        where = "" if path.is_absolute() else f"; relative paths start at {os.getcwd()}"
        missing = "" if at == path else f": there is no {at}"
        wanted = f"; expected {expected}" if expected else ""
        return FileNotFoundError(f"{shown} not found{missing}{where}{wanted}")
    return OSError(f"{shown} cannot be read: {error.strerror}")


def _chain(link: Path) -> str:
    """`link -> target -> ...`, as written, until a target is not a link or comes round."""
    hops, p = [str(link)], str(link)
    seen = {os.path.normpath(p)}
    while os.path.islink(p) and len(hops) <= 8:  # more links are noise in a message
        target = os.readlink(p)
        hops.append(target)
        p = os.path.normpath(os.path.join(os.path.dirname(p), target))
        if p in seen:
            break
        seen.add(p)
    return " -> ".join(hops)


def file_present(path: PathLike) -> bool:
    """Whether an optional file (a model folder's weights) is there: False for nothing (or a
    folder). A link to nothing or a file that may not be read raises (`check_readable`)."""
    return os.path.lexists(path) and stat.S_ISREG(check_readable(path).st_mode)
