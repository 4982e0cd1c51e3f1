"""A corpus folder, read the way its layout means, with a report of what was read.

A corpus file holds documents separated by blank lines (`.txt`, `.txt.gz`) or one JSON
object a line whose `text_field` is the document (`.jsonl`, `.jsonl.gz`). Three layouts:
- `wikitext`: WikiText's uncompressed split files (`wiki.train.raw`, `train.txt`, ...),
  read as articles, as WikiText is;
- `split files`: compressed or JSON Lines files named by their split (`train.txt.gz`,
  `valid.jsonl`, `validation.jsonl.gz`, `test.txt.gz`), each file's documents its split's;
- `text folder`: any other corpus files, every `holdout_every`-th document held out as
  `valid`.
A folder is of one layout only: one whose files would not all be read (a `valid.txt` beside
a `corpus_a.txt`, a `train.jsonl` beside a `notes.txt`) is refused, naming them, and what
each file gave is reported. A split is a `Documents` stream, read from disk at each pass
(decompressing as it goes), so a corpus may be far bigger than memory.
"""
from __future__ import annotations

import hashlib
import itertools
import math
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional

from ..atomic import PathLike
from ..paths import check_readable
from .text import (CORPUS_SUFFIXES, TEXT_FIELD, TEXT_SUFFIXES, check_enough_documents,
                   check_holdout_every, corpus_suffix, files_named, iter_documents,
                   iter_jsonl_documents, iter_lines)
from .wikitext import SPLITS, WIKITEXT_LAYOUTS, iter_articles

WIKITEXT, SPLIT_FILES, TEXT_FOLDER = "wikitext", "split files", "text folder"
# What a path given for a corpus is expected to be, for the message that finds nothing there.
CORPUS_FOLDER = "a WikiText folder or a folder of .txt, .txt.gz, .jsonl or .jsonl.gz files"
_SUFFIXES = tuple(dict.fromkeys(CORPUS_SUFFIXES + TEXT_SUFFIXES))  # every file a layout reads
# The split a split file's name (without its suffixes) gives it.
SPLIT_NAMES = {"train": "train", "valid": "valid", "validation": "valid", "test": "test"}


class CorpusFile(NamedTuple):
    """One file that was read: its split (`train+valid` for a text folder, whose
    documents are dealt to both), how many documents it gave and their characters."""
    path: Path
    split: str
    n_documents: int
    n_chars: int


class Documents:
    """The documents of one split, streamed from its files at each pass (a text folder's two splits
    read the same files, each keeping its own by index). `len()`, `n_chars` and `fingerprint` (the
    token cache's key) come from `load_corpus`'s scan."""

    def __init__(self, files: list[Path], layout: str, split: str,
                 holdout_every: Optional[int] = None, text_field: str = TEXT_FIELD) -> None:
        self.files, self.layout, self.split = list(files), layout, split
        self.holdout_every = holdout_every  # None: every document of the files
        self.text_field = text_field  # the field of a JSON Lines object that holds its text
        self.n_documents, self.n_chars, self.fingerprint = 0, 0, ""

    def __iter__(self) -> Iterator[str]:
        docs = (doc for path in self.files for doc in _read(path, self))
        for i, doc in enumerate(docs):  # both splits' documents, for a text folder
            if self.keeps(i):
                yield doc

    def keeps(self, i: int) -> bool:
        """Whether document `i` of the files (counted over all of them) is in this split."""
        return self.holdout_every is None or \
            ((i + 1) % self.holdout_every == 0) == (self.split == "valid")

    def __len__(self) -> int:
        return self.n_documents

    def sample(self, max_chars: int) -> "Iterable[str]":
        """Every k-th document, k the smallest that keeps about `max_chars` characters or
        fewer: a re-iterable sample spread over the whole split."""
        return _Every(self, max(1, math.ceil(self.n_chars / max_chars)))

    def __repr__(self) -> str:
        return (f"Documents({self.split!r}: {self.n_documents:,} documents, {self.n_chars:,} "
                f"characters in {len(self.files)} file(s))")


class _Every:
    """Every `k`-th document of `docs`, re-iterable (see `Documents.sample`)."""

    def __init__(self, docs: Documents, k: int) -> None:
        self.docs, self.k = docs, k

    def __iter__(self) -> Iterator[str]:
        return itertools.islice(iter(self.docs), 0, None, self.k)


