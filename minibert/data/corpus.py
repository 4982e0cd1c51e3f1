"""A corpus folder, read the way its layout means, with a report of what was read.

Two layouts exist (see `wikitext` and `text`):

* WikiText: the split files `wiki.{train,valid,test}.raw`, `wiki.{...}.tokens` or
  `{train,valid,test}.txt`, read as articles split at ` = Title = ` headings;
* a text folder: any other `*.txt` files, read as documents separated by blank
  lines, every `holdout_every`-th document held out as `valid`.

Guessing the layout from one file name is how a 964 KB `corpus_a.txt` once went
unread: a `valid.txt` beside it made the folder "WikiText", and training ran on
8,104 tokens without a word. So `load_corpus` reads a folder as WikiText only
when its text files are exactly WikiText splits, refuses any folder whose text files
it would not all read, and returns per file what it read, for the log.

A split is a `Documents` stream, not a list: iterating it reads the files again, one
document at a time, so preparing a corpus far bigger than memory (tokenizer training,
then tokenizing into a token file) needs memory for one batch of documents, not the corpus.
`load_corpus` itself makes one pass to count documents and characters and to fingerprint
each split.
"""
from __future__ import annotations

import hashlib
import itertools
import math
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional

from ..atomic import PathLike
from ..paths import check_readable
from .text import (TEXT_SUFFIXES, check_enough_documents, check_holdout_every, files_named,
                   iter_documents, iter_lines, text_folder_files)
from .wikitext import SPLITS, WIKITEXT_LAYOUTS, iter_articles


WIKITEXT, TEXT_FOLDER = "wikitext", "text folder"
# What a path given for a corpus is expected to be, for the message that finds nothing there.
CORPUS_FOLDER = "a WikiText folder or a folder of .txt files"


class CorpusFile(NamedTuple):
    """One file that was read: its split (`train+valid` for a text folder, whose
    documents are dealt to both), how many documents it gave and their characters."""

    path: Path
    split: str
    n_documents: int
    n_chars: int


class Documents:
    """The documents of one split, read from its files each time it is iterated.

    Iterating streams the files in order and holds one document at a time, so a split can
    be far bigger than memory; iterate it as often as needed (each pass reads the disk
    again). A text folder's two splits read the same files and each keeps its own
    documents by index: every `holdout_every`-th document is `valid`, the others `train`.
    `len()` (documents), `n_chars` and `fingerprint` (a hash of each document's length and
    text, the token cache's key) come from the scan `load_corpus` makes.
    """

    def __init__(self, files: list[Path], layout: str, split: str,
                 holdout_every: Optional[int] = None) -> None:
        self.files, self.layout, self.split = list(files), layout, split
        self.holdout_every = holdout_every  # None: every document of the files
        self.n_documents, self.n_chars, self.fingerprint = 0, 0, ""

    def __iter__(self) -> Iterator[str]:
        for i, doc in enumerate(self._all()):
            if self.keeps(i):
                yield doc

    def _all(self) -> Iterator[str]:
        """Every document of the files, both splits' for a text folder."""
        for path in self.files:
            yield from _read(path, self.layout)

    def keeps(self, i: int) -> bool:
        """Whether document `i` of the files (counted over all of them) is in this split."""
        if self.holdout_every is None:
            return True
        return ((i + 1) % self.holdout_every == 0) == (self.split == "valid")

    def __len__(self) -> int:
        return self.n_documents

    def sample(self, max_chars: int) -> "Iterable[str]":
        """Every k-th document, k the smallest that keeps about `max_chars` characters or
        fewer: a sample spread over the whole split (not its first files), read again at
        each pass like the split. The whole split when it is that small already."""
        every = max(1, math.ceil(self.n_chars / max_chars))
        return _Every(self, every)

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
    layout: str  # "wikitext" or "text folder"
    splits: dict[str, Documents]
    files: list[CorpusFile]

    def report(self) -> list[str]:
        """Lines for a log: the folder, one line per file read, then one per split."""
        lines = [f"{self.layout} corpus in {self.path}: {len(self.files)} files"]
        lines += [f"  {f.path} -> {f.split}: {f.n_documents:,} documents, "
                  f"{f.n_chars:,} characters" for f in self.files]
        lines += [f"  split {name}: {len(docs):,} documents, {docs.n_chars:,} characters"
                  for name, docs in self.splits.items()]
        return lines


