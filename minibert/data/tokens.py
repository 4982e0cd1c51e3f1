"""Pre-tokenized corpus on disk: tokenize once, memory-map forever (docs/walkthrough.md,
"6.2 The token file").

File layout (all little-endian):

    bytes [0, 4096)             MAGIC, then a JSON header padded with spaces
    bytes [4096, ...)           ids: n_tokens x uint16 (vocab <= 65536) or uint32
    aligned to 8 bytes          doc_offsets: (n_docs + 1) x int64; document d is
                                ids[doc_offsets[d] : doc_offsets[d + 1]]

The header holds the format version, dtype, counts, byte offsets, the file size (truncation
shows) and the tokenizer's fingerprint (ids are never read with another vocabulary).
"""
from __future__ import annotations

import array
import itertools
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterable, Iterator, Optional, Union

import numpy as np

from ..atomic import PathLike, atomic_file
from .corpus import Documents
from .normalize import FastEncoder
from .text import iter_documents, text_file_named

if TYPE_CHECKING:  # imported lazily: minibert.data.tokenizer itself imports minibert.data
    from .tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MAGIC = b"MINIBERT-TOKENS\n"
FORMAT_VERSION = 1
HEADER_BYTES = 4096


class TokenFileError(ValueError):
    """A token file is missing, truncated, of an unknown format, or from another tokenizer."""


class TokenFile:
    """A memory-mapped, read-only pre-tokenized corpus: `ids` `(n_tokens,)` uint16/uint32,
    `doc_offsets` `(n_docs + 1,)` int64 and `header`, the JSON header as a dict."""

    def __init__(self, path: Path, header: dict) -> None:
        self.path, self.header = path, header
        self.dtype = np.dtype(header["dtype"])
        self.n_tokens: int = header["n_tokens"]
        self.n_docs: int = header["n_docs"]
        self.vocab_size: int = header["vocab_size"]
        self.fingerprint: str = header["tokenizer_fingerprint"]
        self.ids = np.memmap(path, dtype=self.dtype, mode="r", offset=header["ids_offset"],
                             shape=(self.n_tokens,))
        self.doc_offsets = np.memmap(path, dtype="<i8", mode="r",
                                     offset=header["offsets_offset"], shape=(self.n_docs + 1,))

    @classmethod
    def open(cls, path: PathLike, tokenizer: Optional["Tokenizer"] = None) -> "TokenFile":
        """Memory-map `path`; if `tokenizer` is given, check that it made the file. Any
        damage raises `TokenFileError` alone, so that a cache can catch it and rebuild."""
        path = Path(path)
        redo = "re-prepare it with minibert.data.tokenize_to_memmap(...)"
        if not path.is_file():
            raise FileNotFoundError(f"token file not found: {path}; {redo}")
        header = _read_header(path, redo)
        if tokenizer is not None and tokenizer.fingerprint != header["tokenizer_fingerprint"]:
            raise TokenFileError(
                f"{path} was made by a different tokenizer (fingerprint "
                f"{header['tokenizer_fingerprint']}, vocab {header['vocab_size']}) than the one "
                f"given ({tokenizer.fingerprint}, vocab {tokenizer.vocab_size}); its ids would be "
                f"read with the wrong vocabulary. {redo[0].upper() + redo[1:]} and this tokenizer.")
        try:
            tf = cls(path, header)
        except ValueError as e:  # numpy refusing a mapping the checks above let through
            raise TokenFileError(f"{path} cannot be memory-mapped ({e}); {redo}") from e
        offsets = np.asarray(tf.doc_offsets)
        # Garbage offsets would hand out wrong documents without an error: checked whole.
        if offsets[0] != 0 or offsets[-1] != tf.n_tokens or np.any(np.diff(offsets) < 0):
            raise TokenFileError(f"{path} is damaged: its document offsets do not run in "
                                 f"order from 0 to n_tokens={tf.n_tokens}; {redo}")
        return tf

    def __len__(self) -> int:
        """Number of documents."""
        return self.n_docs

    def doc(self, d: int) -> np.ndarray:
        """Ids of document `d`, shape `(len_d,)` (a view into the memmap)."""
        return self.ids[self.doc_offsets[d]:self.doc_offsets[d + 1]]

    def doc_lengths(self) -> np.ndarray:
        """`(n_docs,)` int64 token count of every document."""
        return np.diff(np.asarray(self.doc_offsets))

    # A memmap pickles as a full copy, one per "spawn" DataLoader worker: pickle the path.
    def __getstate__(self) -> dict:
        return {"path": str(self.path), "header": self.header}

    def __setstate__(self, state: dict) -> None:
        self.__init__(Path(state["path"]), state["header"])

    def __repr__(self) -> str:
        return (f"TokenFile({str(self.path)!r}, n_tokens={self.n_tokens}, n_docs={self.n_docs}, "
                f"dtype={self.dtype.name})")


