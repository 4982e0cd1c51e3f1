"""Reading text files the same way everywhere: UTF-8, never crashing on bad bytes.

Web-scraped corpora regularly contain a few bytes that are not valid UTF-8. A
pipeline that crashes on byte 3,141,592,653 of a 500 MB file wastes an hour, so
every reader in minibert decodes with replacement (U+FFFD) and reports how many
bytes it replaced in one warning per file, instead of raising.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]

# 4 MiB chunks keep memory flat on 500 MB files while amortising Python overhead.
_CHUNK_BYTES = 1 << 22
_REPLACEMENT_UTF8 = "\ufffd".encode("utf-8")


def iter_text_chunks(path: PathLike, chunk_bytes: int = _CHUNK_BYTES) -> Iterator[str]:
    """Yield the decoded text of ``path`` in pieces that each end on a line boundary.

    Cutting at ``\\n`` guarantees that no multi-byte UTF-8 character is split
    across two pieces (``\\n`` never occurs inside one). Invalid bytes become
    U+FFFD; their number is reported in a single ``UnicodeWarning`` once the file
    has been read to the end.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    n_replaced = 0
    tail = b""
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
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


def _decode(raw: bytes) -> tuple[str, int]:
    """Decode UTF-8 with replacement; return the text and how many replacements were made."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        # U+FFFD characters that were already in the file are not replacements.
        return text, text.count("\ufffd") - raw.count(_REPLACEMENT_UTF8)


def iter_lines(path: PathLike) -> Iterator[str]:
    """Yield the lines of ``path`` without their line terminator."""
    for chunk in iter_text_chunks(path):
        lines = chunk.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the chunk ended with "\n": no extra empty line
        for line in lines:
            yield line.rstrip("\r")


def read_text(path: PathLike) -> str:
    """Return the whole decoded text of ``path`` (see :func:`iter_text_chunks`)."""
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
    """Your own corpus: every ``*.txt`` file in a folder, as ``{"train": [...], "valid": [...]}``.

    Documents are separated by blank lines (see :func:`iter_documents`); files are read in
    name order. Every ``holdout_every``-th document goes to ``valid``, so the held-out set
    is spread over the whole corpus and the same on every run. This is what continued
    pretraining on domain text (``pretrain_wikitext.py --data-dir my_texts/``) reads.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"text folder not found: {root}")
    files = sorted(root.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt files in {root}")
    if not isinstance(holdout_every, int) or holdout_every < 2:
        raise ValueError(f"holdout_every={holdout_every!r} must be an integer >= 2")
    docs = [d for f in files for d in iter_documents(f)]
    if len(docs) < holdout_every:
        raise ValueError(f"{root} holds {len(docs)} documents (blank-line separated) in "
                         f"{len(files)} .txt file(s); at least {holdout_every} are needed to "
                         f"hold one out for evaluation")
    return {"train": [d for i, d in enumerate(docs) if (i + 1) % holdout_every],
            "valid": [d for i, d in enumerate(docs) if (i + 1) % holdout_every == 0]}
