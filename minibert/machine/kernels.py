"""Kernels: faster hand-written versions of what plain PyTorch already computes.

Each says which plain call it replaces; the tests check that both compute the same thing,
and `benchmarks/bench_levers.py` and `bench_tied_lookup.py` measure what each buys
(benchmarks/RESULTS.md). The model makes the plain calls; `swap.fast` puts these in.
docs/machine-room.md, §2, §6 and §7, explains each.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..labels import IGNORE_INDEX


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014), replacing `F.dropout(x, p)`: zero each
    element with probability p and scale the survivors so the expectation is unchanged.

    On a CPU one 64-bit draw of torch's generator serves four elements, 15 random bits each
    (p rounded to a multiple of 1/32768, the survivors scaled for that rate; nothing dropped
    below 1/65536), and only the boolean mask is saved for the backward pass (machine room,
    §2.1). `set_seed` and checkpointed RNG states reproduce it. On other devices, and in a
    traced graph, `F.dropout` is used as it is: there it is already fused.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():  # a traced graph: torch's
        return F.dropout(x, p, training=True)
    # The rate the 15-bit lanes can draw, and the scale that keeps the expectation exact at
    # that rate (1 / (1 - p) would be off by up to 1/65536 of it, and scale a p so small
    # that nothing is ever dropped).
    drop = round(p * 32768)
    if drop == 0:
        return x
    if drop == 32768:
        return x * 0.0  # all dropped; zero gradients, as F.dropout(p=1) gives
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each
    # Four 16-bit lanes per draw; the low 15 bits of every lane are uniform. (The top lane's
    # sign bit is always 0, which is why 15 and not 16 bits are used.)
    lanes = bits.view(torch.int16)[:n].view(x.shape)
    survives = (lanes & 0x7FFF) >= drop
    return torch.where(survives, x * (32768 / (32768 - drop)), 0.0)


class TiedWordGradient:
    """One forward pass's gradient of the word embedding that the MLM decoder shares, built
    without a vocabulary-sized temporary; replaces `F.embedding(ids, weight, padding_idx)`
    and `F.linear(h, weight, bias)` on the same weight, whose two (V, H) gradients plain
    autograd adds, each fresh memory mapped page by page on a CPU (machine room, §2.2).

    The decoder's backward hands its dense gradient over, and the lookup's backward, which
    autograd always runs later (the decoder's input depends on the lookup's output), adds
    its rows into it in place with `index_add_`: `.grad`, DDP's hooks and accumulation see
    one ordinary dense gradient. Make one per forward pass.
    """

    def __init__(self) -> None:
        self.grad: Tensor | None = None  # the decoder's weight gradient, until the lookup's

    def lookup(self, ids: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
        """ids: (B, T), weight: (V, H) -> (B, T, H); the [PAD] row gets no gradient here."""
        return _TiedLookup.apply(ids, weight, self, padding_idx)

    def decoder(self, h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """h: (..., H), weight: (V, H), bias: (V,) -> logits (..., V)."""
        return _TiedDecoder.apply(h, weight, bias, self)


def tied_word_gradient(weight: Tensor) -> Optional[TiedWordGradient]:
    """The `TiedWordGradient` for one training forward of a model whose decoder is `weight`
    (V, H) on a CPU with gradients on; else None, plain autograd (on a GPU that memory
    traffic is cheap, and compiled graphs keep to plain autograd)."""
    if weight.device.type == "cpu" and torch.is_grad_enabled() and \
            not torch.compiler.is_compiling():
        return TiedWordGradient()
    return None


# The sparse MLM head's rows are rounded up to a multiple of this on a CPU (`round_up_rows`).
PREDICTION_ROWS = 64


def round_up_rows(h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The sparse MLM head's N predicted rows, h (N, H) and targets (N,), padded on a CPU to
    a multiple of `PREDICTION_ROWS` with zero rows whose targets are IGNORE_INDEX; replaces
    running the head on them as they are, with the same loss, real logits and gradients.

    With N fixed to a few sizes, the head's largest blocks (N x V logits, their fp32 copy,
    their gradients) stop fragmenting the C allocator's heap and adding oneDNN kernels
    (machine room, §6). Elsewhere, and in a traced graph (N a symbol), they stay as they are.
    """
    eager_cpu = h.device.type == "cpu" and not torch.compiler.is_compiling()
    pad = (-targets.numel()) % PREDICTION_ROWS if eager_cpu else 0
    if not pad:
        return h, targets
    return (torch.cat([h, h.new_zeros(pad, h.size(1))]),
            torch.cat([targets, targets.new_full((pad,), IGNORE_INDEX)]))


