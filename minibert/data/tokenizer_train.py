"""Training a WordPiece vocabulary: what `Tokenizer.train` and `train_from_iterator` do.

The Rust WordPiece trainer counts and merges. Around it: a cache keyed by the corpus bytes
and the settings; the same vocabulary in every process (the trainer numbers its "##" pieces
and cuts its alphabet in a per-process hash order that breaks ties between equal merges, so
both are chosen here in code-point order, `_TrainingInput`); no training on words over
WordPiece's length limit; the normalizer run in Python (`minibert.data.normalize`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union

import tokenizers
from tokenizers import trainers

from ..atomic import PathLike
from .normalize import PythonNormalizer
from .special_tokens import SPECIAL_TOKENS
from .text import iter_lines, text_file_named

# The Tokenizer class is passed in as `cls`, so that the two modules do not import each other.
TokenizerT = TypeVar("TokenizerT")

logger = logging.getLogger(__name__)


# Bumped whenever training changes, so that cached vocabularies are stale.
_CACHE_FORMAT = 3

CONTINUING = "##"  # WordPiece's mark of a piece that continues a word


def default_cache_dir() -> Path:
    """`$MINIBERT_CACHE` if set, else `~/.cache/minibert`."""
    env = os.environ.get("MINIBERT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minibert"


def train_on_files(cls: type[TokenizerT], files: Union[PathLike, Sequence[PathLike]],
                   vocab_size: int, *, use_cache: bool, **settings: Any) -> TokenizerT:
    """`Tokenizer.train`: every file must exist; the cache key hashes their bytes."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("Tokenizer.train got no files; pass at least one text file")
    for f, p in zip(files, paths):
        if not p.is_file():
            texts = isinstance(f, str) and text_file_named(f) is None  # raises if path-like
            raise FileNotFoundError(f"Tokenizer.train: training file not found: {p}" + (
                "; Tokenizer.train reads files, to train on texts in memory use "
                "Tokenizer.train_from_iterator(texts)" if texts else ""))

    def chunks() -> Iterator[bytes]:
        for p in paths:
            with open(p, "rb") as f:
                while block := f.read(1 << 22):
                    yield block
            yield b"\0"  # file boundary, so ["ab", "c"] and ["a", "bc"] differ

    return _train(cls, lambda: (line for p in paths for line in iter_lines(p)),
                  chunks if use_cache else None, vocab_size, **settings)


def train_on_texts(cls: type[TokenizerT], texts: Iterable[str], vocab_size: int, *,
                   use_cache: bool, **settings: Any) -> TokenizerT:
    """`Tokenizer.train_from_iterator`: texts that can be read twice (a list, or a split of
    `load_corpus`, which streams from disk) are hashed for the cache, then trained on; an
    iterator can be read once only, so it is trained on without the cache."""
    if isinstance(texts, str):
        raise TypeError("train_from_iterator expects an iterable of strings, not one string")
    can_cache = use_cache and iter(texts) is not texts  # not an iterator: can be read again
    chunks = (lambda: (t.encode("utf-8", errors="replace") + b"\0" for t in texts)) \
        if can_cache else None
    return _train(cls, lambda: iter(texts), chunks, vocab_size, **settings)


