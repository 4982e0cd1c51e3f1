"""Tokenizer: BERT's WordPiece pipeline on the Rust `tokenizers` library.

BERT (Devlin et al. 2019) encodes in four stages, each a component of a
`tokenizers.Tokenizer` (docs/walkthrough.md, "6.1 WordPiece"): normalizer (clean, space CJK,
lowercase, strip accents), pre-tokenizer (whitespace and punctuation), WordPiece (greedy
longest-match-first, `##` continuations, words over 100 characters are `[UNK]`) and
post-processor (`[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]`). It is the pipeline transformers'
`BertTokenizerFast` builds from a `vocab.txt`, so any BERT vocabulary gives identical ids.
On top: cached training (`tokenizer_train`), loading, and for fine-tuning an `Encoding` per
text, pair or word list. Called as transformers' tokenizers are (`tokenizer_call`).
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Iterable, NamedTuple, Optional, Sequence, Union

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from ..atomic import publish_folder, write_files_atomically
from ..paths import check_readable, file_present
from .special_tokens import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK
from .tokenizer_call import TRUNCATION, BatchEncoding, CallOptions, Text, pad_rows, text_inputs
from .tokenizer_files import read_tokenizer_config, read_vocab_txt, tokenizer_config_for
from .tokenizer_train import PathLike, default_cache_dir, train_on_files, train_on_texts

__all__ = ["BatchEncoding", "Encoding", "Explanation", "SPECIAL_TOKENS", "Tokenizer",
           "default_cache_dir", "truncated_lengths", "wordpiece"]

logger = logging.getLogger(__name__)


class Encoding(NamedTuple):
    """A text, a text pair or a list of words, encoded: one entry per token in every field. Special
    tokens get offsets `(0, 0)` and word and sequence id `None`, as in transformers' fast
    tokenizers. `offsets` and `word_ids` count within the token's own text (for a pair, from 0 again
    in text b; for `encode_words`, within each word)."""
    input_ids: list[int]
    token_type_ids: list[int]  # the segment: 0 for [CLS] a [SEP], 1 for b [SEP]
    offsets: list[tuple[int, int]]  # (start, end) characters, end exclusive
    word_ids: list[Optional[int]]  # the word of its text that the token is (part of)
    sequence_ids: list[Optional[int]]  # 0: text a, 1: text b, None: special token


def truncated_lengths(n_a: int, n_b: int, budget: int,
                      truncation: str = "longest_first") -> tuple[int, int]:
    """How many tokens of texts a and b to keep so that together they fit in `budget`.

    `longest_first` is BERT's rule as `tokenizers` (and so transformers) applies it: take from the
    longer text until it is as short as the other, then from both in turn (in closed form below;
    the longer, b on a tie, keeps the odd token). `only_first` / `only_second` cut that text and
    raise when it would lose every token. Texts are cut at their end."""
    if truncation not in TRUNCATION:
        raise ValueError(f"truncation={truncation!r}; choose one of {', '.join(TRUNCATION)}")
    if n_a + n_b <= budget:
        return n_a, n_b
    if truncation != "longest_first":
        cut_a = truncation == "only_first"
        other = n_b if cut_a else n_a
        if other >= budget:
            raise ValueError(
                f"truncation={truncation!r} cannot fit the pair in {budget} tokens of text: "
                f"text {'b' if cut_a else 'a'} alone has {other}, which leaves no token of text "
                f"{'a' if cut_a else 'b'}; use 'longest_first' or a larger max_length")
        return (budget - n_b, n_b) if cut_a else (n_a, budget - n_a)
    short, swap = (n_b, True) if n_a > n_b else (n_a, False)
    if 2 * short <= budget:
        keep_short, keep_long = short, budget - short
    else:
        keep_short, keep_long = budget // 2, budget - budget // 2
    return (keep_long, keep_short) if swap else (keep_short, keep_long)


class Tokenizer:
    """BERT WordPiece tokenizer: build one with `train`, `train_from_iterator` or
    `from_pretrained`, or wrap a `tokenizers.Tokenizer` whose vocabulary holds the five
    special tokens. `Tokenizer.train(["train.txt"], vocab_size=8192).encode("Hello world")`
    gives the ids of `[CLS] hello world [SEP]`."""

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        missing = [t for t in SPECIAL_TOKENS if backend.token_to_id(t) is None]
        if missing:
            raise ValueError(f"the tokenizer vocabulary lacks the special token(s) {missing}; a "
                             f"BERT vocabulary needs all of {list(SPECIAL_TOKENS)}")
        if backend.post_processor is None:
            # Without one, encode() gives no [CLS] and [SEP]: a classifier would pool an
            # ordinary token and train on inputs BERT never saw, without any error.
            backend.post_processor = _bert_template(backend.token_to_id(CLS),
                                                    backend.token_to_id(SEP))
            logger.warning("the tokenizer has no post-processor, so its encodings would "
                           "lack [CLS] and [SEP]: attached BERT's template, [CLS] A [SEP] "
                           "and [CLS] A [SEP] B [SEP] (saving keeps it)")
        # Padding and truncation are asked for per call, never left in the backend: a
        # checkpoint's tokenizer.json may carry settings that would cut or pad every encoding.
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            backend.token_to_id(t) for t in (PAD, UNK, CLS, SEP, MASK))

    # ------------------------------------------------------------------ building
    @staticmethod
    def _bert_pipeline(vocab: Optional[dict], lowercase: bool, strip_accents: Optional[bool],
                       chinese_chars: bool = True) -> tokenizers.Tokenizer:
        """An untrained (or vocab-loaded) `tokenizers.Tokenizer` wired like BERT."""
        backend = tokenizers.Tokenizer(
            models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100))
        # strip_accents=None means "follow lowercase", BERT's own convention.
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents,
            lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        # The template, so `Tokenizer(backend)` finds one (untrained: the ids training gives).
        ids = vocab if vocab is not None else {t: i for i, t in enumerate(SPECIAL_TOKENS)}
        if CLS in ids and SEP in ids:  # else Tokenizer() refuses the vocabulary
            backend.post_processor = _bert_template(ids[CLS], ids[SEP])
        return backend

    @classmethod
    def train(cls, files: Union[PathLike, Sequence[PathLike]], vocab_size: int = 30522, *,
              lowercase: bool = True, min_frequency: int = 2, limit_alphabet: int = 1000,
              cache_dir: Optional[PathLike] = None, use_cache: bool = True) -> "Tokenizer":
        """Train a WordPiece vocabulary on text files (one path or several, strict UTF-8),
        cached under a key of their bytes and the settings in `cache_dir` (default
        `default_cache_dir()`); the same in every process (`tokenizer_train`)."""
        return train_on_files(cls, files, vocab_size, lowercase=lowercase,
                              min_frequency=min_frequency, limit_alphabet=limit_alphabet,
                              cache_dir=cache_dir, use_cache=use_cache)

    @classmethod
    def train_from_iterator(cls, texts: Iterable[str], vocab_size: int = 30522, *,
                            lowercase: bool = True, min_frequency: int = 2,
                            limit_alphabet: int = 1000, cache_dir: Optional[PathLike] = None,
                            use_cache: bool = True) -> "Tokenizer":
        """Train on an iterable of strings. The cache key needs a second pass, so only texts
        that can be read twice (a list, a split of `load_corpus`) are cached; a one-shot
        generator is trained on directly."""
        return train_on_texts(cls, texts, vocab_size, lowercase=lowercase,
                              min_frequency=min_frequency, limit_alphabet=limit_alphabet,
                              cache_dir=cache_dir, use_cache=use_cache)

    @classmethod
    def from_pretrained(cls, path: PathLike, *, lowercase: Optional[bool] = None) -> "Tokenizer":
        """Load from a directory holding `tokenizer.json` (taken as is) or `vocab.txt`, or
        from that file; a `vocab.txt`'s casing comes from `lowercase`, else from the
        `tokenizer_config.json` beside it, else BERT's defaults."""
        path = Path(path).expanduser()
        check_readable(path)  # a loop, a link to nothing, one that may not be read: named
        if path.is_dir():
            for name in ("tokenizer.json", "vocab.txt"):
                if file_present(path / name):  # a link to nothing is named, not passed over
                    path = path / name
                    break
            else:
                raise FileNotFoundError(
                    f"no tokenizer in {path}: looked for tokenizer.json and vocab.txt")
        elif not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        if path.suffix == ".json":
            try:
                backend = tokenizers.Tokenizer.from_file(str(path))
            except Exception as e:  # the Rust side raises plain Exception on bad JSON
                raise ValueError(f"{path} is not a valid tokenizers JSON file: {e}") from e
            return _named(cls, backend, path)
        vocab = read_vocab_txt(path)
        config = read_tokenizer_config(path.parent / "tokenizer_config.json")
        strip_accents = None
        if lowercase is None:
            lowercase = config.get("do_lower_case")
            strip_accents = config.get("strip_accents")
        lowercase = True if lowercase is None else lowercase
        backend = cls._bert_pipeline(vocab, lowercase, strip_accents,
                                     config.get("tokenize_chinese_chars") is not False)
        # BertTokenizerFast registers the specials as added tokens, so they are
        # matched whole in the raw text ("[MASK]" in a sentence stays one token).
        backend.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
        return _named(cls, backend, path)

    # ------------------------------------------------------------------ saving
    def save(self, directory: PathLike, model_max_length: Optional[int] = None) -> Path:
        """Write `tokenizer.json`, `vocab.txt` and `tokenizer_config.json` (how transformers'
        `AutoTokenizer` normalises, and `model_max_length`; none for a normaliser not BERT's)
        into `directory`; return it. Each file is written whole and renamed into place,
        `tokenizer.json` (the one `from_pretrained` prefers) last."""
        directory = Path(directory)
        vocab = sorted(self.backend.get_vocab().items(), key=lambda kv: kv[1])
        pipeline = self.backend.to_str(pretty=True)
        files = {"vocab.txt": "".join(t + "\n" for t, _ in vocab)}
        config = tokenizer_config_for(json.loads(pipeline).get("normalizer"), model_max_length)
        if config is not None:
            files["tokenizer_config.json"] = json.dumps(config, indent=2) + "\n"
        files["tokenizer.json"] = pipeline  # renamed last
        write_files_atomically(directory, files)
        return directory

    def _save_atomically(self, directory: Path) -> None:
        """Publish the cache entry `directory` whole (`atomic.publish_folder`)."""
        publish_folder(directory, self.save)

    # ------------------------------------------------------------------ using
    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self.backend.get_vocab_size()

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of `[PAD] [UNK] [CLS] [SEP] [MASK]`, in that order."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    @property
    def fingerprint(self) -> str:
        """A short hash of the full pipeline: equal fingerprints map every text to the same
        ids (token files record it, so ids are never read with another vocabulary)."""
        return hashlib.sha256(self.backend.to_str().encode("utf-8")).hexdigest()[:16]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`, as `[CLS] ... [SEP]` unless `add_special_tokens=False`."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: Text, text_pair: Optional[Text] = None, *,
                 padding: Union[bool, str] = False, truncation: Union[bool, str, None] = None,
                 max_length: Optional[int] = None, return_tensors: Optional[str] = None,
                 return_token_type_ids: bool = True) -> BatchEncoding:
        """Encode for the model as transformers' tokenizers do:
        `model(**tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt"))`.

        text: one str or a list of B; text_pair: the second text of each.
        padding: True / "longest", "max_length", or False / "do_not_pad"; right, with [PAD].
        truncation: True / "longest_first" (`truncated_lengths`), "only_first",
            "only_second", or False; unset, a max_length without padding cuts.
        max_length: needed to cut or pad to (`model.config.max_position_embeddings`).
        return_tensors: "pt" (int64 tensors), "np", or None (lists); (B, T), or (1, T).
        return_token_type_ids: pass `model.config.has_segments` to leave them out (ModernBERT).

        Returns a `BatchEncoding` equal to transformers' from the folder `save` writes (but an
        empty text_pair beside one text stays an empty second segment)."""
        options = CallOptions.read(padding, truncation, max_length, return_tensors,
                                   return_token_type_ids)
        inputs, single = text_inputs(text, text_pair)
        if options.truncation == "only_second" and text_pair is None:
            raise ValueError("truncation='only_second' cuts text_pair's texts, and there is "
                             "no text_pair: use truncation=True")
        rows = [self._encoding(enc, options.max_length if options.truncation else None,
                               options.truncation or "longest_first")
                for enc in self.backend.encode_batch(inputs)]
        return pad_rows([(r.input_ids, r.token_type_ids) for r in rows], self.pad_id, options,
                        single)

    def encode_with_offsets(self, text: str, max_length: Optional[int] = None) -> Encoding:
        """`[CLS] text [SEP]` with each token's characters and word, cut to `max_length`."""
        return self._encoding(self.backend.encode(text), max_length, "longest_first")

    def encode_pair(self, a: str, b: str, max_length: Optional[int] = None,
                    truncation: str = "longest_first") -> Encoding:
        """`[CLS] a [SEP] b [SEP]`, token types 0 then 1, at most `max_length` tokens cut as
        `truncation` says (`truncated_lengths`), as transformers' `BertTokenizerFast(a, b)`.
        For QA pass (question, context): `sequence_ids` 1 and `offsets` locate the context."""
        return self._encoding(self.backend.encode(a, b), max_length, truncation)

    def encode_words(self, words: Sequence[str], max_length: Optional[int] = None) -> Encoding:
        """`[CLS] pieces [SEP]` for text already split into words (a CoNLL sentence): `word_ids[t]`
        indexes `words`, as transformers' `is_split_into_words=True`."""
        if isinstance(words, str) or not all(isinstance(w, str) for w in words):
            raise TypeError("encode_words expects a list of strings (the words of one text)")
        return self._encoding(self.backend.encode(list(words), is_pretokenized=True),
                              max_length, "longest_first")

    def _encoding(self, enc: tokenizers.Encoding, max_length: Optional[int],
                  truncation: str) -> Encoding:
        """`enc` as an `Encoding`, its texts cut to fit `max_length` (here: not in the backend)."""
        seq = enc.sequence_ids
        n = [seq.count(0), seq.count(1)]
        n_special = len(seq) - n[0] - n[1]
        if max_length is not None and (not isinstance(max_length, int)
                                       or max_length < n_special):
            raise ValueError(f"max_length={max_length!r} must be an int of at least "
                             f"{n_special}, the special tokens of this input")
        keep = truncated_lengths(n[0], n[1], len(seq) if max_length is None else
                                 max_length - n_special, truncation)
        if list(keep) == n:  # nothing to cut
            return Encoding(enc.ids, enc.type_ids, enc.offsets, enc.word_ids, seq)
        kept, seen = [], [0, 0]
        for t, s in enumerate(seq):
            if s is None or seen[s] < keep[s]:
                kept.append(t)
            if s is not None:
                seen[s] += 1
        return Encoding(*([field[t] for t in kept] for field in
                          (enc.ids, enc.type_ids, enc.offsets, enc.word_ids, seq)))

    def encode_batch(self, texts: Sequence[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        """`encode` over many texts, in parallel threads on the Rust side."""
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a list of strings; use encode() for one string")
        # encode_batch_fast (tokenizers >= 0.20): the same ids, without character offsets.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text for `ids`, with `##` pieces joined back into words."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def explain(self, text: str) -> "Explanation":
        """Every stage of encoding `text`, to read (minGPT's `encode_and_show_work`): the
        normalized text, the pre-tokenizer's words, each word's pieces by `wordpiece` (the
        backend's own, tests/test_tokenizer.py checks) and the ids `encode` returns."""
        normalized = self.backend.normalizer.normalize_str(text)
        words = [w for w, _ in self.backend.pre_tokenizer.pre_tokenize_str(normalized)]
        vocab = self.backend.get_vocab()
        pieces = [wordpiece(w, vocab, max_chars=self.backend.model.max_input_chars_per_word)
                  for w in words]
        return Explanation(normalized, words, pieces, self.encode(text))

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    def id_to_token(self, idx: int) -> Optional[str]:
        return self.backend.id_to_token(idx)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint})"


