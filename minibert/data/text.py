"""Text files the same way everywhere: read as UTF-8 that never crashes on bad bytes,
written so that a crash never leaves half a file.

Web-scraped corpora regularly contain a few bytes that are not valid UTF-8. A
pipeline that crashes on byte 3,141,592,653 of a 5 GB file wastes an hour, so
every reader in minibert decodes with replacement (U+FFFD) and reports how many
bytes it replaced in one warning per file, instead of raising. A file that is plainly
not UTF-8 text with `\\n` line ends (UTF-16, or classic Mac OS `\\r` line ends) is
refused by its first bytes instead: read as UTF-8 it would silently lose its line breaks.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Iterator, Optional

from ..atomic import PathLike


# 4 MiB chunks keep memory flat however large the file, while amortising Python overhead.
_CHUNK_BYTES = 1 << 22
_REPLACEMENT_UTF8 = "\ufffd".encode("utf-8")


# Suffixes of the text files minibert reads: plain text and WikiText's two variants.
TEXT_SUFFIXES = (".txt", ".raw", ".tokens")
_MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer string names no file


def text_file_named(text: str) -> Optional[Path]:
    """The file that `text` names, or `None` when `text` is a document.

    Where one list may hold documents and file names alike (`tokenize_to_memmap`),
    a `str` that names an existing file is that file, as every item is for
    `Tokenizer.train`; a file name is never tokenized as if it were text. A `str`
    that looks like a path but names no file is a typo or a wrong working directory,
    so it raises `FileNotFoundError` instead of being tokenized. It looks like a path
    when it is one line without surrounding whitespace and either has no whitespace
    and ends in `.txt`, `.raw` or `.tokens` (any case), or holds a `/` after
    an existing folder (`data/corpus`). Every other string is a document: `and/or`,
    `1/2`, a URL, `See notes.txt for details`.
    """
    if (not text or len(text) >= _MAX_PATH_CHARS or "\n" in text or "\r" in text
            or "\0" in text or text != text.strip()):
        return None
    if os.path.isfile(text):
        return Path(text)
    if not _looks_like_path(text):
        return None
    if os.path.isdir(text):
        raise IsADirectoryError(f"{text!r} is a folder, not a text file: list its files, or "
                                f"read the folder with minibert.data.load_corpus({text!r})")
    raise FileNotFoundError(f"{text!r} looks like a file name, but there is no such file "
                            f"(relative paths start at {os.getcwd()}); correct the path")


def _looks_like_path(text: str) -> bool:
    """See `text_file_named`."""
    if "://" in text:  # a URL
        return False
    folder = os.path.dirname(text)
    if folder and os.path.isdir(folder):
        return True
    return not any(c.isspace() for c in text) and text.lower().endswith(TEXT_SUFFIXES)


def iter_text_chunks(path: PathLike, chunk_bytes: int = _CHUNK_BYTES) -> Iterator[str]:
    """Yield the decoded text of `path` in pieces that each end on a line boundary.

    Cutting at `\\n` guarantees that no multi-byte UTF-8 character is split
    across two pieces (`\\n` never occurs inside one). Invalid bytes become
    U+FFFD; their number is reported in a single `UnicodeWarning` once the file
    has been read to the end.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    n_replaced = 0
    tail = b""
    with open(path, "rb") as f:
        first = True
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
            if first:
                _check_utf8_lines(path, block)
                first = False
            block = tail + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # no newline yet: keep accumulating (a very long line)
                tail = block
                continue
            piece, tail = block[:cut], block[cut:]
            text, bad = _decode(piece)
            n_replaced += bad
            yield text
    if tail:
        text, bad = _decode(tail)
        n_replaced += bad
        yield text
    if n_replaced:
        warnings.warn(
            f"{path}: {n_replaced} invalid UTF-8 byte sequence(s) replaced by U+FFFD",
            UnicodeWarning,
            stacklevel=2,
        )


# UTF-8 text holds no NUL bytes; UTF-16 and UTF-32 put one beside every ASCII character.
_MAX_NUL_SHARE = 0.1


