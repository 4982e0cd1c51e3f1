"""`fast(model)`: minibert's CPU kernels, swapped into a model from outside.

The model's files are plain PyTorch. Training on a CPU, five of their calls have faster
equivalents in kernels.py that compute the same thing (docs/machine-room.md, §2 and §6):

    the textbook's call                              the kernel, on a CPU
    nn.Dropout in a minibert model                   `kernels.dropout`
    attention's dropout, in the math form and in     the math form with `kernels.dropout`
      SDPA in fp32 (torch's fused CPU kernels have
      no dropout; its fallback is that formula)
    the word lookup and the tied MLM decoder         `kernels.TiedWordGradient`
    the sparse MLM head on its N predicted rows      N rounded up (`kernels.round_up_rows`)
    chunked attention's fresh tile per product       tile buffers made once (`kernels.TileBuffers`)

`fast` gives each module that makes one of those calls a subclass of its own class that
makes the kernel's call instead, in place, as `torch.nn.utils.parametrize` swaps a class:
parameters, buffers, your hooks, devices and the state_dict stay as they are. Elsewhere
(a GPU, a graph that torch.compile or torch.export traces) each subclass makes the plain call.
`train()` trains the model as it is given; the scripts call `fast` on the models they build,
and a loop of your own calls it once, before `torch.compile` and DDP. tests/test_fast.py
checks it against the plain model.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from ..model.attention import attention, attention_bias, attention_probs
from ..model.config import BertConfig
from ..model.heads import BertForMaskedLM, MLMHead, Transform
from ..model.model import SelfAttention
from .kernels import (TiedWordGradient, TileBuffers, dropout, round_up_rows,
                      tied_word_gradient)


def fast(model: nn.Module) -> nn.Module:
    """Swap minibert's CPU kernels into `model` (any module holding minibert models), in
    place; returns it. Modules of your own are left alone, and a second call changes
    nothing."""
    for m in model.modules():
        if isinstance(getattr(m, "config", None), BertConfig):  # a minibert model
            for d in m.modules():
                if type(d) is nn.Dropout:
                    d.__class__ = Dropout
        if type(m) is SelfAttention:
            m.__class__ = FastSelfAttention
        if isinstance(m, BertForMaskedLM) and type(m.head) is MLMHead \
                and type(m.bert.embeddings.word) is nn.Embedding:
            tie = _Tie()  # the model's forward opens it for its decoder and its lookup
            m.register_forward_pre_hook(tie.open_hook)
            m.register_forward_hook(tie.close_hook, always_call=True)
            m.head.__class__, m.head.tie = FastMLMHead, tie
            m.bert.embeddings.word.__class__, m.bert.embeddings.word.tie = TiedLookup, tie
    return model


class Dropout(nn.Dropout):
    """nn.Dropout through `kernels.dropout` (on a CPU, p as its random bits can draw it)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class FastSelfAttention(SelfAttention):
    """Attention's dropout drawn by `kernels.dropout` where torch would run the formula
    anyway: the math form, and SDPA in fp32 on a CPU. bf16 keeps torch's fallback, which
    holds the scores and the softmax in fp32. Chunked attention on a CPU writes its tiles
    into buffers made once per pass (`kernels.TileBuffers`)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, is_token: Optional[Tensor],
               dropout_p: float) -> Tensor:
        if self.backend == "chunked" and q.device.type == "cpu":
            return attention(q, k, v, is_token, "chunked", dropout_p, self.chunk_size,
                             self.window, tiles=TileBuffers)
        formula = self.backend == "math" or (self.backend == "sdpa" and
                                             q.dtype == torch.float32)
        if not (dropout_p > 0 and q.device.type == "cpu" and formula):
            return super().attend(q, k, v, is_token, dropout_p)
        bias = attention_bias(is_token, q.size(2), self.window, q.dtype, q.device)
        return dropout(attention_probs(q, k, bias), dropout_p) @ v  # (B, nh, T, hs)


class _Tie:
    """The `TiedWordGradient` of the model's forward in flight, from the lookup to the
    decoder. Only a call of the whole model opens it (hooks, which also hold where a forward
    is replaced on the instance): the encoder or the head called alone makes the plain
    calls, and no gradient waits for a lookup that is not coming."""

    def __init__(self) -> None:
        self.open = False
        self.current: Optional[TiedWordGradient] = None

    def open_hook(self, module: nn.Module, args: tuple) -> None:
        self.open = not torch.compiler.is_compiling()  # a traced graph keeps to autograd

    def close_hook(self, module: nn.Module, args: tuple, output: object) -> None:
        self.open, self.current = False, None

    def take(self) -> Optional[TiedWordGradient]:
        current, self.current = self.current, None
        return current


class TiedLookup(nn.Embedding):
    """The word lookup, which makes the forward's `TiedWordGradient` and adds its rows into
    the decoder's gradient (None, off a CPU or without gradients: `F.embedding`)."""

    tie: _Tie

    def forward(self, ids: Tensor) -> Tensor:
        if not self.tie.open or torch.compiler.is_compiling():
            return super().forward(ids)
        tied = self.tie.current = tied_word_gradient(self.weight)
        if tied is None:
            return super().forward(ids)
        return tied.lookup(ids, self.weight, self.padding_idx)  # (B, T, H)


class FastMLMHead(MLMHead):
    """The MLM head whose decoder hands its weight gradient to the lookup, and whose N
    predicted rows are rounded up so that a few block sizes repeat (`round_up_rows`)."""

    tie: _Tie

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        tied = self.tie.take() if self.tie.open and not torch.compiler.is_compiling() else None
        if tied is None:
            return super().forward(h, word_embeddings)
        return tied.decoder(Transform.forward(self, h), word_embeddings, self.bias)

    def predict(self, h: Tensor, word_embeddings: Tensor,
                targets: Tensor) -> tuple[Tensor, Tensor]:
        n = targets.numel()
        h, targets = round_up_rows(h, targets)  # (N', H), (N',): zero rows, ignored targets
        logits, loss = super().predict(h, word_embeddings, targets)
        return logits[:n], loss
