"""BERT's text normalizer run in Python ahead of the Rust pipeline: the same ids, faster.

The Rust `BertNormalizer` tracks every character's offset, which a token file never stores
(benchmarks/RESULTS.md, "Data preparation speed: BERT's normalizer in Python"). It works per
character, so it is asked once per distinct character, the answers kept in a table for
`str.translate`, and the normalized text encoded by a copy of the pipeline without a normalizer.
That is exact except where context matters; such documents take the Rust pipeline whole:

* NFD reorders runs of combining marks by their combining class. Stripping accents drops
  the nonspacing marks (Mn) afterwards, so only a combining mark that survives (a spacing
  mark of nonzero class such as U+1D165) could land elsewhere: a character whose normalized
  form holds one sends its document back. Keeping accents runs no NFD.
* Special tokens such as `[MASK]` are matched in the raw text: a document holding one,
  before or after normalizing, goes back too.

`tests/test_normalize.py` checks the ids against the Rust pipeline's on each case.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Optional, Sequence

import tokenizers
from tokenizers import normalizers

# Stands in for a character that must not be normalized alone; U+FFFF is a noncharacter,
# which BertNormalizer deletes, so no normalized text contains it otherwise.
_CONTEXT = "\uffff"
_NON_ASCII_RUNS = re.compile(r"([^\x00-\x7f]+)")


class _Table(dict):
    """Code point -> its normalized text (None: deleted), asked of the Rust normalizer once."""

    def __init__(self, normalize, nfd: bool) -> None:
        super().__init__()
        self.normalize, self.nfd = normalize, nfd

    def __missing__(self, code: int) -> Optional[str]:
        try:
            out = self.normalize(chr(code))
        except Exception:  # e.g. a lone surrogate: the Rust pipeline raises its own error
            out = _CONTEXT
        if _CONTEXT in out or (self.nfd and any(unicodedata.combining(c) for c in out)):
            out = _CONTEXT
        self[code] = out or None  # None: str.translate deletes the character
        return self[code]


class PythonNormalizer:
    """A pipeline's `BertNormalizer`, run per character through a table; `of(backend)` is
    None for any other normalizer (none else is known to work per character)."""

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        norm = backend.normalizer
        # BERT's convention: strip_accents=None follows lowercase; only stripping runs NFD.
        nfd = norm.strip_accents if norm.strip_accents is not None else norm.lowercase
        self.table = _Table(norm.normalize_str, nfd)
        self.specials = [t.content for t in backend.get_added_tokens_decoder().values()]
        self.special_starts = sorted({s[0] for s in self.specials if s})

    @classmethod
    def of(cls, backend: Optional[tokenizers.Tokenizer]) -> Optional["PythonNormalizer"]:
        if not isinstance(backend, tokenizers.Tokenizer) or \
                not isinstance(backend.normalizer, normalizers.BertNormalizer):
            return None
        return cls(backend)

    def __call__(self, text: str) -> Optional[str]:
        """`text` as the Rust normalizer would make it, or None where context matters."""
        if text.isascii():  # no ASCII character needs context
            out = text.translate(self.table)
        else:  # ASCII stretches take str.translate's fast path, the rest the slow one
            out = "".join(part.translate(self.table) for part in _NON_ASCII_RUNS.split(text))
            if _CONTEXT in out:
                return None
        if self._has_special(text) or self._has_special(out):
            return None
        return out

    def _has_special(self, text: str) -> bool:
        return (any(c in text for c in self.special_starts)
                and any(s in text for s in self.specials))


class FastEncoder:
    """`encode_batch` for a BERT pipeline: normalized by `PythonNormalizer`, then encoded by
    a copy of the pipeline without its normalizer (`of(backend)`: None where its is)."""

    def __init__(self, backend: tokenizers.Tokenizer, normalize: PythonNormalizer) -> None:
        self.backend, self.normalize = backend, normalize
        self.bare = tokenizers.Tokenizer.from_str(backend.to_str())
        self.bare.normalizer = None

    @classmethod
    def of(cls, backend: Optional[tokenizers.Tokenizer]) -> Optional["FastEncoder"]:
        normalize = PythonNormalizer.of(backend)
        return None if normalize is None else cls(backend, normalize)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        """The ids `backend.encode_batch(texts)` gives, in order."""
        normalized = [self.normalize(t) for t in texts]
        fast = [i for i, t in enumerate(normalized) if t is not None]
        slow = [i for i, t in enumerate(normalized) if t is None]
        ids: list = [None] * len(texts)
        for backend, rows, inputs in ((self.bare, fast, normalized), (self.backend, slow, texts)):
            if rows:
                encs = _encode_batch(backend)([inputs[i] for i in rows],
                                              add_special_tokens=add_special_tokens)
                for i, e in zip(rows, encs):
                    ids[i] = e.ids
        return ids


def _encode_batch(backend: tokenizers.Tokenizer):
    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets; same ids.
    return getattr(backend, "encode_batch_fast", backend.encode_batch)
