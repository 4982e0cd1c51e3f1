"""Text files read the same way everywhere: strict UTF-8, refused where a byte is wrong.

Every text file minibert reads goes through `iter_text_chunks`. A byte that is not UTF-8
raises a `ValueError` naming the file, the line, the byte and the fix (`iconv -c`): decoded
with replacement, random bytes would be embedded with exit status 0. A file plainly not
UTF-8 with `\\n` line ends (UTF-16, `\\r` alone) is refused by its first bytes.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator, Optional

from ..atomic import PathLike
from ..paths import check_readable, file_present

# 4 MiB chunks keep memory flat however large the file, while amortising Python overhead.
_CHUNK_BYTES = 1 << 22
_BOM = b"\xef\xbb\xbf"
# Suffixes of the text files minibert reads: plain text and WikiText's two variants.
TEXT_SUFFIXES = (".txt", ".raw", ".tokens")
_MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer string names no file


def text_file_named(text: str) -> Optional[Path]:
    """The file that `text` names, or `None` when `text` is a document (`tokenize_to_memmap`). A
    `str` that looks like a path but names no file raises `FileNotFoundError`: one line without
    whitespace ending in one of `TEXT_SUFFIXES` (any case), or with a `/` after an existing folder.
    `and/or`, a URL, `See notes.txt` are documents."""
    if (not text or len(text) >= _MAX_PATH_CHARS or "\n" in text or "\r" in text
            or "\0" in text or text != text.strip()):
        return None
    if os.path.isfile(text):
        return Path(text)
    folder = os.path.dirname(text)
    if "://" in text or not (folder and os.path.isdir(folder) or not any(
            c.isspace() for c in text) and text.lower().endswith(TEXT_SUFFIXES)):
        return None  # a URL, or no path at all
    if os.path.isdir(text):
        raise IsADirectoryError(f"{text!r} is a folder, not a text file: list its files, or "
                                f"read the folder with minibert.data.load_corpus({text!r})")
    raise FileNotFoundError(f"{text!r} looks like a file name, but there is no such file "
                            f"(relative paths start at {os.getcwd()}); correct the path")


def iter_text_chunks(path: PathLike, chunk_bytes: int = _CHUNK_BYTES, *,
                     line_ends: bool = True) -> Iterator[str]:
    """Yield the decoded text of `path` in pieces that each end on a line boundary (`\\n` never
    occurs inside a multi-byte character). The pieces before a bad byte have been yielded when it
    raises, so a caller that writes as it reads writes to a temporary file. `line_ends=False` reads
    a file whose line ends do not matter (JSON)."""
    path = Path(path)
    if stat.S_ISDIR(check_readable(path).st_mode):  # a loop, a link to nothing: named
        raise IsADirectoryError(f"{path} is a folder, not a text file")
    line = 1  # the line the next piece starts on
    pending: list[bytes] = []  # read since the last line end: a long line, in blocks
    with open(path, "rb") as f:
        first = True
        while block := f.read(chunk_bytes):
            if first:
                _check_utf8_lines(path, block, line_ends)
                block, first = block.removeprefix(_BOM), False
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # no line end yet: keep the block (one joined copy, not one a block)
                pending.append(block)
                continue
            piece = b"".join([*pending, block[:cut]])
            pending = [block[cut:]]
            yield _decode(piece, path, line)
            line += piece.count(b"\n")
    if rest := b"".join(pending):
        yield _decode(rest, path, line)


# UTF-8 text holds no NUL bytes; UTF-16 and UTF-32 put one beside every ASCII character.
_MAX_NUL_SHARE = 0.1


def _check_utf8_lines(path: Path, head: bytes, line_ends: bool = True) -> None:
    """Refuse a file whose first bytes are plainly not UTF-8 text with `\\n` line ends, for
    what it is: UTF-16, or `\\r` line ends (valid UTF-8 whose documents would run together)."""
    boms = (b"\xff\xfe", b"\xfe\xff")  # UTF-16's, and UTF-32 LE's starts with the first
    if head.startswith(boms) or head.count(0) > _MAX_NUL_SHARE * len(head):
        raise ValueError(f"{path} is not UTF-8 text: it looks like UTF-16 or UTF-32 (a byte "
                         f"order mark or many NUL bytes); save it as UTF-8, e.g. iconv -f "
                         f"utf-16 -t utf-8 {path} > {_fixed(path)}")
    if line_ends and b"\r" in head and b"\n" not in head:
        raise ValueError(f"{path} ends its lines with \\r alone (classic Mac OS line ends); "
                         f"convert them to \\n, e.g. tr '\\r' '\\n' < in > out")


def _decode(raw: bytes, path: Path, line: int) -> str:
    """`raw` (the bytes of `path` from the start of `line`) as text; a byte that is not
    UTF-8 raises, naming the file, its line and the byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        at = line + raw.count(b"\n", 0, e.start)
        raise ValueError(
            f"{path}, line {at}: not valid UTF-8 (byte 0x{raw[e.start]:02x}: {e.reason}); "
            f"save the file as UTF-8, or drop the bytes that are not with iconv -f utf-8 "
            f"-t utf-8 -c {path} > {_fixed(path)}") from None


