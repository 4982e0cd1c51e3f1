"""Sentence embeddings: one vector per text from a BERT encoder's last hidden states.

    enc = SentenceEncoder.from_pretrained("runs/mini/final", pooling="mean", normalize=True)
    vectors = enc.encode(["a cat sat on the mat", "dogs ran far away"])   # (2, H), unit rows
    scores = cosine_similarity(vectors[:1], vectors)                     # (1, 2)

Pooling as sentence-transformers (Reimers & Gurevych 2019), so a folder gives that library's
vectors: `mean` or `max` over the real tokens ([CLS] and [SEP] included), or `cls`, the last
hidden state of [CLS], not BERT's pooler (docs/walkthrough.md, 5.3). Shapes: N texts, B of
them in a batch, T tokens, H hidden size.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..data.mlm import pad_batch
from ..model import heads
from ..machine.inputs import check_cls_first
from ..interop.hf import PathLike, config_from_hf, load_hf_state_dict, read_weights
from ..interop.pretrained import load_dtype, read_folder_config, stored_dtype
from ..model.model import BertModel
from ..data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

POOLINGS = ("mean", "cls", "max")


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """hidden: (B, T, H), attention_mask: (B, T) with 1 for real tokens -> (B, H)."""
    check_pooling(pooling)
    if pooling != "max":  # [CLS] (SentenceEncoder has refused a padded position 0) or mean:
        return heads.pool(hidden, attention_mask, pooling)  # the classifiers' own pooling
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    # sentence-transformers fills padding with -1e9; -inf gives the same maximum whenever a row
    # has a real token (always: [CLS] and [SEP]) and cannot be beaten by a huge activation.
    return hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1)


def check_normalize(normalize: Optional[bool], default: bool) -> bool:
    """The normalisation one call uses: `default` for None, else `normalize` (a bool)."""
    if normalize is None:
        return default
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize={normalize!r} must be True, False or None (None: the "
                        f"encoder's default, normalize={default})")
    return normalize


def cosine_similarity(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarity of each row of a (N, H) with each of b (M, H): (N, M); 1-D: one row."""
    a, b = torch.atleast_2d(a).float(), torch.atleast_2d(b).float()
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def nearest(query: Tensor, corpus: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k rows of corpus (N, H) most similar to each query (Q, H) by cosine: (scores,
    indices), each (Q, min(k, N)), best first."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an integer >= 1")
    scores = cosine_similarity(query, corpus)  # (Q, N)
    return scores.topk(min(k, scores.size(1)), dim=1)


class SentenceEncoder(nn.Module):
    """A BERT encoder (no pooler, no head), its tokenizer, and a pooling of its hidden states:
    `forward` (B, H) with gradients, `encode` (N, H) for inference. `normalize` (unit L2
    rows) is both's default, which a call's `normalize=True/False` overrides for that call."""

    def __init__(self, model: BertModel, tokenizer: Tokenizer, pooling: str = "mean",
                 normalize: bool = False):
        super().__init__()
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's "
                             f"vocab_size is {model.config.vocab_size}; they do not belong "
                             f"together")
        self.model, self.tokenizer = model, tokenizer
        self.pooling = check_pooling(pooling)
        self.normalize = check_normalize(normalize, False)
        self.train(model.training)  # the wrapped model's mode, which `encode` restores

    @classmethod
    def from_pretrained(cls, path: PathLike, pooling: str = "mean", normalize: bool = False,
                        *, allow_vocab_mismatch: bool = False,
                        dtype: Union[torch.dtype, str, None] = None,
                        torch_dtype: Union[torch.dtype, str, None] = None,
                        **config_overrides: Any) -> "SentenceEncoder":
        """Load the encoder and tokenizer of any model folder, in eval mode, without its heads
        or pooler (so nothing is newly initialised). The keywords are `from_pretrained`'s."""
        check_pooling(pooling)  # before reading any file
        dtype = load_dtype(dtype, torch_dtype)
        hf_config = read_folder_config(path, allow_vocab_mismatch)
        config = config_from_hf(hf_config, **config_overrides)
        tokenizer = Tokenizer.from_pretrained(path)
        model = BertModel(config, add_pooler=False)
        weights = read_weights(path)
        load_hf_state_dict(model, weights, path)  # heads and pooler unread
        dtype = stored_dtype(dtype, hf_config, weights)
        if dtype is not None:
            model.to(dtype)
        return cls(model.eval(), tokenizer, pooling, normalize)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Optional[Tensor] = None,
                normalize: Optional[bool] = None) -> Tensor:
        """input_ids, attention_mask (1 = real token), token_type_ids: (B, T) -> (B, H)."""
        normalize = check_normalize(normalize, self.normalize)
        if self.pooling == "cls":  # before the encoder: a GPU host then waits for nothing
            check_cls_first(attention_mask)
        hidden = self.model(input_ids, attention_mask, token_type_ids).last_hidden_state
        emb = pool(hidden, attention_mask, self.pooling)  # (B, H)
        return F.normalize(emb, dim=-1) if normalize else emb

    def encode(self, texts: Sequence[str], batch_size: int = 32,
               max_length: Optional[int] = None, normalize: Optional[bool] = None) -> Tensor:
        """Embed `texts` (a list of N strings): a float32 (N, H) CPU tensor, row i for texts[i].

        max_length: tokens per text with [CLS] and [SEP], default the model's positions; a
        longer text keeps its first tokens and its [SEP], as transformers truncates. Runs in
        eval mode without gradients, longest first; `batch_size` does not change the result.
        """
        if isinstance(texts, str):
            raise TypeError("encode expects a list of strings; for one text use encode([text])")
        normalize = check_normalize(normalize, self.normalize)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
        limit = self.model.config.max_position_embeddings
        max_length = limit if max_length is None else max_length
        if not isinstance(max_length, int) or not 2 <= max_length <= limit:
            raise ValueError(f"max_length={max_length!r} must be an integer from 2 ([CLS] and "
                             f"[SEP]) to the model's max_position_embeddings={limit}")
        ids = self.tokenizer.encode_batch(list(texts))  # N lists [CLS] ... [SEP]
        long = [i for i, s in enumerate(ids) if len(s) > max_length]
        for i in long:
            ids[i] = ids[i][:max_length - 1] + ids[i][-1:]
        if long:
            logger.info("%d of %d texts truncated to max_length=%d tokens", len(long),
                        len(ids), max_length)
        out = torch.empty(len(ids), self.hidden_size)  # (N, H)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        device = next(self.model.parameters()).device
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(order), batch_size):
                    rows = order[start:start + batch_size]
                    batch, lengths = pad_batch([ids[i] for i in rows], self.tokenizer.pad_id)
                    input_ids = torch.from_numpy(batch).to(device)  # (B, T)
                    mask = (torch.arange(batch.shape[1]) < torch.from_numpy(lengths)[:, None])
                    emb = self(input_ids, mask.long().to(device), normalize=normalize)
                    out[rows] = emb.float().cpu()  # (B, H)
        finally:
            self.train(was_training)
        return out

    similarity = staticmethod(cosine_similarity)
