"""A pretraining corpus made ready once: read, the run's tokenizer fixed, each split tokenized.

How examples/pretrain_wikitext.py and examples/distill.py read their text. It writes:

    RUN/tokenizer/               the run's tokenizer (tokenizer.json, vocab.txt)
    RUN/tokenizer/SPLIT.key      the fingerprint of split SPLIT's text
    CACHE/tokens/TOK-KEY.tok     the split's token file (memmap), named by the tokenizer's
                                 fingerprint and the text's key: any run reuses it

`prepare_corpus` makes the token files (rank 0) and writes nothing into RUN, so that a run
refused after it leaves its folder as it was; `save_prepared` writes RUN's part once the run
holds its folder, `load_prepared` opens it. The run identity holds the keys.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from ..atomic import PathLike, write_files_atomically, writing
from .tokenizer import Tokenizer, default_cache_dir
from .corpus import SPLIT_FILES, Corpus, Documents, load_corpus
from .mlm import PackedMLMDataset
from .tokens import TokenFile, TokenFileError, tokenize_to_memmap
from .wikitext import download_wikitext

log = logging.getLogger(__name__)

# A new tokenizer is trained on a sample of at most this many characters of the train split,
# as SentencePiece samples (`input_sentence_size`): the vocabulary has long converged by then.
TOKENIZER_SAMPLE_CHARS = 100_000_000


@dataclass
class PreparedCorpus:
    """A run's corpus, ready: its tokenizer, each split as packed blocks, and each split's
    text key (`keys`: its token file's name in the cache, and part of the run identity)."""
    tokenizer: Tokenizer
    splits: dict[str, PackedMLMDataset]
    keys: dict[str, str]


def prepare_corpus(run_dir: PathLike, splits: Sequence[str], seq_len: int = 128, *,
                   data_dir: Optional[PathLike] = None, dataset: str = "wikitext-2-raw-v1",
                   cache_dir: Optional[PathLike] = None, init_from: Optional[PathLike] = None,
                   vocab_size: int = 8192, resume: bool = False,
                   corpus: Optional[Corpus] = None) -> PreparedCorpus:
    """Read the corpus, fix the run's tokenizer (`run_tokenizer`, trained on the first of `splits`)
    and tokenize `splits` into the token cache; return them opened, in blocks of `seq_len`.
    `data_dir`: a folder `load_corpus` reads (or `corpus`, it read already); None downloads
    `dataset` into `cache_dir` (default `default_cache_dir()`)."""
    run_dir = Path(run_dir)
    data_dir = data_dir or download_wikitext(dataset, cache_dir=cache_dir)
    if corpus is None:
        corpus = load_corpus(data_dir)  # refuses a folder whose text files it would not read
    for line in corpus.report(splits=False):  # the splits below, once, with their tokens
        log.info(line)
    check_splits(corpus, splits, data_dir)
    tok = run_tokenizer(run_dir, corpus.splits[splits[0]], init_from=init_from,
                        vocab_size=vocab_size, resume=resume, cache_dir=cache_dir)
    keys = {}
    for s in splits:
        docs = corpus.splits[s]
        keys[s] = docs.fingerprint
        path = token_file(tok, docs.fingerprint, cache_dir)
        if path.is_file():
            try:
                TokenFile.open(path, tok)
            except TokenFileError as e:  # a cache entry is only a copy: make it again
                log.warning("rebuilding the damaged cache file %s (%s)", path, e)
                path.unlink()
        if not path.is_file():
            log.info("tokenizing the %s split into %s", s, path)
            tokenize_to_memmap(docs, tok, path)
    data = open_prepared(tok, keys, seq_len, cache_dir)
    for s, block in data.splits.items():
        log.info("split %s: %s documents, %s characters, %s tokens", s,
                 f"{block.tokens.n_docs:,}", f"{corpus.splits[s].n_chars:,}",
                 f"{block.tokens.n_tokens:,}")
    return data


def open_prepared(tok: Tokenizer, keys: dict[str, str], seq_len: int,
                  cache_dir: Optional[PathLike] = None) -> PreparedCorpus:
    """The splits `prepare_corpus` tokenized with `tok` (every rank opens them), packed."""
    sets = {}
    for s, key in keys.items():
        tokens = TokenFile.open(token_file(tok, key, cache_dir), tok)
        try:
            sets[s] = PackedMLMDataset(tokens, seq_len)
        except ValueError as e:  # too short for one block: the split, not only its cache file
            raise ValueError(f"the {s} split: {e}") from None
    return PreparedCorpus(tok, sets, dict(keys))


def save_prepared(run_dir: PathLike, data: PreparedCorpus) -> None:
    """Write the run's part of `data` into `run_dir`: each split's key, and its tokenizer
    unless already there (a kill during a rewrite could leave a resumed run's truncated)."""
    folder = Path(run_dir) / "tokenizer"
    with writing(folder):
        if not (folder / "tokenizer.json").is_file():
            data.tokenizer.save(folder)
        write_files_atomically(folder, {f"{s}.key": key for s, key in data.keys.items()})


def check_splits(corpus: Corpus, splits: Sequence[str], data_dir: PathLike,
                 flags: Sequence[str] = ()) -> None:
    """Refuse a split the corpus lacks, naming those it has and `flags`, the flags for `splits`."""
    for s in splits:
        if s not in corpus.splits:
            how = (f"choose among those with {' and '.join(flags)}" if flags else
                   "choose the training and evaluation splits among those")
            if corpus.layout == SPLIT_FILES:  # a train.jsonl alone: its name says "train only"
                how += (", or name the files for no split (corpus.jsonl, ...) to hold every "
                        "20th document out as valid")
            raise FileNotFoundError(f"split {s!r} not found in {data_dir} (found: "
                                    f"{', '.join(sorted(corpus.splits))}); {how}")


def load_prepared(run_dir: PathLike, splits: Sequence[str], seq_len: int,
                  cache_dir: Optional[PathLike] = None) -> PreparedCorpus:
    """Open what `save_prepared` wrote into `run_dir`, each split packed."""
    folder = Path(run_dir) / "tokenizer"
    tok = Tokenizer.from_pretrained(folder)
    keys = {s: (folder / f"{s}.key").read_text() for s in splits}
    return open_prepared(tok, keys, seq_len, cache_dir)


def run_tokenizer(run_dir: PathLike, train_texts: Union[Documents, Iterable[str]], *,
                  init_from: Optional[PathLike] = None, vocab_size: int = 8192,
                  resume: bool = False, cache_dir: Optional[PathLike] = None) -> Tokenizer:
    """The run's tokenizer: a resumed run's (RUN/tokenizer), else `init_from`'s, else one of
    `vocab_size` trained on a sample of `train_texts`. One left in RUN by an earlier start
    is used only if it is the one this start makes, else the start is refused."""
    tok_dir = Path(run_dir) / "tokenizer"
    kept = tok_dir / "tokenizer.json"
    if resume and kept.is_file():  # compared with the checkpoint's by the engine
        return Tokenizer.from_pretrained(tok_dir)
    if init_from:
        tok, source = Tokenizer.from_pretrained(init_from), str(init_from)
    else:
        texts = train_texts
        if isinstance(train_texts, Documents):
            texts = train_texts.sample(TOKENIZER_SAMPLE_CHARS)
            if texts.k > 1:
                log.info("training the tokenizer on every %s document of %s (about %d MB of "
                         "%d): a vocabulary of %d needs no more text", _nth(texts.k),
                         train_texts.split, TOKENIZER_SAMPLE_CHARS // 10**6,
                         train_texts.n_chars // 10**6, vocab_size)
        tok = Tokenizer.train_from_iterator(texts, vocab_size=vocab_size, cache_dir=cache_dir)
        source = f"trained with --vocab-size {vocab_size}"
    if kept.is_file():
        old = Tokenizer.from_pretrained(tok_dir)
        if old.fingerprint != tok.fingerprint:
            raise FileExistsError(
                f"{tok_dir} holds a tokenizer (fingerprint {old.fingerprint[:16]}, "
                f"{old.vocab_size} tokens) that is not this run's ({tok.fingerprint[:16]}, "
                f"{tok.vocab_size} tokens, {source}); it was left by an earlier start: "
                f"delete {tok_dir} or choose another --out")
    return tok


def token_file(tok: Tokenizer, key: str, cache_dir: Optional[PathLike] = None) -> Path:
    """Where the text of key `key` tokenized by `tok` is cached, for whichever run asks."""
    return Path(cache_dir or default_cache_dir()) / "tokens" / f"{tok.fingerprint[:16]}-{key}.tok"


def _nth(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"