# Header fields that TokenFile reads, and their JSON types.
_HEADER_FIELDS = {"dtype": str, "n_tokens": int, "n_docs": int, "vocab_size": int,
                  "tokenizer_fingerprint": str, "ids_offset": int, "offsets_offset": int,
                  "file_size": int}


def _read_header(path: Path, redo: str) -> dict:
    """The header of token file `path`, checked field by field against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if size == 0:
        raise TokenFileError(f"{path} is empty (0 bytes); {redo}")
    if not head.startswith(MAGIC):
        raise TokenFileError(f"{path} is not a minibert token file (bad magic bytes); {redo}")
    if len(head) < HEADER_BYTES:
        raise TokenFileError(f"{path} is truncated ({size} bytes, the header alone is "
                             f"{HEADER_BYTES}); {redo}")
    try:
        header = json.loads(head[len(MAGIC):].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenFileError(f"{path} has a corrupt header ({e}); {redo}") from e
    if not isinstance(header, dict):
        raise TokenFileError(f"{path} has a corrupt header (a JSON {type(header).__name__}, "
                             f"not an object); {redo}")
    if header.get("format_version") != FORMAT_VERSION:
        raise TokenFileError(f"{path} has token-file format version "
                             f"{header.get('format_version')}, this minibert reads version "
                             f"{FORMAT_VERSION}; {redo}")
    for key, kind in _HEADER_FIELDS.items():
        value = header.get(key)  # a bool is an int to Python, but never a count
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise TokenFileError(f"{path} has a corrupt header: {key}={value!r}; {redo}")
    if size != header["file_size"]:
        raise TokenFileError(f"{path} is truncated or damaged: {size} bytes on disk, the "
                             f"header promises {header['file_size']}; {redo}")
    if header["dtype"] not in ("<u2", "<u4"):
        raise TokenFileError(f"{path} has a corrupt header: dtype={header['dtype']!r}, token "
                             f"files hold '<u2' or '<u4' ids; {redo}")
    ids_end = header["ids_offset"] + header["n_tokens"] * np.dtype(header["dtype"]).itemsize
    offsets_end = header["offsets_offset"] + (header["n_docs"] + 1) * 8
    if (header["ids_offset"] != HEADER_BYTES or header["offsets_offset"] < ids_end
            or header["offsets_offset"] % 8 or offsets_end != size):
        raise TokenFileError(f"{path} has a corrupt header: its ids and document offsets do "
                             f"not fit the file's {size} bytes; {redo}")
    return header


def tokenize_to_memmap(source: Union[PathLike, Documents, Iterable[Union[str, "os.PathLike[str]"]]],
                       tokenizer: "Tokenizer", out_path: PathLike, *,
                       batch_docs: int = 256) -> TokenFile:
    """Tokenize a corpus once into a token file at `out_path` (written under a temporary name, then
    renamed) and return it opened. `source`: a split of `load_corpus`, a path to one text file, or
    an iterable of documents and text files (a `Path`, or a `str` naming a file:
    `text.text_file_named`), text files holding blank-line separated documents. `batch_docs` are
    encoded at a time; memory keeps 8 bytes a document. A BERT normalizer runs in Python
    (`minibert.data.normalize`)."""
    out_path = Path(out_path)
    dtype = np.dtype("<u2") if tokenizer.vocab_size <= 1 << 16 else np.dtype("<u4")
    fast = FastEncoder.of(getattr(tokenizer, "backend", None))
    encode = fast.encode_batch if fast is not None else tokenizer.encode_batch
    with atomic_file(out_path) as f:  # a failed run leaves a previous file untouched
        f.write(b"\0" * HEADER_BYTES)  # placeholder; the real header goes in last
        lengths = _write_ids(f, _documents(source, out_path), encode, dtype, batch_docs)
        n_tokens = sum(lengths)
        if n_tokens == 0:
            raise ValueError(f"the corpus given to tokenize_to_memmap is empty: no tokens "
                             f"were produced, nothing was written to {out_path}")
        _write_index(f, lengths, tokenizer, dtype)
    logger.info("wrote %s: %d tokens in %d documents (%s)", out_path, n_tokens, len(lengths),
                dtype.name)
    return TokenFile.open(out_path, tokenizer)


def _write_ids(f: BinaryIO, docs: Iterator[str], encode: Callable, dtype: np.dtype,
               batch_docs: int) -> "array.array[int]":
    """Append the ids of `docs`, encoded `batch_docs` at a time; return each document's
    length (8 bytes each); a document with no tokens is dropped."""
    lengths = array.array("q")
    while batch := list(itertools.islice(docs, batch_docs)):
        encoded = encode(batch, add_special_tokens=False)
        counts = [len(e) for e in encoded]
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=sum(counts))
        f.write(flat.tobytes())
        lengths.extend(c for c in counts if c)
    return lengths


def _write_index(f: BinaryIO, lengths: "array.array[int]", tokenizer: "Tokenizer",
                 dtype: np.dtype) -> None:
    """After the ids: the documents' offsets (int64, 8-byte aligned), then the header over
    the placeholder at the start of the file."""
    n_tokens = sum(lengths)
    ids_end = HEADER_BYTES + n_tokens * dtype.itemsize
    offsets_offset = -(-ids_end // 8) * 8  # int64 offsets start 8-byte aligned
    f.write(b"\0" * (offsets_offset - ids_end))
    offsets = np.zeros(len(lengths) + 1, dtype="<i8")
    np.cumsum(np.frombuffer(lengths, dtype=np.int64), out=offsets[1:])
    f.write(offsets.tobytes())
    header = {"format_version": FORMAT_VERSION, "dtype": dtype.str, "n_tokens": n_tokens,
              "n_docs": len(lengths), "vocab_size": tokenizer.vocab_size,
              "tokenizer_fingerprint": tokenizer.fingerprint,
              "special_ids": {"pad": tokenizer.pad_id, "unk": tokenizer.unk_id,
                              "cls": tokenizer.cls_id, "sep": tokenizer.sep_id,
                              "mask": tokenizer.mask_id},
              "ids_offset": HEADER_BYTES, "offsets_offset": offsets_offset,
              "file_size": offsets_offset + offsets.nbytes}
    f.seek(0)
    body = json.dumps(header, sort_keys=True).encode("utf-8")
    room = HEADER_BYTES - len(MAGIC) - 1
    if len(body) > room:
        raise ValueError(f"token-file header too long ({len(body)} > {room} bytes)")
    f.write(MAGIC + body + b" " * (room - len(body)) + b"\n")


def _documents(source, out_path: Path) -> Iterator[str]:
    """Yield the documents of `source` (see `tokenize_to_memmap`), refusing a text file
    that is `out_path` itself: the token file would replace the text when renamed."""
    if isinstance(source, Documents):  # documents already: none of them is a file name
        for path in source.files:
            _check_not_output(path, out_path)
        yield from source
        return
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            hint = (" (a single str is read as a file name; to tokenize one text, pass [text])"
                    if isinstance(source, str) else "")
            raise FileNotFoundError(f"tokenize_to_memmap: no such file: {str(source)!r}{hint}")
        source = [Path(source)]
    n = 0
    for item in source:
        n += 1
        if isinstance(item, os.PathLike):
            path = Path(item)
        elif isinstance(item, str):
            path = text_file_named(item)  # raises on a path-like str that names no file
            if path is None:
                yield item
                continue
        else:
            raise TypeError(f"tokenize_to_memmap: items must be str (a document or a file "
                            f"name) or pathlib.Path (a text file), got {type(item).__name__}")
        _check_not_output(path, out_path)
        logger.info("tokenize_to_memmap: reading the documents of %s", path)
        yield from iter_documents(path)
    if n == 0:
        raise ValueError("the corpus given to tokenize_to_memmap is empty (no files or texts)")


def _check_not_output(text_file: Path, out_path: Path) -> None:
    if out_path.exists() and os.path.samefile(text_file, out_path):
        raise ValueError(f"tokenize_to_memmap: out_path {out_path} is the text file it reads; "
                         f"the token file would replace the text. Give another out_path")
