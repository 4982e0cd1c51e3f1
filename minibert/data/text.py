"""Text files read the same way everywhere: strict UTF-8, refused where a byte is wrong.

Every text file minibert reads goes through `iter_text_chunks`. A byte that is not UTF-8
raises a `ValueError` naming the file, the line, the byte and the fix (`iconv -c`): decoded
with replacement, random bytes would be embedded with exit status 0. A file plainly not
UTF-8 with `\\n` line ends (UTF-16, `\\r` alone) is refused by its first bytes. A file whose
name ends in `.gz` is decompressed as it is read, through the same checks; a damaged or
truncated one is refused, naming it. A corpus file is blank-line separated text (`.txt`,
`.txt.gz`) or JSON Lines (`.jsonl`, `.jsonl.gz`: `iter_jsonl_documents`).
"""
from __future__ import annotations

import gzip
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

from ..atomic import PathLike
from ..paths import check_readable, file_present

# 4 MiB chunks keep memory flat however large the file, while amortising Python overhead.
_CHUNK_BYTES = 1 << 22
_BOM = b"\xef\xbb\xbf"
# Suffixes of the text files minibert reads: plain text and WikiText's two variants.
TEXT_SUFFIXES = (".txt", ".raw", ".tokens")
# The files of a corpus: documents separated by blank lines, or one JSON object a line.
CORPUS_SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz")
TEXT_FIELD = "text"  # the field of a JSON Lines object that holds its document, by default
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
    gz = path.name.lower().endswith(".gz")
    with gzip.open(path, "rb") if gz else open(path, "rb") as f:
        first = True
        while block := (_read_gzip(f, chunk_bytes, path) if gz else f.read(chunk_bytes)):
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


def _read_gzip(f: BinaryIO, n: int, path: Path) -> bytes:
    """The next `n` bytes of the gzipped file `path`, or the reason it cannot give them: not
    gzip, damaged (a CRC that fails) or cut short (a download that stopped), said in one line
    rather than as zlib's traceback."""
    try:
        return f.read(n)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path} is not a whole gzip file ({e}): damaged, cut short or not "
                         f"gzip at all; check it with gzip -t {path}, and download or "
                         f"compress it again") from None


# UTF-8 text holds no NUL bytes; UTF-16 and UTF-32 put one beside every ASCII character.
_MAX_NUL_SHARE = 0.1


def _check_utf8_lines(path: Path, head: bytes, line_ends: bool = True) -> None:
    """Refuse a file whose first bytes are plainly not UTF-8 text with `\\n` line ends, for
    what it is: UTF-16, or `\\r` line ends (valid UTF-8 whose documents would run together)."""
    boms = (b"\xff\xfe", b"\xfe\xff")  # UTF-16's, and UTF-32 LE's starts with the first
    if head.startswith(boms) or head.count(0) > _MAX_NUL_SHARE * len(head):
        raise ValueError(f"{path} is not UTF-8 text: it looks like UTF-16 or UTF-32 (a byte "
                         f"order mark or many NUL bytes); save it as UTF-8, e.g. "
                         f"{_iconv(path, '-f utf-16 -t utf-8')}")
    # \r alone ends more lines than \n: the file's lines are \r's, and a \n reader would
    # run them together (one \n at the end, as an editor adds, changes nothing). A stray
    # \r among \n line ends is text and is kept; \r\n is a \n line end.
    bare_cr = head.count(b"\r") - head.count(b"\r\n")
    if line_ends and bare_cr > head.count(b"\n"):
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
            f"save the file as UTF-8, or drop the bytes that are not with "
            f"{_iconv(path, '-f utf-8 -t utf-8 -c')}") from None


def _iconv(path: Path, options: str) -> str:
    """The command a message gives to repair `path`: `iconv` writing a copy beside it (for a
    gzipped file, between zcat and gzip), named so that it is read as `path` is."""
    suffix = corpus_suffix(path) or path.suffix
    fixed = path.with_name(f"{path.name[:len(path.name) - len(suffix)]}.utf8{suffix}")
    if suffix.endswith(".gz"):
        return f"zcat {path} | iconv {options} | gzip > {fixed}"
    return f"iconv {options} {path} > {fixed}"


