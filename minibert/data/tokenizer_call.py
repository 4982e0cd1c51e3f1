"""What `Tokenizer.__call__` takes and gives, as transformers' tokenizers do.

Its arguments are checked here (`CallOptions`), its texts read (`text_inputs`: strings, or
words split beforehand), and the encoded rows padded into a `BatchEncoding`, so that
`model(**enc)` passes them by name; the tokenizer encodes and truncates. numpy and torch are
imported only when `return_tensors` asks for their arrays.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

# transformers' names for each strategy (True and False are its shorthands).
PADDING = ("longest", "max_length", "do_not_pad")
TRUNCATION = ("longest_first", "only_first", "only_second")
RETURN_TENSORS = ("pt", "np", None)

Text = Union[str, Sequence[str], Sequence[Sequence[str]]]

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


# The call argument that adds each optional field, for an AttributeError that says how.
_ASKED_BY = {"token_type_ids": "return_token_type_ids=True",
             "attention_mask": "return_attention_mask=True",
             "offset_mapping": "return_offsets_mapping=True",
             "overflow_to_sample_mapping": "return_overflowing_tokens=True"}


class BatchEncoding(dict):
    """A tokenizer call's output, a dict: `input_ids`, `token_type_ids` and `attention_mask`
    (1 on tokens) unless asked without, `offset_mapping` ((start, end) characters per token)
    and `overflow_to_sample_mapping` (each row's text) when asked for; each (B, T) (one
    text: a row of T, or (1, T) as tensors), as lists, int64 torch tensors or numpy arrays.

    As transformers' BatchEncoding, each field is also an attribute (`enc.input_ids`), and
    `word_ids(i)` / `sequence_ids(i)` give row i's word and text (0 or 1) per token, None
    at special tokens and padding."""

    def __init__(self, data: Mapping[str, Any], encodings: Optional[Sequence[Encoding]] = None):
        super().__init__(data)
        self._encodings = None if encodings is None else list(encodings)  # padded rows

    def __getattr__(self, name: str) -> Any:
        # Python calls this only for a name that is not an attribute: read it as a field.
        # Private and dunder names are never fields (copy and pickle probe for some).
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            how = f" (call the tokenizer with {_ASKED_BY[name]})" if name in _ASKED_BY else ""
            raise AttributeError(f"this BatchEncoding has no {name!r}{how}; it holds "
                                 f"{', '.join(self)}") from None

    def word_ids(self, batch_index: int = 0) -> list[Optional[int]]:
        """For each token of row `batch_index`, the index of the word of its text it is (part
        of): the words the pre-tokenizer finds, or the words given with is_split_into_words."""
        return list(self._row(batch_index).word_ids)

    def sequence_ids(self, batch_index: int = 0) -> list[Optional[int]]:
        """For each token of row `batch_index`, its text: 0 (text), 1 (text_pair) or None."""
        return list(self._row(batch_index).sequence_ids)

    def _row(self, batch_index: int) -> Encoding:
        if self._encodings is None:
            raise ValueError("word_ids and sequence_ids are known to the BatchEncoding a "
                             "Tokenizer call returns, not to one built from a dict")
        n = len(self._encodings)
        if not isinstance(batch_index, int) or not -n <= batch_index < n:
            raise IndexError(f"batch_index={batch_index!r}, but this encoding has {n} rows")
        return self._encodings[batch_index]

    def to(self, device: Any) -> "BatchEncoding":
        """The same encoding with its torch tensors on `device` (transformers' `.to`)."""
        import torch
        if not all(isinstance(v, torch.Tensor) for v in self.values()):
            raise TypeError("BatchEncoding.to moves torch tensors, and this encoding holds "
                            "lists or numpy arrays: call the tokenizer with return_tensors='pt'")
        return BatchEncoding({k: v.to(device) for k, v in self.items()}, self._encodings)


@dataclass(frozen=True)
class CallOptions:
    """A call's arguments as transformers reads them (`Tokenizer.__call__`): padding
    ("longest", "max_length", "do_not_pad") and truncation (one of `TRUNCATION`, or None)
    settled, max_length taken from the model's length where the call needs one and gives
    none, and what to return."""
    padding: str
    truncation: Optional[str]
    max_length: Optional[int]
    stride: int
    pad_to_multiple_of: Optional[int]
    return_tensors: Optional[str]
    special_tokens: bool
    split_into_words: bool
    token_types: bool
    attention_mask: bool
    overflow: bool
    offsets: bool

    @classmethod
    def read(cls, *, padding: Union[bool, str], truncation: Union[bool, str, None],
             max_length: Optional[int], stride: int, pad_to_multiple_of: Optional[int],
             return_tensors: Optional[str], add_special_tokens: bool,
             is_split_into_words: bool, return_token_type_ids: bool,
             return_attention_mask: bool, return_overflowing_tokens: bool,
             return_offsets_mapping: bool, has_pair: bool,
             model_max_length: Optional[int]) -> "CallOptions":
        """Check the arguments of a call, each refused by name with the values it may take.
        `model_max_length`: the tokenizer's model length, None where it knows none."""
        if not isinstance(padding, bool) and padding not in PADDING:
            raise ValueError(f"padding={padding!r}: choose True or 'longest' (to the longest "
                             f"row), 'max_length' (to max_length), or False or 'do_not_pad'")
        if not (truncation is None or isinstance(truncation, bool)
                or truncation in TRUNCATION + ("do_not_truncate",)):
            raise ValueError(f"truncation={truncation!r}: choose True or 'longest_first', "
                             f"'only_first', 'only_second', or False or 'do_not_truncate'")
        if return_tensors not in RETURN_TENSORS:
            raise ValueError(f"return_tensors={return_tensors!r}: choose 'pt' (torch tensors), "
                             f"'np' (numpy arrays) or None (lists)")
        if not isinstance(return_token_type_ids, bool):
            raise TypeError(f"return_token_type_ids={return_token_type_ids!r} must be True or "
                            f"False (False for a model without segments: "
                            f"return_token_type_ids=model.config.has_segments)")
        for name, value in (("add_special_tokens", add_special_tokens),
                            ("is_split_into_words", is_split_into_words),
                            ("return_attention_mask", return_attention_mask),
                            ("return_overflowing_tokens", return_overflowing_tokens),
                            ("return_offsets_mapping", return_offsets_mapping)):
            if not isinstance(value, bool):
                raise TypeError(f"{name}={value!r} must be True or False")
        if max_length is not None and (not isinstance(max_length, int)
                                       or isinstance(max_length, bool) or max_length < 1):
            raise ValueError(f"max_length={max_length!r} must be an integer >= 1")
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 0:
            raise ValueError(f"stride={stride!r} must be an integer >= 0: the tokens each "
                             f"overflowing window shares with the one before")
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or
                                               isinstance(pad_to_multiple_of, bool) or
                                               pad_to_multiple_of < 1):
            raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be an integer "
                             f">= 1 (8 suits tensor cores), or None")
        pad = {True: "longest", False: "do_not_pad"}.get(padding, padding)
        if truncation is None:  # unset: transformers cuts at a max_length given without padding
            cut = "longest_first" if max_length is not None and padding is False else None
        else:
            cut = {True: "longest_first", False: None}.get(truncation, truncation)
            cut = None if cut == "do_not_truncate" else cut
        if max_length is not None and cut is None and pad != "max_length":
            logger.warning("max_length=%d is not used: padding=%r, truncation=%r; pass "
                           "truncation=True to cut there, or padding='max_length' to pad to "
                           "it", max_length, padding, truncation)
        if max_length is None and (cut is not None or pad == "max_length"):
            max_length = model_max_length  # transformers' rule: the model's length
        for name, value, wants in (("truncation", truncation, cut is not None),
                                   ("padding", padding, pad == "max_length")):
            if wants and max_length is None:
                # transformers would quietly neither cut nor pad: a row longer than the
                # model's positions then fails far from here, in the model.
                raise ValueError(f"{name}={value!r} needs max_length=: this Tokenizer does "
                                 f"not know its model's length (pass max_length="
                                 f"model.config.max_position_embeddings, or set "
                                 f"tok.model_max_length; a tokenizer loaded from a model's "
                                 f"folder knows it)")
        if cut is not None and pad != "do_not_pad" and pad_to_multiple_of \
                and max_length % pad_to_multiple_of:
            raise ValueError(f"truncation cuts rows at max_length={max_length}, which is not "
                             f"a multiple of pad_to_multiple_of={pad_to_multiple_of}: padding "
                             f"would make rows longer than the cut; choose a max_length that "
                             f"is a multiple of it")
        room = max_length - 2 * add_special_tokens if cut is not None else None  # [CLS] a [SEP]
        if room is not None and stride and stride > room:
            # Refused whatever the texts, windows asked for or not, as tokenizers refuses it;
            # a stride of `room` exactly is refused where a text is cut (Tokenizer._windows).
            raise ValueError(f"stride={stride} must be less than the {room} tokens of text a "
                             f"row of max_length={max_length} holds, or windows would not "
                             f"move on: lower stride or raise max_length")
        if cut == "only_second" and not has_pair:
            raise ValueError("truncation='only_second' cuts text_pair's texts, and there is "
                             "no text_pair: use truncation=True")
        if return_overflowing_tokens and has_pair and cut == "longest_first":
            # It may cut both texts; tokenizers then pairs every window of one with every
            # window of the other, in an order no one relies on (transformers' Python
            # tokenizers refuse it too).
            raise ValueError(f"return_overflowing_tokens=True with a text_pair needs "
                             f"truncation='only_second' (windows over the second text, as "
                             f"question answering's contexts) or 'only_first'; "
                             f"truncation={truncation!r} means 'longest_first', which may cut "
                             f"both texts")
        return cls(pad, cut, max_length, stride, pad_to_multiple_of, return_tensors,
                   add_special_tokens, is_split_into_words, return_token_type_ids,
                   return_attention_mask, return_overflowing_tokens, return_offsets_mapping)