class Corpus(NamedTuple):
    """What `load_corpus` read: `splits` maps a split name to its `Documents`."""
    path: Path  # the folder the files are in
    layout: str  # "wikitext", "split files" or "text folder"
    splits: dict[str, Documents]
    files: list[CorpusFile]

    def report(self, splits: bool = True) -> list[str]:
        """Lines for a log: the folder, one line per file read, then one per split (unless
        not `splits`: prepare.py says each split once, when it knows its tokens too)."""
        lines = [f"{self.layout} corpus in {self.path}: {len(self.files)} files"]
        lines += [f"  {f.path} -> {f.split}: {f.n_documents:,} documents, "
                  f"{f.n_chars:,} characters" for f in self.files]
        if splits:
            lines += [f"  split {name}: {len(docs):,} documents, {docs.n_chars:,} characters"
                      for name, docs in self.splits.items()]
        return lines


def load_corpus(path: PathLike, *, holdout_every: int = 20,
                text_field: str = TEXT_FIELD) -> Corpus:
    """Read the corpus in folder `path` (or in its one subfolder with corpus files), as
    WikiText (exactly the splits of one layout), as split files (only files named by their
    split) or as a text folder (only other corpus files, every `holdout_every`-th document
    held out as `valid`); anything else, where some files would go unread, raises a
    `ValueError` listing them. `text_field`: the field of a JSON Lines object that holds its
    document. `corpus.report()` gives the log lines."""
    root = Path(path).expanduser()
    check_readable(root, expected=CORPUS_FOLDER)  # a loop, a link to nothing, ... named
    if not root.is_dir():
        raise NotADirectoryError(
            f"load_corpus reads a folder, and {root} is a file: pass the folder it is in, or "
            f"put it in a folder of its own to read it alone")
    check_holdout_every(holdout_every)
    files = _text_files(root)
    subfolders = sorted(d for d in root.iterdir()
                        if d.is_dir() and not d.name.startswith(".") and _text_files(d))
    if not files:
        if not subfolders:
            raise FileNotFoundError(
                f"no text files in {root} nor in its subfolders: looked for "
                f"{', '.join('*' + s for s in _SUFFIXES)} (WikiText's "
                f"{', '.join(WIKITEXT_LAYOUTS[0].values())}, ... or any corpus files)")
        if len(subfolders) > 1:
            raise ValueError(
                f"{root} holds no text files itself, but several of its subfolders do: "
                f"{_names(subfolders, root, suffix='/')}; pass one of them")
        root, files = subfolders[0], _text_files(subfolders[0])
    elif subfolders:
        raise ValueError(
            f"{root} holds text files both itself ({_names(files, root)}) and in subfolders "
            f"({'; '.join(f'{d.name}/: ' + _names(_text_files(d), d) for d in subfolders)}); "
            f"load_corpus reads one folder, not its subfolders: move the files so that one "
            f"folder holds the whole corpus, or pass the folder to read")
    named = _split_files(root, files)  # {split: its files}, where they are named so
    layout = SPLIT_FILES if named else WIKITEXT
    named = named or {s: [p] for s, p in (_wikitext_layout(root, files) or {}).items()}
    if named:
        splits = {s: Documents(named[s], layout, s, text_field=text_field)
                  for s in SPLITS if s in named}
        read = _scan(list(splits.values()))
        if not any(len(d) for d in splits.values()):
            raise ValueError(f"the {layout} corpus in {root} holds no text: "
                             f"{_names([f.path for f in read], root)}")
        return Corpus(root, layout, splits, read)
    splits = {s: Documents(files, TEXT_FOLDER, s, holdout_every, text_field)
              for s in ("train", "valid")}
    read = _scan(list(splits.values()))
    check_enough_documents(sum(f.n_documents for f in read), holdout_every, root, len(files))
    return Corpus(root, TEXT_FOLDER, splits, read)


def _text_files(folder: Path) -> list[Path]:
    return files_named(folder, _SUFFIXES)


