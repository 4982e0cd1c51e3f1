"""Tokenizer: BERT's WordPiece pipeline on the Rust ``tokenizers`` library.

BERT (Devlin et al. 2019) turns text into ids in four stages, each of which is a
component of a ``tokenizers.Tokenizer``:

1. normalizer      clean control characters, put spaces around CJK characters,
                   lowercase and strip accents (NFD, drop combining marks);
2. pre-tokenizer   split on whitespace and punctuation;
3. model           WordPiece: greedy longest-match-first into vocabulary pieces,
                   non-initial pieces carry the ``##`` prefix, words longer than
                   100 characters become ``[UNK]``;
4. post-processor  ``[CLS] A [SEP]`` (and ``[CLS] A [SEP] B [SEP]`` for pairs).

This is the same pipeline transformers' ``BertTokenizerFast`` builds from a
``vocab.txt``, so a vocabulary from any BERT checkpoint gives identical ids. The
class below only adds what minibert needs on top: training with a content-keyed
cache, loading from the file layouts found in the wild, and the special ids.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from .data.text import iter_lines, text_file_named, write_files_atomically

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# Order matters for trained vocabularies: [PAD] must be id 0 so that zero-filled
# buffers are padding, as in every BERT checkpoint.
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)

# Bumped whenever training changes in a way that makes old cached vocabularies stale.
_CACHE_FORMAT = 2  # 2: words over the WordPiece length limit are not trained on


def default_cache_dir() -> Path:
    """``$MINIBERT_CACHE`` if set, else ``~/.cache/minibert``."""
    env = os.environ.get("MINIBERT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minibert"


class Tokenizer:
    """BERT WordPiece tokenizer.

    Build one with :meth:`train`, :meth:`train_from_iterator` or
    :meth:`from_pretrained`; wrapping an existing ``tokenizers.Tokenizer`` directly
    is also allowed, provided its vocabulary holds the five special tokens.

    Example::

        tok = Tokenizer.train(["train.txt"], vocab_size=8192)
        ids = tok.encode("Hello world")          # [CLS] hello world [SEP]
        tok.save("out/tokenizer")
    """

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        missing = [t for t in SPECIAL_TOKENS if backend.token_to_id(t) is None]
        if missing:
            raise ValueError(
                f"the tokenizer vocabulary lacks the special token(s) {missing}; a BERT "
                f"vocabulary needs all of {list(SPECIAL_TOKENS)}"
            )
        # Padding and truncation are the collator's job, not the tokenizer's: a
        # tokenizer.json from a checkpoint may carry settings that would silently
        # cut or pad every encoding.
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.pad_id: int = backend.token_to_id(PAD)
        self.unk_id: int = backend.token_to_id(UNK)
        self.cls_id: int = backend.token_to_id(CLS)
        self.sep_id: int = backend.token_to_id(SEP)
        self.mask_id: int = backend.token_to_id(MASK)

    # ------------------------------------------------------------------ building
    @staticmethod
    def _bert_pipeline(vocab: Optional[dict], lowercase: bool, strip_accents: Optional[bool]):
        """An untrained (or vocab-loaded) ``tokenizers.Tokenizer`` wired like BERT."""
        backend = tokenizers.Tokenizer(
            models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100)
            if vocab is not None
            else models.WordPiece(unk_token=UNK, max_input_chars_per_word=100)
        )
        # strip_accents=None means "follow lowercase", BERT's own convention.
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents,
            lowercase=lowercase,
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        return backend

    def _attach_post_processor(self) -> None:
        cls, sep = (CLS, self.cls_id), (SEP, self.sep_id)
        self.backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[cls, sep],
        )

    @classmethod
    def train(
        cls,
        files: Union[PathLike, Sequence[PathLike]],
        vocab_size: int = 30522,
        *,
        lowercase: bool = True,
        min_frequency: int = 2,
        limit_alphabet: int = 1000,
        cache_dir: Optional[PathLike] = None,
        use_cache: bool = True,
    ) -> "Tokenizer":
        """Train a WordPiece vocabulary on text files (UTF-8; bad bytes are replaced).

        ``files`` is one path or a sequence of them (``str`` or ``Path``), each an
        existing file; ``tokenize_to_memmap`` reads the same list as the same files.
        To train on texts in memory, use :meth:`train_from_iterator`.

        The result is cached under a key made of the files' bytes and the settings
        (in ``cache_dir``, default :func:`default_cache_dir`), so a second call on
        the same corpus loads it instead of training again. This also makes reruns
        reproducible: the trainer breaks ties between equally frequent pieces in
        hash order, so two fresh trainings can differ in a few entries and ids.
        """
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        paths = [Path(f) for f in files]
        if not paths:
            raise ValueError("Tokenizer.train got no files; pass at least one text file")
        for f, p in zip(files, paths):
            if not p.is_file():
                texts = isinstance(f, str) and text_file_named(f) is None  # raises if path-like
                raise FileNotFoundError(
                    f"Tokenizer.train: training file not found: {p}" + (
                        "; Tokenizer.train reads files, to train on texts in memory use "
                        "Tokenizer.train_from_iterator(texts)" if texts else ""))

        def chunks() -> Iterator[bytes]:
            for p in paths:
                with open(p, "rb") as f:
                    while block := f.read(1 << 22):
                        yield block
                yield b"\0"  # file boundary, so ["ab", "c"] and ["a", "bc"] differ

        def lines() -> Iterator[str]:
            for p in paths:
                yield from iter_lines(p)

        return cls._train(lines, chunks if use_cache else None, vocab_size, lowercase,
                          min_frequency, limit_alphabet, cache_dir)

    @classmethod
    def train_from_iterator(
        cls,
        texts: Iterable[str],
        vocab_size: int = 30522,
        *,
        lowercase: bool = True,
        min_frequency: int = 2,
        limit_alphabet: int = 1000,
        cache_dir: Optional[PathLike] = None,
        use_cache: bool = True,
    ) -> "Tokenizer":
        """Train on an iterable of strings.

        Caching needs a second pass over the texts to compute the key, so it only
        applies to sequences (lists, tuples); a one-shot generator is trained on
        directly.
        """
        if isinstance(texts, str):
            raise TypeError("train_from_iterator expects an iterable of strings, not one string")
        can_cache = use_cache and isinstance(texts, Sequence)

        def chunks() -> Iterator[bytes]:
            for t in texts:
                yield t.encode("utf-8", errors="replace") + b"\0"

        return cls._train(lambda: iter(texts), chunks if can_cache else None, vocab_size,
                          lowercase, min_frequency, limit_alphabet, cache_dir)

    @classmethod
    def _train(cls, make_texts, make_chunks, vocab_size, lowercase, min_frequency,
               limit_alphabet, cache_dir) -> "Tokenizer":
        n_special = len(SPECIAL_TOKENS)
        if not isinstance(vocab_size, int) or vocab_size <= n_special:
            raise ValueError(
                f"vocab_size={vocab_size!r} is too small: it must exceed the {n_special} "
                f"special tokens {list(SPECIAL_TOKENS)} and leave room for the alphabet"
            )
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
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, limit_alphabet=limit_alphabet,
            special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
            show_progress=False,
        )
        stats = _TrainingInput()
        # A second, identical pipeline decides what a word is: the one being trained is
        # locked by the Rust trainer while it pulls texts, so calling into it deadlocks.
        words_like = cls._bert_pipeline(None, lowercase, None)
        backend.train_from_iterator(stats.texts(make_texts(), words_like), trainer)
        if stats.n_skipped:
            logger.warning("skipped %d words longer than %d characters (the longest had %d): "
                           "they would only ever encode as [UNK]", stats.n_skipped,
                           backend.model.max_input_chars_per_word, stats.longest)
        if not stats.any_text:
            raise ValueError("cannot train a tokenizer on an empty corpus (no non-blank text"
                             + (f" once {stats.n_skipped} over-long words were skipped)"
                                if stats.n_skipped else ")"))
        got = backend.get_vocab_size()
        if got > vocab_size:
            # The trainer never drops alphabet characters, so it overshoots instead.
            raise ValueError(
                f"vocab_size={vocab_size} is too small for this corpus: the {n_special} special "
                f"tokens plus the alphabet (each character alone and with '##') already need "
                f"{got} entries; raise vocab_size to at least {got}, or lower limit_alphabet "
                f"(now {limit_alphabet})"
            )
        tok = cls(backend)
        tok._attach_post_processor()
        if cache_path is not None:
            tok._save_atomically(cache_path)
            logger.info("trained tokenizer (vocab %d) cached at %s", tok.vocab_size, cache_path)
        return tok

    @classmethod
    def from_pretrained(cls, path: PathLike, *, lowercase: Optional[bool] = None) -> "Tokenizer":
        """Load from a directory holding ``tokenizer.json`` or ``vocab.txt``, or from that file.

        For ``vocab.txt`` the casing comes from ``lowercase`` if given, else from
        ``do_lower_case`` / ``strip_accents`` in a ``tokenizer_config.json`` next to
        it (as in transformers checkpoints), else BERT's default: lowercase.
        """
        path = Path(path).expanduser()
        if path.is_dir():
            for name in ("tokenizer.json", "vocab.txt"):
                if (path / name).is_file():
                    path = path / name
                    break
            else:
                raise FileNotFoundError(
                    f"no tokenizer in {path}: looked for tokenizer.json and vocab.txt"
                )
        elif not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")

        if path.suffix == ".json":
            try:
                backend = tokenizers.Tokenizer.from_file(str(path))
            except Exception as e:  # the Rust side raises plain Exception on bad JSON
                raise ValueError(f"{path} is not a valid tokenizers JSON file: {e}") from e
            return cls(backend)

        vocab = _read_vocab_txt(path)
        strip_accents = None
        config = path.parent / "tokenizer_config.json"
        if lowercase is None and config.is_file():
            cfg = json.loads(config.read_text(encoding="utf-8"))
            lowercase = cfg.get("do_lower_case")
            strip_accents = cfg.get("strip_accents")
        lowercase = True if lowercase is None else lowercase
        backend = cls._bert_pipeline(vocab, lowercase, strip_accents)
        # BertTokenizerFast registers the specials as added tokens, so they are
        # matched whole in the raw text ("[MASK]" in a sentence stays one token).
        backend.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
        tok = cls(backend)
        tok._attach_post_processor()
        return tok

    # ------------------------------------------------------------------ saving
    def save(self, directory: PathLike) -> Path:
        """Write ``tokenizer.json`` and ``vocab.txt`` into ``directory``; return it.

        Each file is written in full under a temporary name, flushed to disk and only
        then renamed over the old one, so a crash or a full disk mid-save leaves the
        previous files whole rather than a truncated ``tokenizer.json`` that no longer
        loads. ``tokenizer.json`` is renamed last: it is the file :meth:`from_pretrained`
        prefers, so until that rename the directory still loads as the old tokenizer.
        """
        directory = Path(directory)
        vocab = sorted(self.backend.get_vocab().items(), key=lambda kv: kv[1])
        write_files_atomically(directory, {  # in this order: tokenizer.json last
            "vocab.txt": "".join(t + "\n" for t, _ in vocab),
            "tokenizer.json": self.backend.to_str(pretty=True),
        })
        return directory

    def _save_atomically(self, directory: Path) -> None:
        """Save into a temporary sibling, then rename, so readers never see half a cache."""
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=directory.parent))
        try:
            self.save(tmp)
            os.replace(tmp, directory)
        except OSError:
            # Another process won the race and the entry already exists: keep theirs.
            shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------ using
    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self.backend.get_vocab_size()

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of ``[PAD] [UNK] [CLS] [SEP] [MASK]``, in that order."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    @property
    def fingerprint(self) -> str:
        """A short hash of the full pipeline (vocabulary, normalizer, ...).

        Two tokenizers with the same fingerprint map every text to the same ids;
        token files record it so that ids are never read with the wrong vocabulary.
        """
        return hashlib.sha256(self.backend.to_str().encode("utf-8")).hexdigest()[:16]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of ``text``, as ``[CLS] ... [SEP]`` unless ``add_special_tokens=False``."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        """:meth:`encode` over many texts, in parallel threads on the Rust side."""
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a list of strings; use encode() for one string")
        # encode_batch_fast (tokenizers >= 0.20) gives the same ids but skips the
        # character offsets that minibert never uses: ~15% faster.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        encs = encode(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encs]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text for ``ids``, with ``##`` pieces joined back into words."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    def id_to_token(self, idx: int) -> Optional[str]:
        return self.backend.id_to_token(idx)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint})"


# Characters the BERT normalizer turns into spaces (ASCII whitespace and Unicode's
# space separators, category Zs). Every word the trainer sees lies inside a run of
# other characters, so only runs long enough to hold an over-long word need a look.
_SPACES = " \t\n\r\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"


class _TrainingInput:
    """The texts handed to the WordPiece trainer, minus words it would waste time on.

    The trainer's cost grows with the square of the longest word, so one 400,000
    character line (a base64 blob, a table flattened without spaces) takes minutes
    and ignores Ctrl-C meanwhile. Yet the WordPiece model maps every word over
    ``max_input_chars_per_word`` characters (100) to ``[UNK]``, so such words add
    nothing to the vocabulary that encoding could ever use: they are dropped here.
    """

    def __init__(self) -> None:
        self.any_text = False  # to refuse a corpus of blank lines
        self.n_skipped = 0
        self.longest = 0

    def texts(self, texts: Iterable[str], backend: tokenizers.Tokenizer) -> Iterator[str]:
        """``texts`` without over-long words; ``backend``: a pipeline not being trained."""
        max_chars = backend.model.max_input_chars_per_word
        # Normalization can lengthen a word (NFD splits a Hangul syllable into up to
        # three letters), so runs from a quarter of the limit on are checked, with the
        # pipeline's own normalizer and pre-tokenizer deciding what a word is.
        runs = re.compile(f"[^{_SPACES}]{{{max_chars // 4 + 1},}}")
        normalize = backend.normalizer.normalize_str
        pre_tokenize = backend.pre_tokenizer.pre_tokenize_str

        def without_long_words(run: re.Match) -> str:
            words = [w for w, _ in pre_tokenize(normalize(run.group()))]
            kept = [w for w in words if len(w) <= max_chars]
            if len(kept) == len(words):
                return run.group()
            self.n_skipped += len(words) - len(kept)
            self.longest = max(self.longest, *map(len, words))
            # The kept words are already normalized; normalizing them again in the
            # trainer changes nothing, and the trainer only counts words, not order.
            return " " + " ".join(kept) + " "

        for text in texts:
            text = runs.sub(without_long_words, text)
            if text and not text.isspace():
                self.any_text = True
            yield text


def _read_vocab_txt(path: Path) -> dict[str, int]:
    """A BERT ``vocab.txt``: one token per line, the id is the line number (from 0).

    A token listed twice has no single id: transformers keeps its last line, and
    whichever line is kept, the vocabulary size no longer matches the highest id, so
    a re-saved ``vocab.txt`` would shift every id after it. Such a file is refused
    rather than guessed at. A UTF-8 byte order mark (added by some
    Windows editors) is not part of the first token.
    """
    lines: dict[str, list[int]] = {}
    for i, line in enumerate(iter_lines(path)):
        token = (line.removeprefix("\ufeff") if i == 0 else line).strip()
        lines.setdefault(token, []).append(i)
    repeated = [(t, ids) for t, ids in lines.items() if len(ids) > 1]
    if repeated:
        shown = "; ".join(
            f"{t!r} on lines {', '.join(str(i + 1) for i in ids[:-1])} and {ids[-1] + 1}"
            for t, ids in repeated[:5])
        more = f" (and {len(repeated) - 5} more)" if len(repeated) > 5 else ""
        raise ValueError(
            f"{path} lists a token more than once: {shown}{more}. A token's id is its line "
            f"number, so a repeated token has no single id. If the file belongs to a trained "
            f"model, replace the earlier line(s) with an unused placeholder such as "
            f"[unused99] so that no other id moves (transformers maps the token to its last "
            f"line); otherwise delete the extra line(s)."
        )
    return {t: ids[0] for t, ids in lines.items()}