def text_inputs(text: Any, text_pair: Any, split_into_words: bool = False) -> tuple[list, bool]:
    """The call's inputs as the backend's `encode_batch` takes them (per row a str, or with
    `split_into_words` a list of words; an (a, b) tuple for a pair), and whether one text
    was given (then no batch dimension in lists).

    One text is a str, or with `split_into_words` a list of str (transformers' rule: a list
    whose first item is a list is a batch of texts)."""
    if split_into_words and isinstance(text, str):
        raise TypeError("is_split_into_words=True takes each text as a list of words (str), "
                        "or a list of such lists: text is a str (leave is_split_into_words "
                        "False to have the tokenizer split it)")
    single = _is_one_text(text, split_into_words)
    texts = _rows("text", text, single, split_into_words)
    if text_pair is None:
        return texts, single
    if single != _is_one_text(text_pair, split_into_words):
        raise TypeError(f"text_pair must be one text beside one text, and a list of texts "
                        f"beside a list, as text is; got text "
                        f"{_described(text, split_into_words)} and text_pair "
                        f"{_described(text_pair, split_into_words)}")
    pairs = _rows("text_pair", text_pair, single, split_into_words)
    if len(pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(pairs)} in text_pair; give one pair "
                         f"text per text")
    return list(zip(texts, pairs)), single