def _train(cls: type[TokenizerT], make_texts: Callable[[], Iterable[str]],
           make_chunks: Optional[Callable[[], Iterator[bytes]]], vocab_size: int, *,
           lowercase: bool, min_frequency: int, limit_alphabet: int,
           cache_dir: Optional[PathLike]) -> TokenizerT:
    n_special = len(SPECIAL_TOKENS)
    if not isinstance(vocab_size, int) or vocab_size <= n_special:
        raise ValueError(f"vocab_size={vocab_size!r} is too small: it must exceed the "
                         f"{n_special} special tokens {list(SPECIAL_TOKENS)} and leave room "
                         f"for the alphabet")
    settings = dict(vocab_size=vocab_size, lowercase=lowercase, min_frequency=min_frequency,
                    limit_alphabet=limit_alphabet, format=_CACHE_FORMAT,
                    tokenizers=".".join(tokenizers.__version__.split(".")[:2]))
    cache_path = None
    if make_chunks is not None:
        h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
        for block in make_chunks():
            h.update(block)
        root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        cache_path = root / "tokenizers" / h.hexdigest()[:24]
        if (cache_path / "tokenizer.json").is_file():
            logger.info("reusing cached tokenizer %s", cache_path)
            return cls.from_pretrained(cache_path)
    backend = cls._bert_pipeline(None, lowercase, None)
    stats = _TrainingInput(backend)
    with tempfile.TemporaryDirectory(prefix="minibert-tokenizer-") as tmp:
        # Pass 1: the texts as the trainer will see them, counted and kept on disk for pass
        # 2, so that a one-shot iterator is read once and nothing is normalized twice.
        prepared = Path(tmp) / "texts.txt"
        with open(prepared, "w", encoding="utf-8") as f:
            for text in stats.texts(make_texts()):
                f.write(text.replace("\n", " ") + "\n")
        if stats.n_skipped:
            logger.warning("skipped %d words longer than %d characters (the longest had "
                           "%d): they would only ever encode as [UNK]", stats.n_skipped,
                           backend.model.max_input_chars_per_word, stats.longest)
        if not stats.any_text:
            raise ValueError("cannot train a tokenizer on an empty corpus (no non-blank text"
                             + (f" once {stats.n_skipped} over-long words were skipped)"
                                if stats.n_skipped else ")"))
        alphabet = stats.alphabet(limit_alphabet)
        continuing = [CONTINUING + c for c in alphabet if c in stats.continuing]
        # `continuing` ("##a", ...) numbered right after the specials, in sorted order.
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, initial_alphabet=alphabet,
            limit_alphabet=len(alphabet), special_tokens=list(SPECIAL_TOKENS) + continuing,
            continuing_subword_prefix=CONTINUING, show_progress=False)
        # Pass 2, on normalized texts, without the normalizer (the pipeline is rebuilt below).
        backend.normalizer = None
        with open(prepared, encoding="utf-8") as f:
            backend.train_from_iterator((line[:-1] for line in f), trainer)
    trained = backend.get_vocab(with_added_tokens=False)
    got = len(trained)
    if got > vocab_size:
        # The trainer never drops alphabet characters, so it overshoots instead.
        raise ValueError(
            f"vocab_size={vocab_size} is too small for this corpus: the {n_special} special "
            f"tokens plus the alphabet (each character alone and with '##') already need "
            f"{got} entries; raise vocab_size to at least {got}, or lower limit_alphabet "
            f"(now {limit_alphabet})")
    # The trainer numbered specials, "##" pieces (handed in as specials, so in sorted
    # order), alphabet, merges; laid out as BERT's vocabularies are (alphabet before "##"
    # pieces), with only BERT's five specials matched whole in raw text.
    order = sorted(trained, key=trained.__getitem__)
    pieces = slice(n_special, n_special + len(continuing))
    assert order[pieces] == continuing, "the trainer numbered the pieces unexpectedly"
    order = order[:n_special] + order[pieces.stop:pieces.stop + len(alphabet)] \
        + continuing + order[pieces.stop + len(alphabet):]
    backend = cls._bert_pipeline({t: i for i, t in enumerate(order)}, lowercase, None)
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tok = cls(backend)  # `_bert_pipeline` gave it BERT's template with the trained ids
    if cache_path is not None:
        tok._save_atomically(cache_path)
        logger.info("trained tokenizer (vocab %d) cached at %s", tok.vocab_size, cache_path)
    return tok


def normalized(texts: Iterable[str], backend: tokenizers.Tokenizer) -> Iterator[str]:
    """Each text as `backend`'s BERT normalizer makes it: by `minibert.data.normalize`, or
    the Rust normalizer where context matters."""
    fast, rust = PythonNormalizer.of(backend), backend.normalizer.normalize_str
    for text in texts:
        out = fast(text) if fast is not None else None
        yield out if out is not None else rust(text)