def _check_utf8_lines(path: Path, head: bytes) -> None:
    """Refuse a file whose first bytes are plainly not UTF-8 text with `\\n` line ends.

    Decoded with replacement, such a file does not fail: UTF-16's words survive (the
    tokenizer's normaliser drops the NULs) but its line breaks do not, and a file that
    ends lines with `\\r` alone has none either, so documents would silently run together
    (and a line is held in memory whole). A few stray bad bytes stay a warning.
    """
    boms = (b"\xff\xfe", b"\xfe\xff")  # UTF-16's, and UTF-32 LE's starts with the first
    if head.startswith(boms) or head.count(0) > _MAX_NUL_SHARE * len(head):
        raise ValueError(f"{path} is not UTF-8 text: it looks like UTF-16 or UTF-32 (a byte "
                         f"order mark or many NUL bytes); save it as UTF-8")
    if b"\r" in head and b"\n" not in head:
        raise ValueError(f"{path} ends its lines with \\r alone (classic Mac OS line ends); "
                         f"convert them to \\n, e.g. tr '\\r' '\\n' < in > out")


def _decode(raw: bytes) -> tuple[str, int]:
    """Decode UTF-8 with replacement; return the text and how many replacements were made."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        # U+FFFD characters that were already in the file are not replacements.
        return text, text.count("\ufffd") - raw.count(_REPLACEMENT_UTF8)


def iter_lines(path: PathLike) -> Iterator[str]:
    """Yield the lines of `path` without their line terminator."""
    for chunk in iter_text_chunks(path):
        lines = chunk.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the chunk ended with "\n": no extra empty line
        for line in lines:
            yield line.rstrip("\r")


def read_text(path: PathLike) -> str:
    """Return the whole decoded text of `path` (see `iter_text_chunks`)."""
    return "".join(iter_text_chunks(path))


def iter_documents(path: PathLike) -> Iterator[str]:
    """Documents of a text file: runs of non-blank lines separated by blank lines.

    This is the input format of BERT's own pretraining data: one document after another,
    an empty line between two documents.
    """
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
    """Your own corpus: every `*.txt` file in a folder, as `{"train": [...], "valid": [...]}`.

    Documents are separated by blank lines (see `iter_documents`); files are read in
    name order (`.txt` in any case; subfolders are not read). Every `holdout_every`-th
    document goes to `valid`, so the held-out set is spread over the whole corpus and the
    same on every run. `minibert.data.load_corpus` reads a folder this way when it is
    not WikiText, and says which files it read.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"text folder not found: {root}")
    files = text_folder_files(root)
    if not files:
        raise FileNotFoundError(f"no .txt files in {root}")
    check_holdout_every(holdout_every)
    return hold_out([d for f in files for d in iter_documents(f)], holdout_every, root,
                    len(files))


def text_folder_files(root: Path) -> list[Path]:
    """The files `load_text_folder` reads: `*.txt` (any case) in `root`, by name."""
    return sorted(p for p in root.iterdir() if p.suffix.lower() == ".txt" and p.is_file())


def check_holdout_every(holdout_every: int) -> None:
    if not isinstance(holdout_every, int) or holdout_every < 2:
        raise ValueError(f"holdout_every={holdout_every!r} must be an integer >= 2")


def check_enough_documents(n_docs: int, holdout_every: int, root: Path, n_files: int) -> None:
    """Refuse a text folder too small to hold one document out for evaluation."""
    if n_docs < holdout_every:
        raise ValueError(f"{root} holds {n_docs} documents (blank-line separated) in "
                         f"{n_files} .txt file(s); at least {holdout_every} are needed to "
                         f"hold one out for evaluation")


def hold_out(docs: list[str], holdout_every: int, root: Path,
             n_files: int) -> dict[str, list[str]]:
    """`{"train", "valid"}`: every `holdout_every`-th document of `docs` is held out."""
    check_enough_documents(len(docs), holdout_every, root, n_files)
    return {"train": [d for i, d in enumerate(docs) if (i + 1) % holdout_every],
            "valid": [d for i, d in enumerate(docs) if (i + 1) % holdout_every == 0]}


# ---------------------------------------------------------------------- writing