def _is_one_text(value: Any, split_into_words: bool) -> bool:
    if not split_into_words:
        return isinstance(value, str)
    return (isinstance(value, (list, tuple)) and bool(value)
            and not isinstance(value[0], (list, tuple)))


def _described(value: Any, split_into_words: bool) -> str:
    """What a text argument holds, in words, for an error."""
    if _is_one_text(value, split_into_words):
        return f"one text ({'a list of words' if split_into_words else 'a str'})"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} texts"
    return f"a {type(value).__name__}"


def _rows(name: str, value: Any, single: bool, split_into_words: bool) -> list:
    """`value` (text or text_pair) as a list of rows, each checked: a str, or a list of str."""
    rows = [value] if single else value
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"{name} must be a str or a list of str, got {type(value).__name__}")
    if not rows:
        raise ValueError(f"{name} is an empty list: there is nothing to encode")
    if not split_into_words:
        _check_strings(name, rows)
        return list(rows)
    for i, row in enumerate(rows):
        where = name if single else f"{name}[{i}]"
        if not isinstance(row, (list, tuple)):
            raise TypeError(f"{where} is a {type(row).__name__}; with is_split_into_words=True "
                            f"each text is a list of words (str)")
        _check_strings(where, row)
    return [list(row) for row in rows]