class _TiedDecoder(torch.autograd.Function):
    # custom_fwd / custom_bwd: the backward runs under the forward's autocast state, so its
    # matmuls take the precision that F.linear's did (the tied path is CPU only).
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor, tied: TiedWordGradient) -> Tensor:
        ctx.save_for_backward(h, weight)
        ctx.tied = tied
        return F.linear(h, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_logits: Tensor):
        h, weight = ctx.saved_tensors
        g = grad_logits.reshape(-1, grad_logits.size(-1))  # (N, V), N = every leading dim
        rows = h.reshape(-1, h.size(-1)).to(g.dtype)  # (N, H)
        grad_weight = g.t().mm(rows).to(weight.dtype)  # (V, H), a fresh tensor
        tied = ctx.tied
        tied.grad = grad_weight if tied.grad is None else tied.grad + grad_weight
        # No gradient for the weight from here: the lookup's backward returns the sum.
        return g.mm(weight.to(g.dtype)).view(h.shape), None, g.sum(0), None


class _TiedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: Tensor, weight: Tensor, tied: TiedWordGradient,
                padding_idx: int | None) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.tied, ctx.padding_idx, ctx.weight_shape = tied, padding_idx, weight.shape
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (ids,) = ctx.saved_tensors
        tied = ctx.tied
        grad, tied.grad = tied.grad, None
        if grad is None:  # the decoder was not part of this backward pass
            grad = grad_out.new_zeros(ctx.weight_shape)
        ids, rows = ids.reshape(-1), grad_out.reshape(-1, grad_out.size(-1))  # (B*T,), (B*T, H)
        if ctx.padding_idx is not None:  # as F.embedding: the [PAD] row learns nothing here
            real = ids != ctx.padding_idx
            ids, rows = ids[real], rows[real]
        grad.index_add_(0, ids, rows.to(grad.dtype))
        return None, grad, None, None


class TileBuffers:
    """The tile-sized buffers of one chunked-attention pass, made once and written again by
    every tile; in a model `fast` has swapped (swap.FastSelfAttention), it replaces
    `attention.Tiles`' fresh `a @ b` (and its fp32 copy) per tile, with the same values
    (tests/test_attention.py). A fresh
    (B, nh, cq, ck) tensor per tile is thousands of allocations at long lengths, each mapped
    and zeroed page by page where glibc hands it back (machine room, §7). At most four
    shapes: full tiles, and the shorter last row and column blocks.
    """

    def __init__(self, like: Tensor) -> None:
        self.batch, self.device = like.shape[:2], like.device
        self.buffers: dict[tuple, Tensor] = {}

    def get(self, name: str, rows: int, cols: int, dtype: torch.dtype) -> Tensor:
        key = (name, rows, cols, dtype)
        if key not in self.buffers:
            self.buffers[key] = torch.empty(*self.batch, rows, cols, dtype=dtype,
                                            device=self.device)
        return self.buffers[key]

    def matmul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        """a @ b into the statistics-dtype buffer `name`: (B, nh, rows, cols).

        In bf16/fp16 the product is rounded to a's dtype first, as `math`'s scores are:
        torch's CPU matmul has no bf16-in, fp32-out form. The softmax statistics that follow
        are fp32; the scores they start from carry bf16's rounding, which a fused kernel
        (`sdpa`, FlashAttention) avoids by keeping them in fp32."""
        f32 = torch.promote_types(a.dtype, torch.float32)  # the softmax statistics' dtype
        out = self.get(name, a.size(-2), b.size(-1), f32)
        if a.dtype == f32:
            return torch.matmul(a, b, out=out)
        return out.copy_(torch.matmul(a, b, out=self.get("low", a.size(-2), b.size(-1),
                                                        a.dtype)))

    def low(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """x in the matmul dtype: itself when it already is, else a copy in a buffer."""
        if x.dtype == dtype:
            return x
        return self.get("low", x.size(-2), x.size(-1), dtype).copy_(x)