def _names(paths: list[Path], root: Path, limit: int = 8, suffix: str = "") -> str:
    shown = [str(p.relative_to(root)) + suffix for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(shown) + more


def _wikitext_layout(root: Path, files: list[Path]) -> dict[str, Path] | None:
    """`{split: file}` when `files` are exactly WikiText splits, None when none are;
    a ValueError when they mix with each other or with other text files."""
    names = {p.name for p in files}
    found = [{s: root / n for s, n in layout.items() if n in names} for layout in WIKITEXT_LAYOUTS]
    found = [f for f in found if f]
    if not found:
        stray = [p for p in files if not corpus_suffix(p)]
        if stray:
            raise ValueError(
                f"{root} looks like a text folder (.txt, .txt.gz, .jsonl or .jsonl.gz "
                f"files), but also holds {_names(stray, root)}, which is neither a corpus "
                f"file nor a WikiText split and would not be read: rename it to .txt, or "
                f"move it out")
        return None
    wiki = [p for f in found for p in f.values()]
    others = [p for p in files if p not in wiki]
    if len(found) > 1:
        layouts = " and ".join(_names(list(f.values()), root) for f in found)
        raise ValueError(
            f"{root} mixes WikiText layouts ({layouts}), so some files would go unread: "
            f"keep one layout per folder")
    if others:
        raise _mixed(root, "WikiText split", list(found[0].values()), others)
    return found[0]


def _split_files(root: Path, files: list[Path]) -> dict[str, list[Path]]:
    """`{split: files}` when `files` are compressed or JSON Lines files named by their split
    (`SPLIT_NAMES`), {} when none are; a ValueError when they lie beside other files, which
    no split would read. WikiText's names uncompressed (`train.txt`) are WikiText's."""
    named: dict[str, list[Path]] = {}
    for p in files:
        suffix = corpus_suffix(p) or ""
        if suffix not in ("", ".txt") and p.name[:-len(suffix)] in SPLIT_NAMES:
            named.setdefault(SPLIT_NAMES[p.name[:-len(suffix)]], []).append(p)
    others = [p for p in files if not any(p in paths for paths in named.values())]
    if named and others:
        plain = [p.name for p in others if corpus_suffix(p) == ".txt" and p.name[:-4] in
                 SPLIT_NAMES]  # WikiText's name: gzipped, it is a split file
        raise _mixed(root, "split", sorted(p for paths in named.values() for p in paths),
                     others, f"; or gzip the plain split file(s) {', '.join(plain)} too"
                     if plain else "")
    return named


def _mixed(root: Path, kind: str, named: list[Path], others: list[Path],
           hint: str = "") -> ValueError:
    """The refusal of a folder where the `kind` files `named` lie beside `others`."""
    first = named[0].name
    return ValueError(
        f"{root} mixes corpus layouts, so some files would go unread: the {kind} file(s) "
        f"{_names(named, root)} beside the other file(s) {_names(others, root)}. Move the "
        f"{kind} files into a folder of their own, or rename them (e.g. {first} to "
        f"my_{first}) to read every file as one text folder{hint}")


def _read(path: Path, docs: Documents) -> Iterator[str]:
    """The documents of one file of `docs`: WikiText articles, JSON Lines objects' texts, or
    blank-line separated documents."""
    if docs.layout == WIKITEXT:
        return iter_articles(iter_lines(path))
    if corpus_suffix(path) in (".jsonl", ".jsonl.gz"):
        return iter_jsonl_documents(path, docs.text_field)
    return iter_documents(path)


def _scan(splits: list[Documents]) -> list[CorpusFile]:
    """One streaming pass over the files of `splits` (shared by splits of the same files):
    count each split's documents and characters and hash its text."""
    hashes = {id(d): hashlib.blake2b(digest_size=8) for d in splits}
    groups: dict[tuple[Path, ...], list[Documents]] = {}
    for d in splits:
        groups.setdefault(tuple(d.files), []).append(d)
    files = []
    for paths, group in groups.items():
        i = 0  # the document's index over all the group's files, as `keeps` counts it
        for path in paths:
            n_file = chars_file = 0
            for doc in _read(path, group[0]):
                for d in group:
                    if d.keeps(i):
                        d.n_documents += 1
                        d.n_chars += len(doc)
                        # Each document's length before it: the same characters cut
                        # into other documents are another corpus, with other blocks.
                        text = doc.encode("utf-8", "surrogatepass")
                        hashes[id(d)].update(len(text).to_bytes(8, "little") + text)
                n_file, chars_file, i = n_file + 1, chars_file + len(doc), i + 1
            files.append(CorpusFile(path, "+".join(d.split for d in group), n_file, chars_file))
    for d in splits:
        d.fingerprint = hashes[id(d)].hexdigest()
    return files