# Characters the BERT normalizer turns into spaces (ASCII whitespace and category Zs): only
# runs of other characters long enough to hold an over-long word need a look.
_SPACES = " \t\n\r\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"


class _TrainingInput:
    """The texts handed to the WordPiece trainer, minus over-long words, counted on their way. The
    trainer's cost grows with the square of the longest word (one base64 blob takes minutes, deaf to
    Ctrl-C), yet every word over `max_input_chars_per_word` encodes as `[UNK]`: such words are
    dropped. The counts choose, in a fixed order, the alphabet and the characters that continue a
    word (each a "##" piece). `backend`: the BERT pipeline, whose normalizer and pre-tokenizer say
    what a word is."""

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        self.backend = backend
        self.n_skipped, self.longest = 0, 0
        self.chars: Counter[str] = Counter()  # every character, with its count
        self.continuing: set[str] = set()  # characters seen after the first in a word
        self._kind: dict[str, str] = {}  # character -> "word", "punctuation" or "space"
        self._pending: Optional[re.Pattern] = None  # see _look_for_continuing

    def texts(self, texts: Iterable[str]) -> Iterator[str]:
        """`texts` normalized, without over-long words, each counted."""
        for text in normalized(self._without_long_words(texts), self.backend):
            self._count(text)
            yield text

    def alphabet(self, limit: int) -> list[str]:
        """The `limit` most frequent characters (ties to the lower code point), sorted: the
        trainer's rule, with its ties broken in a fixed order instead of a hash order."""
        chars = sorted(((c, n) for c, n in self.chars.items() if self._kind[c] != "space"),
                       key=lambda item: (-item[1], item[0]))
        return sorted(c for c, _ in chars[:limit])

    @property
    def any_text(self) -> bool:
        """Whether any text held a word (a corpus of blank lines has none)."""
        return any(k != "space" for k in self._kind.values())

    def _count(self, text: str) -> None:
        self.chars.update(text)
        new = set(text).difference(self._kind)
        for c in new:
            # The pre-tokenizer (BERT's: whitespace, and each punctuation mark alone) says
            # what `c` is: "aca" stays one word, or splits around it, or loses it.
            words = [w for w, _ in self.backend.pre_tokenizer.pre_tokenize_str(f"a{c}a")]
            self._kind[c] = "word" if len(words) == 1 else "space" if len(words) == 2 \
                else "punctuation"
        if new:
            self._look_for_continuing()
        if self._pending is not None and (found := set(self._pending.findall(text))):
            self.continuing |= found
            self._look_for_continuing()

    def _look_for_continuing(self) -> None:
        """A pattern for the word characters not yet seen continuing a word, each after a
        word character: most texts then need one scan that finds nothing."""
        pending = [c for c, k in self._kind.items() if k == "word" and c not in self.continuing]
        others = "".join(re.escape(c) for c, k in self._kind.items() if k != "word")
        after_a_word_char = f"(?<=[^{others}])" if others else "(?<=.)"
        self._pending = (re.compile(f"{after_a_word_char}[{''.join(map(re.escape, pending))}]",
                                    re.DOTALL) if pending else None)

    def _without_long_words(self, texts: Iterable[str]) -> Iterator[str]:
        max_chars = self.backend.model.max_input_chars_per_word
        # Normalization can lengthen a word (NFD splits a Hangul syllable into up to three
        # letters), so runs from a quarter of the limit on are checked by the pipeline.
        runs = re.compile(f"[^{_SPACES}]{{{max_chars // 4 + 1},}}")
        normalize = self.backend.normalizer.normalize_str
        pre_tokenize = self.backend.pre_tokenizer.pre_tokenize_str

        def without_long_words(run: re.Match) -> str:
            words = [w for w, _ in pre_tokenize(normalize(run.group()))]
            kept = [w for w in words if len(w) <= max_chars]
            if len(kept) == len(words):
                return run.group()
            self.n_skipped += len(words) - len(kept)
            self.longest = max(self.longest, *map(len, words))
            # Normalized already (again changes nothing); the trainer counts words, not order.
            return " " + " ".join(kept) + " "

        for text in texts:
            yield runs.sub(without_long_words, text)
