"""The models' input checks: the usual mistakes in what a forward is given (a wrong shape or
dtype, an id outside the vocabulary or the classes, a batch padded on the left, a mask in
transformers' additive form) as errors that name the tensor and the fix, not an IndexError
deep in torch, a CUDA device-side assert, or a mask read inverted.
The checks of values are left out of a graph traced by torch.compile or torch.export.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..model.config import BertConfig
from ..labels import IGNORE_INDEX


def check_inputs(config: BertConfig, input_ids: Optional[Tensor],
                 attention_mask: Optional[Tensor], token_type_ids: Optional[Tensor],
                 pooler: bool = False, *, position_ids: Optional[Tensor] = None,
                 inputs_embeds: Optional[Tensor] = None) -> None:
    """Clear errors for the usual input mistakes, once per forward; only the id ranges and a
    mask that is not bool cost (a pass over each, and the wait for its answer). `pooler`:
    the model pools [CLS] at position 0, so a batch padded on the left is refused there
    as the classifiers refuse it (`check_cls_first`). The batch is `input_ids` (B, T) or
    `inputs_embeds` (B, T, H), exactly one of them."""
    B, T = batch_shape(config, input_ids, inputs_embeds)
    if B == 0 or T == 0:  # would otherwise fail deep inside attention, in a reshape
        name = "input_ids" if inputs_embeds is None else "inputs_embeds"
        raise ValueError(f"{name} is empty, batch shape {(B, T)}; the model needs at least "
                         f"one sequence of at least one token")
    if T > config.max_position_embeddings:
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings="
                         f"{config.max_position_embeddings}; truncate the input or build the "
                         f"model with a larger max_position_embeddings")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != (B, T)):
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} has shape {shape} but the batch is {(B, T)}; they must "
                             f"match")
    if token_type_ids is not None:
        check_lookup_ids("token_type_ids", token_type_ids, "segment ids")
    if position_ids is not None:
        check_position_shape(position_ids, B, T)
    if torch.compiler.is_compiling():
        return  # the checks of values below would stop a traced graph: it has no values
    check_mask(attention_mask)
    if pooler:
        check_cls_first(attention_mask, "pooler")
    if input_ids is not None:
        lo, hi = torch.aminmax(input_ids)
        if lo < 0 or hi >= config.vocab_size:
            raise ValueError(f"input_ids must lie in [0, vocab_size={config.vocab_size}), "
                             f"found values from {int(lo)} to {int(hi)}; does the tokenizer "
                             f"match the model?")
    if position_ids is not None:
        lo, hi = torch.aminmax(position_ids)
        if lo < 0 or hi >= config.max_position_embeddings:
            raise ValueError(f"position_ids must lie in [0, max_position_embeddings="
                             f"{config.max_position_embeddings}), found values from {int(lo)} "
                             f"to {int(hi)}")
    if token_type_ids is not None and token_type_ids.numel() > 0:
        lo, hi = torch.aminmax(token_type_ids)
        if config.type_vocab_size == 0 and (lo != 0 or hi != 0):
            # All zeros is one segment, which changes nothing. A second segment would be
            # ignored without a word, and the caller believes the model sees it.
            raise ValueError("token_type_ids mark a second segment, but this model has no "
                             "segment embeddings (type_vocab_size=0, as ModernBERT): it "
                             "tells the texts of a pair apart by [SEP] alone; leave "
                             "token_type_ids out (the collators do, with segments=False: "
                             "segments=model.config.has_segments)")
        if config.type_vocab_size and (lo < 0 or hi >= config.type_vocab_size):
            raise ValueError(f"token_type_ids must lie in [0, type_vocab_size="
                             f"{config.type_vocab_size}), found values from {int(lo)} to "
                             f"{int(hi)}")


def batch_shape(config: BertConfig, input_ids: Optional[Tensor],
                inputs_embeds: Optional[Tensor]) -> tuple[int, int]:
    """(B, T) of a batch given as token ids (B, T) or as their vectors (B, T, H): one of the
    two, as in transformers, since the vectors replace the word lookup."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass input_ids (B, T) or inputs_embeds (B, T, H), "
                         + ("not both" if input_ids is not None else "one of them"))
    if inputs_embeds is not None:
        if not isinstance(inputs_embeds, Tensor):
            raise TypeError(f"inputs_embeds must be a torch.Tensor of word vectors, got "
                            f"{type(inputs_embeds)}")
        if not inputs_embeds.is_floating_point():
            raise TypeError(f"inputs_embeds must hold float word vectors, got "
                            f"{inputs_embeds.dtype}; token ids go in input_ids")
        shape = tuple(inputs_embeds.shape)
        if len(shape) != 3 or shape[2] != config.hidden_size:
            raise ValueError(f"inputs_embeds must be 3-D (batch, tokens, hidden_size="
                             f"{config.hidden_size}), got shape {shape}")
        return shape[0], shape[1]
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids)}")
    check_lookup_ids("input_ids", input_ids, "token ids")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, tokens), got shape "
                         f"{tuple(input_ids.shape)}; for one sequence use input_ids[None]")
    return tuple(input_ids.shape)