def corpus_suffix(path: Path) -> Optional[str]:
    """The one of `CORPUS_SUFFIXES` that `path`'s name ends in (any case), in lower case."""
    return next((s for s in CORPUS_SUFFIXES if path.name.lower().endswith(s)), None)


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


def iter_jsonl_documents(path: PathLike, text_field: str = TEXT_FIELD) -> Iterator[str]:
    """Documents of a JSON Lines file (`.jsonl`, `.jsonl.gz`): the string in the `text_field`
    of each line's object, as it is. Blank lines and blank documents are skipped; a line
    that holds no such string raises, naming the file, the line and the fix."""
    path = Path(path)
    example = f'such as {{"{text_field}": "..."}}'
    for n, line in enumerate(iter_lines(path), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not valid JSON ({e.msg}, column {e.colno}); "
                             f"each line of a JSON Lines file is one JSON object, {example}"
                             ) from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {n}: {_json_kind(record)}, not a JSON object; "
                             f"each line of a JSON Lines file is one JSON object, {example}")
        if text_field not in record:
            raise ValueError(f"{path}, line {n}: has no {text_field!r} field; its fields are: "
                             f"{', '.join(record) or 'none'}; choose one with text_field=NAME")
        text = record[text_field]
        if not isinstance(text, str):
            raise ValueError(f"{path}, line {n}: its {text_field!r} field is "
                             f"{_json_kind(text)}, not a string; choose the field that holds "
                             f"the text with text_field=NAME")
        try:  # JSON may escape half of a surrogate pair (\\ud800), which no UTF-8 text holds
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{path}, line {n}: its {text_field!r} field holds "
                             f"\\u{ord(text[e.start]):04x}, half of a surrogate pair and no "
                             f"character; correct or drop the line") from None
        if text.strip():
            yield text


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def load_text_folder(path: PathLike, holdout_every: int = 20) -> dict[str, list[str]]:
    """Your own corpus: every `*.txt` file in a folder (by name, documents separated by
    blank lines), as `{"train": [...], "valid": [...]}`: every `holdout_every`-th document
    goes to `valid`, spread over the corpus and the same on every run."""
    root = Path(path).expanduser()
    check_readable(root)  # a loop, a link to nothing, a folder that may not be entered
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; load_text_folder reads a folder of .txt files")
    files = files_named(root, (".txt",))  # not .txt.gz or .jsonl: those are load_corpus's
    if not files:
        raise FileNotFoundError(f"no .txt files in {root}")
    check_holdout_every(holdout_every)
    docs = [d for f in files for d in iter_documents(f)]
    check_enough_documents(len(docs), holdout_every, root, len(files))
    return {"train": [d for i, d in enumerate(docs) if (i + 1) % holdout_every],
            "valid": [d for i, d in enumerate(docs) if (i + 1) % holdout_every == 0]}


def files_named(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files in `folder` whose names end in one of `suffixes` (any case), by name; a
    link to nothing among them raises (`paths.file_present`) rather than be skipped."""
    return sorted(p for p in folder.iterdir()
                  if p.name.lower().endswith(suffixes) and file_present(p))


def check_holdout_every(holdout_every: int) -> None:
    if not isinstance(holdout_every, int) or holdout_every < 2:
        raise ValueError(f"holdout_every={holdout_every!r} must be an integer >= 2")


def check_enough_documents(n_docs: int, holdout_every: int, root: Path, n_files: int) -> None:
    """Refuse a text folder too small to hold one document out for evaluation."""
    if n_docs < holdout_every:
        raise ValueError(f"{root} holds {n_docs} documents in {n_files} file(s); at least "
                         f"{holdout_every} are needed to hold one out for evaluation")
