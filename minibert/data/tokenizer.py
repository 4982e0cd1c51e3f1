"""Tokenizer: BERT's WordPiece pipeline on the Rust `tokenizers` library.

BERT (Devlin et al. 2019) encodes in four stages, each a component of a
`tokenizers.Tokenizer` (docs/walkthrough.md, "6.1 WordPiece"): normalizer (clean, space CJK,
lowercase, strip accents), pre-tokenizer (whitespace and punctuation), WordPiece (greedy
longest-match-first, `##` continuations, words over 100 characters are `[UNK]`) and
post-processor (`[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]`). It is the pipeline transformers'
`BertTokenizerFast` builds from a `vocab.txt`, so any BERT vocabulary gives identical ids.
On top: cached training (`tokenizer_train`), loading, and for fine-tuning an `Encoding` per
text, pair or word list. Called as transformers' tokenizers are (`tokenizer_call`), and
read by transformers' names: `tokenize`, `decode`, `pad_token_id`, `save_pretrained`, ...
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
from .tokenizer_call import (TRUNCATION, BatchEncoding, CallOptions, Encoding, Text, pad_rows,
                             text_inputs)
from .tokenizer_files import (NO_MAX_LENGTH, checked_max_length, read_tokenizer_config,
                              read_vocab_txt, tokenizer_config_for)
from .tokenizer_train import PathLike, default_cache_dir, train_on_files, train_on_texts

__all__ = ["BatchEncoding", "Encoding", "Explanation", "SPECIAL_TOKENS", "Tokenizer",
           "default_cache_dir", "overflow_windows", "truncated_lengths", "wordpiece"]

logger = logging.getLogger(__name__)


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
        short_len, long_len = short, budget - short
    else:
        short_len, long_len = budget // 2, budget - budget // 2
    return (long_len, short_len) if swap else (short_len, long_len)


def overflow_windows(n: int, room: int, stride: int) -> list[tuple[int, int]]:
    """The (start, end) tokens of each window over a text of `n` tokens that fits `room` at a
    time: the first from 0, each next one `room - stride` tokens on, so that it repeats the
    last `stride` tokens of the one before (the context each token has in some window), the
    last one ending at n. transformers' `stride` with `return_overflowing_tokens` (tokenizers'
    `Encoding.truncate`), and BERT's doc_stride over a question's context."""
    if not 0 <= stride < room:
        raise ValueError(f"stride={stride} must be at least 0 and less than the {room} "
                         f"tokens a window holds, or windows would not move on")
    spans = [(0, min(room, n))]
    while spans[-1][1] < n:
        start = spans[-1][0] + room - stride
        spans.append((start, min(start + room, n)))
    return spans


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
        self._model_max_length: Optional[int] = None  # unknown (`model_max_length`)
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
    def from_pretrained(cls, path: PathLike, *, lowercase: Optional[bool] = None,
                        model_max_length: Optional[int] = None) -> "Tokenizer":
        """Load from a directory holding `tokenizer.json` (taken as is) or `vocab.txt`, or
        from that file; a `vocab.txt`'s casing comes from `lowercase`, else from the
        `tokenizer_config.json` beside it, else BERT's defaults. `model_max_length` comes
        from the argument, else from that `tokenizer_config.json` (which a model's folder
        holds), else it is unknown."""
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
        length = checked_max_length(model_max_length)
        config = read_tokenizer_config(path.parent / "tokenizer_config.json")
        length = length or config.get("model_max_length")
        if path.suffix == ".json":  # the casing is in the file; the model's length is not
            try:
                backend = tokenizers.Tokenizer.from_file(str(path))
            except Exception as e:  # the Rust side raises plain Exception on bad JSON
                raise ValueError(f"{path} is not a valid tokenizers JSON file: {e}") from e
            return _named(cls, backend, path, length)
        vocab = read_vocab_txt(path)
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
        return _named(cls, backend, path, length)

    # ------------------------------------------------------------------ saving
    def save(self, directory: PathLike, model_max_length: Optional[int] = None) -> Path:
        """Write `tokenizer.json`, `vocab.txt` and `tokenizer_config.json` (how transformers'
        `AutoTokenizer` normalises, and `model_max_length`, this tokenizer's unless given;
        none for a normaliser not BERT's) into `directory`; return it. Each file is written
        whole and renamed into place, `tokenizer.json` (the one `from_pretrained` prefers)
        last."""
        directory = Path(directory)
        write_files_atomically(directory, self._files(model_max_length))
        return directory

    def save_pretrained(self, save_directory: PathLike) -> tuple[str, ...]:
        """transformers' name for `save`: the same files, and their paths, as transformers
        returns them. transformers' `AutoTokenizer` and `from_pretrained` read the folder."""
        files = self._files(None)
        write_files_atomically(Path(save_directory), files)
        return tuple(str(Path(save_directory) / name) for name in files)

    def _files(self, model_max_length: Optional[int]) -> dict[str, str]:
        """The files `save` writes, by name, `tokenizer.json` last."""
        length = checked_max_length(model_max_length) or self._model_max_length
        vocab = sorted(self.backend.get_vocab().items(), key=lambda kv: kv[1])
        pipeline = self.backend.to_str(pretty=True)
        files = {"vocab.txt": "".join(t + "\n" for t, _ in vocab)}
        config = tokenizer_config_for(json.loads(pipeline).get("normalizer"), length)
        if config is not None:
            files["tokenizer_config.json"] = json.dumps(config, indent=2) + "\n"
        files["tokenizer.json"] = pipeline  # renamed last
        return files

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
                 add_special_tokens: bool = True, padding: Union[bool, str] = False,
                 truncation: Union[bool, str, None] = None, max_length: Optional[int] = None,
                 stride: int = 0, is_split_into_words: bool = False,
                 pad_to_multiple_of: Optional[int] = None, return_tensors: Optional[str] = None,
                 return_token_type_ids: bool = True, return_attention_mask: bool = True,
                 return_overflowing_tokens: bool = False,
                 return_offsets_mapping: bool = False) -> BatchEncoding:
        """Encode for the model as transformers' tokenizers do:
        `model(**tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt"))`.

        text: one str or a list of B; text_pair: the second text of each. With
            is_split_into_words=True, each text is a list of words (a CoNLL sentence).
        add_special_tokens: False leaves out [CLS] and [SEP].
        padding: True / "longest", "max_length", or False / "do_not_pad"; right, with [PAD],
            up to a multiple of pad_to_multiple_of where given.
        truncation: True / "longest_first" (`truncated_lengths`), "only_first",
            "only_second", or False; unset, a max_length without padding cuts.
        max_length: where to cut or pad to; unset, `model_max_length` where it is known.
        return_overflowing_tokens: also the windows the cut left out, each sharing `stride`
            tokens with the one before (`overflow_windows`), in rows of their own;
            `overflow_to_sample_mapping` says each row's text. For question answering:
            `tok(questions, contexts, truncation="only_second", max_length=384, stride=128,
            return_overflowing_tokens=True, return_offsets_mapping=True)`.
        return_offsets_mapping: each token's (start, end) characters in its text.
        return_tensors: "pt" (int64 tensors), "np", or None (lists); (B, T), or (1, T).
        return_token_type_ids: pass `model.config.has_segments` to leave them out (ModernBERT).

        Returns a `BatchEncoding` equal to transformers' from the folder `save` writes (but an
        empty text_pair beside one text stays an empty second segment)."""
        options = CallOptions.read(
            padding=padding, truncation=truncation, max_length=max_length, stride=stride,
            pad_to_multiple_of=pad_to_multiple_of, return_tensors=return_tensors,
            add_special_tokens=add_special_tokens, is_split_into_words=is_split_into_words,
            return_token_type_ids=return_token_type_ids,
            return_attention_mask=return_attention_mask,
            return_overflowing_tokens=return_overflowing_tokens,
            return_offsets_mapping=return_offsets_mapping, has_pair=text_pair is not None,
            model_max_length=self._model_max_length)
        inputs, single = text_inputs(text, text_pair, options.split_into_words)
        encoded = self.backend.encode_batch(inputs, is_pretokenized=options.split_into_words,
                                            add_special_tokens=options.special_tokens)
        rows, samples = [], []  # the rows, and the text of each (several where windows overflow)
        for i, enc in enumerate(encoded):
            windows = self._windows(enc, options.max_length if options.truncation else None,
                                    options.truncation or "longest_first", options.stride,
                                    options.overflow)
            rows += windows
            samples += [i] * len(windows)
        return pad_rows(rows, samples, self.pad_id, options, single)

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
        return self._windows(enc, max_length, truncation)[0]

    def _windows(self, enc: tokenizers.Encoding, max_length: Optional[int], truncation: str,
                 stride: int = 0, overflow: bool = False) -> list[Encoding]:
        """`enc` as `Encoding`s cut to fit `max_length`: the first, which keeps each text's
        first tokens, and with `overflow` the windows after it over the text that was cut,
        each sharing `stride` tokens with the one before (`overflow_windows`), each with the
        special tokens and the other text whole."""
        seq = enc.sequence_ids
        n = [seq.count(0), seq.count(1)]
        n_special = len(seq) - n[0] - n[1]
        if max_length is not None and (not isinstance(max_length, int)
                                       or max_length < n_special):
            raise ValueError(f"max_length={max_length!r} must be an int of at least "
                             f"{n_special}, the special tokens of this input")
        keep = truncated_lengths(n[0], n[1], len(seq) if max_length is None else
                                 max_length - n_special, truncation)
        fields = (enc.ids, enc.type_ids, enc.offsets, enc.word_ids, seq)
        if list(keep) == n:  # nothing to cut
            return [Encoding(*(list(field) for field in fields))]
        # (start, end) tokens kept of each text, per window. With overflow one text was cut:
        # the call refuses windows where longest_first may cut both texts of a pair.
        cut = 0 if keep[0] < n[0] else 1
        if (stride or overflow) and stride >= keep[cut]:  # tokenizers refuses it too
            raise ValueError(f"stride={stride} must be less than the {keep[cut]} tokens of "
                             f"text each window holds (max_length={max_length} less "
                             f"{n_special} special tokens{' and the other text' if n[1] else ''})"
                             f", or windows would not move on: lower stride or raise max_length")
        spans = overflow_windows(n[cut], keep[cut], stride) if overflow else [(0, keep[cut])]
        windows = []
        for span in spans:
            bounds = [(0, keep[0]), (0, keep[1])]
            bounds[cut] = span
            kept, seen = [], [0, 0]
            for t, s in enumerate(seq):
                if s is None or bounds[s][0] <= seen[s] < bounds[s][1]:
                    kept.append(t)
                if s is not None:
                    seen[s] += 1
            windows.append(Encoding(*([field[t] for t in kept] for field in fields)))
        return windows

    def encode_batch(self, texts: Sequence[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        """`encode` over many texts, in parallel threads on the Rust side."""
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a list of strings; use encode() for one string")
        # encode_batch_fast (tokenizers >= 0.20): the same ids, without character offsets.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, token_ids: Union[int, Iterable[int]],
               skip_special_tokens: bool = False) -> str:
        """Text for `token_ids` (a list, a 1-D tensor or array, or one id), with `##` pieces
        joined back into words. Special tokens are kept, as transformers keeps them, unless
        `skip_special_tokens=True` ("[CLS] the cat [SEP]", or "the cat")."""
        if not isinstance(skip_special_tokens, bool):
            raise TypeError(f"skip_special_tokens={skip_special_tokens!r} must be True or False")
        ids = [int(token_ids)] if _is_one_id(token_ids) else [int(i) for i in token_ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Iterable[Iterable[int]],
                     skip_special_tokens: bool = False) -> list[str]:
        """`decode` of each row of `sequences` (lists, or a (B, T) tensor or array)."""
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    # ---- transformers' names for the vocabulary and its special tokens -----------------------
    # (`pad_id`, `cls_id`, ... are minibert's own; the five tokens are always BERT's.)
    pad_token = property(lambda self: PAD, doc="The padding token, [PAD].")
    unk_token = property(lambda self: UNK, doc="The token of unknown pieces, [UNK].")
    cls_token = property(lambda self: CLS, doc="The first token of every input, [CLS].")
    sep_token = property(lambda self: SEP, doc="The token that ends each text, [SEP].")
    mask_token = property(lambda self: MASK, doc="The token masked language modelling hides "
                                                 "tokens behind, [MASK].")
    pad_token_id = property(lambda self: self.pad_id, doc="The id of [PAD] (`pad_id`).")
    unk_token_id = property(lambda self: self.unk_id, doc="The id of [UNK] (`unk_id`).")
    cls_token_id = property(lambda self: self.cls_id, doc="The id of [CLS] (`cls_id`).")
    sep_token_id = property(lambda self: self.sep_id, doc="The id of [SEP] (`sep_id`).")
    mask_token_id = property(lambda self: self.mask_id, doc="The id of [MASK] (`mask_id`).")

    @property
    def all_special_tokens(self) -> list[str]:
        """The five special tokens, in transformers' order."""
        return [UNK, SEP, PAD, CLS, MASK]

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of `all_special_tokens`, in its order."""
        return [self.unk_id, self.sep_id, self.pad_id, self.cls_id, self.mask_id]

    @property
    def model_max_length(self) -> int:
        """The most tokens the model takes: where `truncation` cuts and `padding="max_length"`
        pads when a call gives no max_length. A tokenizer loaded from a model's folder knows
        it (`tokenizer_config.json`, which `save_pretrained(path, tokenizer=tok)` writes);
        one trained here does not, and says int(1e30), transformers' value for none. Set it
        as transformers' (`tok.model_max_length = 512`)."""
        return NO_MAX_LENGTH if self._model_max_length is None else self._model_max_length

    @model_max_length.setter
    def model_max_length(self, value: Optional[int]) -> None:
        self._model_max_length = checked_max_length(value)

    def tokenize(self, text: str, pair: Optional[str] = None,
                 add_special_tokens: bool = False) -> list[str]:
        """The pieces of `text` (and `pair`), as strings: `["hello", ",", "wor", "##ld"]`;
        [CLS] and [SEP] only with `add_special_tokens=True`, as in transformers."""
        for name, value in (("text", text), ("pair", pair)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        return self.backend.encode(text, pair, add_special_tokens=add_special_tokens).tokens

    def convert_ids_to_tokens(self, ids: Union[int, Iterable[int]],
                              skip_special_tokens: bool = False) -> Union[str, list[str]]:
        """The token of one id, or the tokens of a list of ids (the special ones left out
        with `skip_special_tokens`); None for an id outside the vocabulary."""
        if _is_one_id(ids):
            return self.backend.id_to_token(int(ids))
        skip = set(self.special_ids) if skip_special_tokens else set()
        return [self.backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: Union[str, Iterable[str]]) -> Union[int, list[int]]:
        """The id of one token, or of each of a list; a token not in the vocabulary is [UNK]."""
        if isinstance(tokens, str):
            found = self.backend.token_to_id(tokens)
            return self.unk_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        """Every token and its id."""
        return self.backend.get_vocab()

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


def _is_one_id(value: object) -> bool:
    """Whether `value` is one token id (an int, or a 0-d tensor or array), not a sequence."""
    return isinstance(value, int) or getattr(value, "ndim", None) == 0


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


def _named(cls: type[Tokenizer], backend: tokenizers.Tokenizer, path: Path,
           model_max_length: Optional[int]) -> Tokenizer:
    """`cls(backend)` with its model's length, its refusal of the vocabulary naming the file
    it came from."""
    try:
        tokenizer = cls(backend)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    tokenizer.model_max_length = model_max_length
    return tokenizer
