"""Masked-language-model examples and batches (docs/walkthrough.md, "6.3 Packing" and
"6.4 Masking as a pure function").

* `PackedMLMDataset` cuts the corpus into blocks `[CLS] t_1 ... t_{L-2} [SEP]` of exactly
  `seq_len` tokens, across documents with a `[SEP]` between them: RoBERTa's FULL-SENTENCES
  (Liu et al. 2019, section 4.2), so no compute goes to padding.
* `MLMCollator` pads and applies BERT's masking (Devlin et al. 2019, section 3.1): a fraction
  `p` of the ordinary tokens is selected, 80% of those become `[MASK]`, 10% a random token.
  Dynamic (Liu et al. 2019, section 4.1) yet reproducible: every random number is a hash of
  (seed, epoch, example index, position) (Salmon et al. 2011), so an example is masked alike
  by any process, micro-batch or resumed run: what makes accumulation, DDP and resume exact.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..labels import IGNORE_INDEX
from .tokens import TokenFile

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


# ------------------------------------------------------------------ packing
class PackedMLMDataset(torch.utils.data.Dataset):
    """Fixed-length `[CLS] ... [SEP]` blocks packed from a token file: each document's ids
    and one `[SEP]`, end to end, cut into bodies of `seq_len - 2` (the partial last one
    dropped), found from the document offsets. Item `i` is `{"input_ids": (seq_len,) int64,
    "index": i}`, the index `MLMCollator` keys its masking on."""

    def __init__(self, tokens: TokenFile, seq_len: int, tokenizer: Optional["Tokenizer"] = None):
        if not isinstance(seq_len, int) or seq_len < 3:
            raise ValueError(f"seq_len={seq_len!r} must be an int >= 3: a block needs [CLS], "
                             f"[SEP] and at least one token of text")
        if tokenizer is not None and tokenizer.fingerprint != tokens.fingerprint:
            raise ValueError(f"{tokens.path} was made by another tokenizer than the one given; "
                             f"re-prepare it with minibert.data.tokenize_to_memmap(...)")
        self.tokens, self.seq_len, self.body = tokens, seq_len, seq_len - 2
        specials = tokens.header["special_ids"]
        self.cls_id, self.sep_id = specials["cls"], specials["sep"]
        offsets = np.asarray(tokens.doc_offsets, dtype=np.int64)
        self._doc_start, self._doc_len = offsets[:-1], np.diff(offsets)
        # Start of document d in the stream with one [SEP] after every document.
        self._stream_start = offsets + np.arange(len(offsets), dtype=np.int64)
        self._n = int(self._stream_start[-1]) // self.body
        if self._n == 0:
            raise ValueError(f"{tokens.path} holds {tokens.n_tokens} tokens, not enough for one "
                             f"block of seq_len={seq_len}; use a larger corpus or a smaller "
                             f"seq_len")

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self._n:
            raise IndexError(f"block {i} out of range [0, {self._n})")
        pos = np.arange(i * self.body, (i + 1) * self.body, dtype=np.int64)
        doc = np.searchsorted(self._stream_start, pos, side="right") - 1
        local = pos - self._stream_start[doc]
        is_sep = local == self._doc_len[doc]  # the position just after a document
        src = self._doc_start[doc] + np.minimum(local, self._doc_len[doc] - 1)
        out = np.empty(self.seq_len, dtype=np.int64)
        out[0], out[-1] = self.cls_id, self.sep_id
        out[1:-1] = np.where(is_sep, self.sep_id, self.tokens.ids[src])
        return {"input_ids": out, "index": i}


# ------------------------------------------------------------------ batching
Example = Union[Sequence[int], np.ndarray, torch.Tensor, Mapping]


def check_pad_multiple(pad_to_multiple_of: Optional[int]) -> None:
    """A collator's `pad_to_multiple_of`: a positive int, or None for the longest sequence."""
    if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int)
                                           or pad_to_multiple_of < 1):
        raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive int "
                         f"or None (each batch padded to its longest sequence)")


