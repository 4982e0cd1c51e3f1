"""What `Tokenizer.__call__` takes and gives, as transformers' tokenizers do.

Its arguments are checked here (`CallOptions`) and the encoded rows padded into a
`BatchEncoding`, so that `model(**enc)` passes them by name; the tokenizer encodes and
truncates. numpy and torch are imported only when `return_tensors` asks for their arrays.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

# transformers' names for each strategy (True and False are its shorthands).
PADDING = ("longest", "max_length", "do_not_pad")
TRUNCATION = ("longest_first", "only_first", "only_second")
RETURN_TENSORS = ("pt", "np", None)

Text = Union[str, Sequence[str]]

logger = logging.getLogger(__name__)


class BatchEncoding(dict):
    """A tokenizer call's output, a dict: `input_ids`, `token_type_ids` (unless asked
    without) and `attention_mask` (1 on tokens), each (B, T) (one text: a row of T, or
    (1, T) as tensors), as lists, int64 torch tensors or numpy arrays."""

    def to(self, device: Any) -> "BatchEncoding":
        """The same encoding with its torch tensors on `device` (transformers' `.to`)."""
        import torch
        if not all(isinstance(v, torch.Tensor) for v in self.values()):
            raise TypeError("BatchEncoding.to moves torch tensors, and this encoding holds "
                            "lists or numpy arrays: call the tokenizer with return_tensors='pt'")
        return BatchEncoding({k: v.to(device) for k, v in self.items()})


@dataclass(frozen=True)
class CallOptions:
    """A call's padding ("longest", "max_length", "do_not_pad") and truncation (one of
    `TRUNCATION`, or None), read as transformers reads them (`Tokenizer.__call__`)."""
    padding: str
    truncation: Optional[str]
    max_length: Optional[int]
    return_tensors: Optional[str]
    token_types: bool

    @classmethod
    def read(cls, padding: Union[bool, str], truncation: Union[bool, str, None],
             max_length: Optional[int], return_tensors: Optional[str],
             return_token_type_ids: bool) -> "CallOptions":
        """Check the arguments of a call, each refused by name with the values it may take."""
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
        if max_length is not None and (not isinstance(max_length, int)
                                       or isinstance(max_length, bool) or max_length < 1):
            raise ValueError(f"max_length={max_length!r} must be an integer >= 1")
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
        for name, value, wants in (("truncation", truncation, cut is not None),
                                   ("padding", padding, pad == "max_length")):
            if wants and max_length is None:
                raise ValueError(f"{name}={value!r} needs max_length=: the Tokenizer does not "
                                 f"know its model's length (pass "
                                 f"max_length=model.config.max_position_embeddings)")
        return cls(pad, cut, max_length, return_tensors, return_token_type_ids)


def text_inputs(text: Any, text_pair: Any) -> tuple[list, bool]:
    """The call's inputs as the backend's `encode_batch` takes them (a str, or an (a, b)
    tuple, per row), and whether one text was given (then no batch dimension in lists)."""
    single = isinstance(text, str)
    texts = [text] if single else text
    if not isinstance(texts, (list, tuple)):
        raise TypeError(f"text must be a str or a list of str, got {type(text).__name__}")
    if not texts:
        raise ValueError("text is an empty list: there is nothing to encode")
    _check_strings("text", texts)
    if text_pair is None:
        return list(texts), single
    if single != isinstance(text_pair, str):
        raise TypeError(f"text_pair must be a str for one text and a list of str for a list "
                        f"of texts, as text is; got text {type(text).__name__} and text_pair "
                        f"{type(text_pair).__name__}")
    pairs = [text_pair] if single else text_pair
    if not isinstance(pairs, (list, tuple)):
        raise TypeError(f"text_pair must be a list of str, got {type(text_pair).__name__}")
    if len(pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(pairs)} in text_pair; give one pair "
                         f"text per text")
    _check_strings("text_pair", pairs)
    return list(zip(texts, pairs)), single


def _check_strings(name: str, items: Sequence[Any]) -> None:
    bad = next((i for i, t in enumerate(items) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}] is a {type(items[bad]).__name__}; {name} must hold "
                        f"str only")


def pad_rows(rows: Sequence[tuple[list[int], list[int]]], pad_id: int, options: CallOptions,
             single: bool) -> BatchEncoding:
    """(ids, token types) per row -> a `BatchEncoding`, padded on the right as `options` say:
    ids with `pad_id`, token types with 0, the attention mask with 0."""
    lengths = [len(ids) for ids, _ in rows]
    width = {"longest": max(lengths), "max_length": options.max_length}.get(options.padding)
    out = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    for (ids, types), n in zip(rows, lengths):
        fill = max(0, width - n) if width is not None else 0
        out["input_ids"].append(ids + [pad_id] * fill)
        out["token_type_ids"].append(types + [0] * fill)
        out["attention_mask"].append([1] * n + [0] * fill)
    if not options.token_types:
        del out["token_type_ids"]
    if options.return_tensors is None:
        return BatchEncoding({k: v[0] if single else v for k, v in out.items()})
    widths = sorted({len(r) for r in out["input_ids"]})
    if len(widths) > 1:
        raise ValueError(f"return_tensors={options.return_tensors!r} needs rows of one length, "
                         f"but they have lengths {widths[0]} to {widths[-1]}: pass "
                         f"padding=True (and truncation=True with max_length= for rows longer "
                         f"than max_length)")
    if options.return_tensors == "np":
        import numpy as np
        return BatchEncoding({k: np.asarray(v, dtype=np.int64) for k, v in out.items()})
    import torch
    return BatchEncoding({k: torch.tensor(v, dtype=torch.long) for k, v in out.items()})