def _fixed(path: Path) -> Path:
    """Where the fix a message gives writes the repaired copy of `path`: beside it."""
    return path.with_name(f"{path.stem}.utf8{path.suffix}")


def iter_lines(path: PathLike) -> Iterator[str]:
    """Yield the lines of `path` without their line terminator."""
    for chunk in iter_text_chunks(path):
        for line in chunk.removesuffix("\n").split("\n"):  # no empty line after a last "\n"
            yield line.rstrip("\r")


def read_text(path: PathLike, *, line_ends: bool = True) -> str:
    """Return the whole decoded text of `path` (see `iter_text_chunks`)."""
    return "".join(iter_text_chunks(path, line_ends=line_ends))


def iter_documents(path: PathLike) -> Iterator[str]:
    """Documents of a text file: runs of non-blank lines between blank lines (as BERT's data)."""
    current: list[str] = []
    for line in iter_lines(path):
        if line.strip():
            current.append(line)
        elif current:
            yield "\n".join(current)
            current = []
    if current:
        yield "\n".join(current)


def load_text_folder(path: PathLike, holdout_every: int = 20) -> dict[str, list[str]]:
    """Your own corpus: every `*.txt` file in a folder (by name, documents separated by
    blank lines), as `{"train": [...], "valid": [...]}`: every `holdout_every`-th document
    goes to `valid`, spread over the corpus and the same on every run."""
    root = Path(path).expanduser()
    check_readable(root)  # a loop, a link to nothing, a folder that may not be entered
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; load_text_folder reads a folder of .txt files")
    files = text_folder_files(root)
    if not files:
        raise FileNotFoundError(f"no .txt files in {root}")
    check_holdout_every(holdout_every)
    docs = [d for f in files for d in iter_documents(f)]
    check_enough_documents(len(docs), holdout_every, root, len(files))
    return {"train": [d for i, d in enumerate(docs) if (i + 1) % holdout_every],
            "valid": [d for i, d in enumerate(docs) if (i + 1) % holdout_every == 0]}


def text_folder_files(root: Path) -> list[Path]:
    """The files `load_text_folder` reads: `*.txt` (any case) in `root`, by name."""
    return files_named(root, (".txt",))


def files_named(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files in `folder` whose names end in one of `suffixes` (any case), by name; a
    link to nothing among them raises (`paths.file_present`) rather than be skipped."""
    return sorted(p for p in folder.iterdir()
                  if p.suffix.lower() in suffixes and file_present(p))


def check_holdout_every(holdout_every: int) -> None:
    if not isinstance(holdout_every, int) or holdout_every < 2:
        raise ValueError(f"holdout_every={holdout_every!r} must be an integer >= 2")


def check_enough_documents(n_docs: int, holdout_every: int, root: Path, n_files: int) -> None:
    """Refuse a text folder too small to hold one document out for evaluation."""
    if n_docs < holdout_every:
        raise ValueError(f"{root} holds {n_docs} documents (blank-line separated) in "
                         f"{n_files} .txt file(s); at least {holdout_every} are needed to "
                         f"hold one out for evaluation")