def load_corpus(path: PathLike, *, holdout_every: int = 20) -> Corpus:
    """Read the corpus in folder `path`, as WikiText or as a text folder.

    The folder's text files (`.txt`, `.raw`, `.tokens`) decide:

    * exactly the splits of one WikiText layout (some splits may be missing):
      WikiText, with the splits found;
    * only other `.txt` files: a text folder, split into `train` and `valid`
      (every `holdout_every`-th document) as by `load_text_folder`;
    * anything else (WikiText splits beside other text files, two WikiText layouts,
      a `.raw` file among `.txt` files, text files in subfolders as well): a
      `ValueError` that lists what was found, since some files would go unread.

    A folder with no text files of its own but exactly one subfolder holding some
    (the cache folder `download_wikitext` extracts into) is read as that subfolder.
    Hidden subfolders and other files (`README`, `.zip`) are ignored.

    Example:

        corpus = load_corpus("data/")
        for line in corpus.report():
            logger.info(line)
        for doc in corpus.splits["train"]:  # read from disk, one document at a time
            ...
    """
    root = Path(path).expanduser()
    check_readable(root, expected=CORPUS_FOLDER)  # a loop, a link to nothing, ... named
    if not root.is_dir():
        raise NotADirectoryError(
            f"load_corpus reads a folder, and {root} is a file: pass the folder it is in, or "
            f"put it in a folder of its own to read it alone")
    check_holdout_every(holdout_every)
    files, subfolders = _text_files(root), _subfolders_with_text(root)
    if not files:
        if not subfolders:
            raise FileNotFoundError(
                f"no text files in {root} nor in its subfolders: looked for "
                f"{', '.join('*' + s for s in TEXT_SUFFIXES)} (WikiText's "
                f"{', '.join(WIKITEXT_LAYOUTS[0].values())}, ... or any .txt files)")
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
    layout = _wikitext_layout(root, files)
    if layout is not None:
        return _read_wikitext(root, layout)
    return _read_text_folder(root, files, holdout_every)


def _text_files(folder: Path) -> list[Path]:
    return files_named(folder, TEXT_SUFFIXES)


def _subfolders_with_text(folder: Path) -> list[Path]:
    return sorted(d for d in folder.iterdir()
                  if d.is_dir() and not d.name.startswith(".") and _text_files(d))


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
        stray = [p for p in files if p not in text_folder_files(root)]
        if stray:
            raise ValueError(
                f"{root} looks like a text folder (.txt files), but also holds "
                f"{_names(stray, root)}, which is neither .txt nor a WikiText split and would "
                f"not be read: rename it to .txt, or move it out")
        return None
    wiki = [p for f in found for p in f.values()]
    others = [p for p in files if p not in wiki]
    if len(found) > 1:
        layouts = " and ".join(_names(list(f.values()), root) for f in found)
        raise ValueError(
            f"{root} mixes WikiText layouts ({layouts}), so some files would go unread: "
            f"keep one layout per folder")
    if others:
        splits = _names(list(found[0].values()), root)
        first = next(iter(found[0].values())).name
        raise ValueError(
            f"{root} mixes corpus layouts, so some files would go unread: the WikiText "
            f"split file(s) {splits} beside the other text file(s) {_names(others, root)}. "
            f"Move the WikiText splits into a folder of their own, or rename them (e.g. "
            f"{first} to my_{first}) to read every .txt file as one text folder")
    return found[0]


def _read_wikitext(root: Path, layout: dict[str, Path]) -> Corpus:
    # train, valid, test, whatever the order of the files
    splits = {s: Documents([layout[s]], WIKITEXT, s) for s in SPLITS if s in layout}
    files = _scan(list(splits.values()))
    if not any(len(d) for d in splits.values()):
        raise ValueError(f"the WikiText files in {root} hold no text: "
                         f"{_names(list(layout.values()), root)}")
    return Corpus(root, WIKITEXT, splits, files)


def _read_text_folder(root: Path, paths: list[Path], holdout_every: int) -> Corpus:
    splits = {s: Documents(paths, TEXT_FOLDER, s, holdout_every) for s in ("train", "valid")}
    files = _scan(list(splits.values()))
    check_enough_documents(sum(f.n_documents for f in files), holdout_every, root, len(paths))
    return Corpus(root, TEXT_FOLDER, splits, files)


def _read(path: Path, layout: str) -> Iterator[str]:
    """The documents of one file: WikiText articles, or blank-line separated documents."""
    return iter_articles(iter_lines(path)) if layout == WIKITEXT else iter_documents(path)


def _scan(splits: list[Documents]) -> list[CorpusFile]:
    """One streaming pass over the files of `splits`: count each split's documents and
    characters and hash its text. Splits that read the same files (a text folder's two)
    share the pass, each keeping its own documents."""
    hashes = {id(d): hashlib.blake2b(digest_size=8) for d in splits}
    groups: dict[tuple[Path, ...], list[Documents]] = {}
    for d in splits:
        groups.setdefault(tuple(d.files), []).append(d)
    files = []
    for paths, group in groups.items():
        i = 0  # the document's index over all the group's files, as `keeps` counts it
        for path in paths:
            n_file = chars_file = 0
            for doc in _read(path, group[0].layout):
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
