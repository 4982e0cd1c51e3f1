"""The paths a user gives, checked before they are read: what is wrong, said as what it is.

`Path.is_file()` and `Path.is_dir()` answer False alike for a path that does not exist, a
symbolic link to nothing, a loop of links and a path under a folder this user may not
enter, so a reader that asks only them says "not found" for all four, and the user goes
looking for a typo in a path that is right. `check_readable` tells them apart:

    check_readable("data/train.tsv", "--train")
    # --train data/train.tsv is a symbolic link to ../old/train.tsv, which does not exist; ...

Every input a script reads goes through it, with the flag that named the path (a data file,
a corpus folder, a model folder), and so does each reader of a file inside such a folder
(config.json, the weights, the tokenizer), whose links a download cache makes. It only looks:
whether a folder or a file is the right kind for the reader is the reader's to say.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional

from .atomic import PathLike

_MAX_HOPS = 8  # links followed to show a chain or a loop; more is noise in a message


def check_readable(path: PathLike, name: Optional[str] = None,
                   expected: Optional[str] = None) -> os.stat_result:
    """The `os.stat` of `path` once it is known to be there for this user to read: a file
    it may read, or a folder it may list and enter. Otherwise an `OSError` that says which
    of these it is: not found (`FileNotFoundError`, naming the missing part), a symbolic
    link to nothing (`FileNotFoundError`, naming the link and its target), a loop of links,
    a file where a folder should be on the way, or a permission refused (`PermissionError`,
    naming what may not be read or entered). `name`, the flag that gave the path
    (`--train`), opens the message, followed by the path as given; `expected`, what should
    be there (`"a model folder: config.json, ..."`), ends the message for a path not found."""
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
    at = _first_failing(path)  # the part of the path where the way ends
    # The path itself, or the part of it on the way that is at fault.
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
        return NotADirectoryError(f"{shown} not found: {_file_on_the_way(path)} is a file, "
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


def _prefixes(path: Path) -> list[Path]:
    """`a`, `a/b`, `a/b/c` for `a/b/c`: each part of the path, from the first."""
    parts = path.parts
    return [Path(*parts[:i]) for i in range(1, len(parts) + 1)]


def _first_failing(path: Path) -> Path:
    """The first part of `path` that cannot be reached (`path` itself if none can be
    found: the failure is not the same twice)."""
    for p in _prefixes(path):
        try:
            os.stat(p)
        except OSError:
            return p
    return path


def _file_on_the_way(path: Path) -> Path:
    """The first part of `path` that is a file while more of the path follows it."""
    for p in _prefixes(path)[:-1]:
        if os.path.isfile(p):
            return p
    return path.parent


def _chain(link: Path) -> str:
    """`link -> target -> ...`, the links as they are written, followed until one names
    something that is not a link, names nothing, or comes round again."""
    hops, p = [str(link)], str(link)
    seen = {os.path.normpath(p)}
    while os.path.islink(p) and len(hops) <= _MAX_HOPS:
        target = os.readlink(p)
        hops.append(target)
        p = os.path.normpath(os.path.join(os.path.dirname(p), target))
        if p in seen:
            break
        seen.add(p)
    return " -> ".join(hops)


def file_present(path: PathLike) -> bool:
    """Whether a file that may or may not be there (a model folder's weights, a tokenizer's
    config) is: True for a file this user may read, False when there is nothing at `path`
    (or a folder). A link to nothing, a loop or a file that may not be read raises
    (`check_readable`): counted as absent, it would be passed over without a word, for
    another file or a default in its place."""
    if not (os.path.islink(path) or os.path.exists(path)):
        return False
    return stat.S_ISREG(check_readable(path).st_mode)