class Explanation(NamedTuple):
    """The stages of `Tokenizer.explain`: normalised text, words, pieces per word, ids."""
    normalized: str
    words: list[str]
    pieces: list[list[str]]
    ids: list[int]


def wordpiece(word: str, vocab: dict[str, int], unk: str = UNK, prefix: str = "##",
              max_chars: int = 100) -> list[str]:
    """WordPiece on one pre-tokenized word: greedy longest-match-first (Schuster & Nakajima 2012;
    BERT's `WordpieceTokenizer`), the algorithm the Rust backend runs, in plain code.

    Take the longest vocabulary prefix, then from where it ended the longest continuation spelled
    with `prefix` ("##ing"), and so on. A position no piece matches makes the whole word `unk`; so
    does a word longer than `max_chars`."""
    if len(word) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):  # the longest candidate first
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:  # no piece starts here
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


def _bert_template(cls_id: int, sep_id: int) -> processors.TemplateProcessing:
    """BERT's post-processor: `[CLS] A [SEP]`, and `[CLS] A [SEP] B [SEP]` whose token type
    is 0 up to the first [SEP] and 1 after it, as in transformers' `BertTokenizerFast`."""
    return processors.TemplateProcessing(single=f"{CLS} $A {SEP}",
                                         pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
                                         special_tokens=[(CLS, cls_id), (SEP, sep_id)])


def _named(cls: type[Tokenizer], backend: tokenizers.Tokenizer, path: Path) -> Tokenizer:
    """`cls(backend)`, its refusal of the vocabulary naming the file it came from."""
    try:
        return cls(backend)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