def _check_strings(name: str, items: Sequence[Any]) -> None:
    bad = next((i for i, t in enumerate(items) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}] is a {type(items[bad]).__name__}; {name} must hold "
                        f"str only")


def pad_rows(rows: Sequence[Encoding], samples: Sequence[int], pad_id: int,
             options: CallOptions, single: bool) -> BatchEncoding:
    """Encoded rows -> a `BatchEncoding`, padded on the right as `options` say: ids with
    `pad_id`, token types and the attention mask with 0, offsets with (0, 0). `samples[r]`
    is the text row r came from (several rows per text where windows overflow)."""
    lengths = [len(r.input_ids) for r in rows]
    width = {"longest": max(lengths), "max_length": options.max_length}.get(options.padding)
    if width is not None and options.pad_to_multiple_of:  # rounded up, as tokenizers does
        width = -(-width // options.pad_to_multiple_of) * options.pad_to_multiple_of
    padded = [_padded(r, max(0, width - n) if width is not None else 0, pad_id)
              for r, n in zip(rows, lengths)]
    out: dict[str, list] = {"input_ids": [r.input_ids for r in padded]}
    if options.token_types:
        out["token_type_ids"] = [r.token_type_ids for r in padded]
    if options.attention_mask:
        out["attention_mask"] = [[1] * n + [0] * (len(r.input_ids) - n)
                                 for r, n in zip(padded, lengths)]
    if options.offsets:
        out["offset_mapping"] = [r.offsets for r in padded]
    if options.overflow:
        out["overflow_to_sample_mapping"] = list(samples)
    if options.return_tensors is None:
        # One text keeps no batch dimension, unless its windows make several rows.
        unbatch = single and not options.overflow
        return BatchEncoding({k: v[0] if unbatch else v for k, v in out.items()}, padded)
    widths = sorted({len(r) for r in out["input_ids"]})
    if len(widths) > 1:
        raise ValueError(f"return_tensors={options.return_tensors!r} needs rows of one length, "
                         f"but they have lengths {widths[0]} to {widths[-1]}: pass "
                         f"padding=True (and truncation=True with max_length= for rows longer "
                         f"than max_length)")
    if options.return_tensors == "np":
        import numpy as np
        arrays = {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}
        if options.offsets:  # (B, T, 2), also where T is 0
            arrays["offset_mapping"] = arrays["offset_mapping"].reshape(len(rows), -1, 2)
        return BatchEncoding(arrays, padded)
    import torch
    tensors = {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
    if options.offsets:
        tensors["offset_mapping"] = tensors["offset_mapping"].reshape(len(rows), -1, 2)
    return BatchEncoding(tensors, padded)


def _padded(row: Encoding, fill: int, pad_id: int) -> Encoding:
    """`row` with `fill` padding tokens on the right (no word, no text)."""
    return Encoding(row.input_ids + [pad_id] * fill, row.token_type_ids + [0] * fill,
                    row.offsets + [(0, 0)] * fill, row.word_ids + [None] * fill,
                    row.sequence_ids + [None] * fill)