def pad_batch(sequences: Sequence, pad_id: int, pad_to_multiple_of: Optional[int] = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id sequences: `(ids, lengths)`, `(B, T)` and `(B,)` int64, `T` the longest
    length rounded up to `pad_to_multiple_of` (tensor cores like multiples of 8)."""
    if len(sequences) == 0:
        raise ValueError("cannot collate an empty list of examples")
    arrays = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    if lengths.min() == 0:
        raise ValueError(f"example {int(lengths.argmin())} is empty; every example needs at "
                         f"least [CLS] and [SEP]")
    T = int(lengths.max())
    if pad_to_multiple_of:
        T = -(-T // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full((len(arrays), T), pad_id, dtype=np.int64)
    for row, a in zip(ids, arrays):
        row[:len(a)] = a
    return ids, lengths


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele et al. 2014): a bijective scrambling of uint64."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class MLMCollator:
    """Pad examples and mask them for masked-language modelling.

    mlm_probability: fraction of ordinary tokens selected, in (0, 1): BERT 0.15, MosaicBERT
        and ModernBERT 0.30. seed: with the epoch and example index, fixes every mask.
    whole_word_mask: select *words* (a piece and its `##` pieces), one 80/10/10 decision
        each, as the released BERT models' variant: `##ing` beside a visible `walk` is a
        shortcut. segments: False for a model without segment embeddings (ModernBERT).

    Called on id sequences holding `[CLS]`/`[SEP]`, or dicts with `input_ids` and `index`, it
    returns `(B, T)` int64 `input_ids`, `attention_mask`, `token_type_ids` and `labels` (-100 where
    not selected). Special tokens are never selected; an example with an ordinary token gets at
    least one. Without an index, an example's ids are its key. Call `set_epoch` before iterating
    (DataLoader workers copy the collator; avoid `persistent_workers=True`)."""

    def __init__(self, tokenizer: "Tokenizer", mlm_probability: float = 0.15,
                 pad_to_multiple_of: Optional[int] = None, *, seed: int = 0,
                 whole_word_mask: bool = False, segments: bool = True) -> None:
        if not isinstance(mlm_probability, (int, float)) or not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={mlm_probability!r} must lie strictly between 0 "
                             f"and 1 (BERT uses 0.15)")
        check_pad_multiple(pad_to_multiple_of)
        self.mlm_probability, self.pad_to_multiple_of = float(mlm_probability), pad_to_multiple_of
        self.seed, self.epoch = int(seed) % 2**64, 0  # any seed: the hash works on uint64
        self.pad_id, self.mask_id = tokenizer.pad_id, tokenizer.mask_id
        self.special_ids = np.array(sorted(set(tokenizer.special_ids)), dtype=np.int64)
        # Replacement tokens are drawn from the ordinary vocabulary only.
        self.ordinary_ids = np.setdiff1d(np.arange(tokenizer.vocab_size, dtype=np.int64),
                                         self.special_ids)
        self.whole_word_mask, self.segments = bool(whole_word_mask), bool(segments)
        # (V,) bool: which ids continue the word before them (WordPiece's "##" pieces).
        self.continues_word = np.array(
            [(tokenizer.id_to_token(i) or "").startswith("##")
             for i in range(tokenizer.vocab_size)] if whole_word_mask else [], dtype=bool)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __call__(self, examples: Sequence[Example], *, indices: Optional[Sequence[int]] = None,
                 epoch: Optional[int] = None) -> dict[str, torch.Tensor]:
        dicts = [ex if isinstance(ex, Mapping) else {"input_ids": ex} for ex in examples]
        seqs = [d["input_ids"] for d in dicts]
        keys = [d.get("index") for d in dicts]
        types = [d.get("token_type_ids") for d in dicts]
        ids, lengths = pad_batch(seqs, self.pad_id, self.pad_to_multiple_of)
        if indices is not None:
            if len(indices) != len(seqs):
                raise ValueError(f"got {len(indices)} indices for {len(seqs)} examples")
            keys = list(indices)
        keys = [int(k) if k is not None else _content_key(ids[b, :lengths[b]])
                for b, k in enumerate(keys)]
        epoch = self.epoch if epoch is None else int(epoch)
        input_ids, labels = self.mask(ids, lengths, np.array(keys, dtype=np.uint64), epoch)
        attention_mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        batch = {"input_ids": torch.from_numpy(input_ids),
                 "attention_mask": torch.from_numpy(attention_mask)}
        if self.segments:
            token_type_ids = np.zeros_like(ids)  # (B, T)
            for b, t in enumerate(types):
                if t is not None:
                    token_type_ids[b, :lengths[b]] = np.asarray(t, dtype=np.int64)
            batch["token_type_ids"] = torch.from_numpy(token_type_ids)
        batch["labels"] = torch.from_numpy(labels)
        return batch

    def mask(self, ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray, epoch: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """The masking itself, a pure function of its arguments and `self.seed`: `ids` (B, T)
        int64 padded, `lengths` (B,), `keys` (B,) uint64 example indices -> `(input_ids,
        labels)`, both (B, T) int64."""
        B, T = ids.shape
        with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
            epoch_key = _mix(np.uint64(epoch % 2**64))
            base = _mix(_mix(np.uint64(self.seed) ^ epoch_key) ^ keys)  # (B,)
            pos = np.arange(T, dtype=np.uint64)

            def uniform_bits(stream: int) -> np.ndarray:
                # (B, T) independent 64-bit values for this stream and position
                return _mix(base[:, None] ^ _mix(pos * np.uint64(3) + np.uint64(stream))[None, :])

            u_select = (uniform_bits(0) >> np.uint64(11)) * (1.0 / (1 << 53))  # (B, T) in [0, 1)
            u_action = (uniform_bits(1) >> np.uint64(11)) * (1.0 / (1 << 53))
            r_token = uniform_bits(2) % np.uint64(len(self.ordinary_ids))
        candidate = (np.arange(T)[None, :] < lengths[:, None]) & ~np.isin(ids, self.special_ids)
        # A candidate is selected with its unit (itself, or its word with whole-word masking):
        # `first` (B, T) is its unit's first piece, whose random numbers decide for the unit.
        starts = candidate.copy()
        if self.whole_word_mask:
            follows = np.zeros_like(candidate)
            follows[:, 1:] = candidate[:, :-1]  # the previous position is a piece of text
            starts &= ~(self.continues_word[np.where(candidate, ids, 0)] & follows)
        first = np.maximum.accumulate(np.where(starts, np.arange(T)[None, :], 0), axis=1)
        u_select = np.take_along_axis(u_select, first, axis=1)
        u_action = np.take_along_axis(u_action, first, axis=1)
        selected = candidate & (u_select < self.mlm_probability)
        # Rows with candidates but no selection get their lowest-u unit.
        empty = candidate.any(axis=1) & ~selected.any(axis=1)
        if empty.any():
            rows = np.nonzero(empty)[0]
            cols = np.where(starts[rows], u_select[rows], np.inf).argmin(axis=1)
            selected[rows] |= candidate[rows] & (first[rows] == cols[:, None])
        labels = np.where(selected, ids, IGNORE_INDEX)
        input_ids = ids.copy()
        to_mask = selected & (u_action < 0.8)
        to_random = selected & (u_action >= 0.8) & (u_action < 0.9)
        input_ids[to_mask] = self.mask_id
        input_ids[to_random] = self.ordinary_ids[r_token[to_random].astype(np.int64)]
        return input_ids, labels


def _content_key(ids: np.ndarray) -> int:
    """Stand-in for an example index: a 64-bit hash of the ids themselves."""
    return int.from_bytes(hashlib.blake2b(ids.tobytes(), digest_size=8).digest(), "little")
