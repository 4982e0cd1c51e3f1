"""Text files read the same way everywhere: strict UTF-8, refused where a byte is wrong.

Every text file minibert reads goes through `iter_text_chunks` (or `iter_lines`,
`read_text`, which are built on it): a script's --input, the task files (TSV, CSV, CoNLL,
SQuAD JSON), the corpus files of a pretraining folder, a tokenizer's training files and its
vocab.txt. A byte that is not UTF-8 ends the read with a `ValueError` naming the file, the
line and the byte, and the way to drop such bytes (`iconv -f utf-8 -t utf-8 -c`).

Strict rather than lenient: decoding with replacement (U+FFFD) would never stop a run, but
what it gives is not the file's text: a file of random bytes read as lines of text, embedded
and written out with exit status 0; a file in Latin-1 loses every accented letter to the
same replacement character; and the fine-tuning scripts refused what the corpus reader let
through. A web-scraped corpus with a few stray bytes is cleaned once, by the
user, with the command the error gives, and is then the text that was meant.

A file that is plainly not UTF-8 text with `\\n` line ends (UTF-16, or classic Mac OS `\\r`
line ends) is refused by its first bytes, with its own fix. A UTF-8 byte order mark at the
start (some editors write one) is not part of the text.
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


def iter_text_chunks(path: PathLike, chunk_bytes: int = _CHUNK_BYTES, *,
                     line_ends: bool = True) -> Iterator[str]:
    """Yield the decoded text of `path` in pieces that each end on a line boundary.

    Cutting at `\\n` guarantees that no multi-byte UTF-8 character is split
    across two pieces (`\\n` never occurs inside one). A byte that is not UTF-8 raises
    a `ValueError` naming the file, its line and the byte (see the module docstring); the
    pieces before it have been yielded by then, so a caller that writes as it reads
    writes to a temporary file (`minibert.atomic.atomic_file`). `line_ends=False` reads a
    file whose line ends do not matter (JSON), where a `\\r` alone is no reason to refuse.
    """
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
    """Refuse a file whose first bytes are plainly not UTF-8 text with `\\n` line ends.

    Such a file is refused for what it is, rather than at its first bad byte: UTF-16 is
    easily saved as UTF-8 once named, and a file that ends lines with `\\r` alone is valid
    UTF-8 with no line breaks at all, so documents would silently run together (and a line
    is held in memory whole).
    """
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
        lines = chunk.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the chunk ended with "\n": no extra empty line
        for line in lines:
            yield line.rstrip("\r")


def read_text(path: PathLike, *, line_ends: bool = True) -> str:
    """Return the whole decoded text of `path` (see `iter_text_chunks`)."""
    return "".join(iter_text_chunks(path, line_ends=line_ends))


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
    check_readable(root)  # a loop, a link to nothing, a folder that may not be entered
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; load_text_folder reads a folder of .txt "
                                 f"files")
    files = text_folder_files(root)
    if not files:
        raise FileNotFoundError(f"no .txt files in {root}")
    check_holdout_every(holdout_every)
    return hold_out([d for f in files for d in iter_documents(f)], holdout_every, root,
                    len(files))


def text_folder_files(root: Path) -> list[Path]:
    """The files `load_text_folder` reads: `*.txt` (any case) in `root`, by name."""
    return files_named(root, (".txt",))


def files_named(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files in `folder` whose names end in one of `suffixes` (any case), by name. One
    of them that is a link to nothing (or a loop, or may not be read) raises, naming it
    (`minibert.paths.file_present`): skipped, it would leave its text out of the corpus
    without a word."""
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


def hold_out(docs: list[str], holdout_every: int, root: Path,
             n_files: int) -> dict[str, list[str]]:
    """`{"train", "valid"}`: every `holdout_every`-th document of `docs` is held out."""
    check_enough_documents(len(docs), holdout_every, root, n_files)
    return {"train": [d for i, d in enumerate(docs) if (i + 1) % holdout_every],
            "valid": [d for i, d in enumerate(docs) if (i + 1) % holdout_every == 0]}