def check_position_shape(position_ids: Tensor, B: int, T: int) -> None:
    """position_ids: integer, (B, T), or (1, T) for every row alike (transformers' default
    has that shape)."""
    if not isinstance(position_ids, Tensor) or tuple(position_ids.shape) not in ((B, T), (1, T)):
        shape = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else \
            type(position_ids).__name__
        raise ValueError(f"position_ids has shape {shape} but the batch is {(B, T)}; pass "
                         f"{(B, T)}, or {(1, T)} for every row alike")
    check_lookup_ids("position_ids", position_ids, "positions")


def check_cls_first(attention_mask: Optional[Tensor], reader: str = "classifier") -> None:
    """Refuse a batch whose position 0, where a classifier (or BERT's pooler, the `reader`)
    reads [CLS], is padding in some row (padded on the left): the encoder leaves padding at
    zero, so that row's class would come from a zero vector. minibert's collators pad on the
    right."""
    if attention_mask is None or torch.compiler.is_compiling():  # a traced graph has no values
        return
    if not bool(attention_mask[:, 0].all()):
        check_mask(attention_mask)  # transformers' additive form has 0 at every token
        rows = (attention_mask[:, 0] == 0).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask is 0 at position 0 in row(s) {rows[:8]}: the "
                         f"[CLS] token the {reader} reads is padding there (padded on the "
                         f"left?); pad on the right, [CLS] first"
                         + (", or build the model with add_pooler=False to read the tokens "
                            "alone" if reader == "pooler" else ""))


# The dtypes an embedding looks up. Another integer type (uint8, int16) fails there in torch's
# words, after the id range was checked in values a uint8 cannot hold (-1 wraps to 255).
LOOKUP_DTYPES = (torch.long, torch.int32)


def check_lookup_ids(name: str, ids: Tensor, what: str) -> None:
    if ids.dtype not in LOOKUP_DTYPES:
        raise TypeError(f"{name} must hold integer {what} as torch.long (or torch.int32, the "
                        f"types an embedding looks up), got {ids.dtype}; pass {name}.long()")


def check_mask(attention_mask: Optional[Tensor]) -> None:
    """Refuse a mask in another form than the one minibert reads, 1 = token and 0 = padding
    (bool, integers or floats): any other value would be read as a token. transformers'
    additive form (0 at a token, a large negative number at padding) would be inverted."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return
    other = (attention_mask != 0) & (attention_mask != 1)  # NaN included: it equals nothing
    if not bool(other.any()):
        return
    value = attention_mask[other][0].item()
    said = (f"attention_mask holds {value}: minibert reads 1 = token, 0 = padding (bool, or "
            f"integers or floats 0 and 1)")
    if value != value:
        raise ValueError(f"{said}; a NaN is neither: look at what computed the mask")
    if value < 0:
        raise ValueError(f"{said}; transformers' additive form (0 keep, large negative pad) is "
                         f"not accepted: pass (mask == 0)")
    raise ValueError(f"{said}; pass a mask of 1s and 0s")


def check_shape(name: str, t: Tensor, shape: tuple, what: str) -> None:
    if not isinstance(t, Tensor) or tuple(t.shape) != shape:
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} has shape {got}; expected {shape}, {what}")


def check_ids(name: str, t: Tensor, what: str) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be {what}; got {t.dtype}")


def check_range(name: str, t: Tensor, n: int, what: str) -> None:
    """Every id of `t` but IGNORE_INDEX lies in [0, n), else an error naming the tensor."""
    if torch.compiler.is_compiling():  # a traced graph has no values to check
        return
    outside = t[(t != IGNORE_INDEX) & ((t < 0) | (t >= n))]
    if outside.numel():
        raise ValueError(f"{name} hold {int(outside[0])}, outside the {what} [0, {n}) (and "
                         f"not {IGNORE_INDEX}, which is ignored); do the labels come from "
                         f"another label map or vocabulary than the model's?")
