"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer"), the position scheme of
ModernBERT and most recent encoders, as one function that every attention backend shares.

Learned absolute positions add a vector to each token once, at the input. RoPE instead
rotates each query and key, in every layer, by an angle proportional to its position, so
that the score between two tokens depends on their *relative* offset only. Split a head's
hs dimensions into hs/2 pairs; pair i turns at frequency θ_i = theta^(-2i / hs) (fast for
small i, slow for large i, as the sinusoids of Vaswani et al. 2017). For a query q at
position m and a key k at position n, with R(φ) the 2-D rotation by φ,

    (R(m θ_i) q_i) · (R(n θ_i) k_i) = q_i · R((n - m) θ_i) k_i,

since rotations compose and R(a)ᵀ = R(-a): the product sees n - m alone. Nothing is
learned, and nothing is added to the residual stream.

Which two dimensions form a pair is a layout choice. The paper pairs neighbours (0, 1),
(2, 3), ...; GPT-NeoX, LLaMA and ModernBERT pair dimension i with i + hs/2, which needs no
interleaving: `x · cos + rotate_half(x) · sin`. minibert uses the second layout, so its
weights are ModernBERT's as they are.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def rope_angles(seq_len: int, head_size: int, theta: float, device: torch.device,
                dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin of every (position, dimension) angle, each (T, hs), in fp32 (or fp64, for
    a model in fp64); computed once per (T, hs, theta, device, dtype) and shared, so never
    modify them in place.

    Angle (t, i) = t · theta^(-2i / hs) for the pair's first half; the second half repeats
    it, so that a whole (T, hs) row multiplies a whole head vector. Made outside inference
    mode: angles first cached under `torch.inference_mode()` (an evaluation) would be
    inference tensors, which a later training step could not save for backward.
    """
    if torch.compiler.is_compiling():  # a traced T is a symbol: the graph computes them
        return _angles(seq_len, head_size, theta, device, dtype)
    return _cached_angles(seq_len, head_size, theta, device, dtype)


@functools.lru_cache(maxsize=32)  # every layer and step of a run asks for the same angles
def _cached_angles(seq_len: int, head_size: int, theta: float, device: torch.device,
                   dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    with torch.inference_mode(False):
        return _angles(seq_len, head_size, theta, device, dtype)


def _angles(seq_len: int, head_size: int, theta: float, device: torch.device,
            dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return rope_angles_at(torch.arange(seq_len, device=device), head_size, theta, dtype)


def rope_angles_at(positions: Tensor, head_size: int, theta: float,
                   dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin at given integer positions (..., T) -> each (..., T, hs): the angles of
    `rope_angles` when `positions` is 0 .. T-1, and any others a caller names (a window cut
    from a longer text starts at its own offset). Computed each time, since they change
    with the batch."""
    inv_freq = theta ** (-torch.arange(0, head_size, 2, dtype=dtype, device=positions.device)
                         / head_size)  # (hs/2,)
    angles = positions.to(dtype)[..., None] * inv_freq  # (..., T, hs/2)
    angles = torch.cat((angles, angles), dim=-1)  # (..., T, hs): pair i and i + hs/2 share it
    return angles.cos(), angles.sin()


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension: a quarter turn of every pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys by their positions. x: (B, nh, T, hs); cos, sin: (T, hs), the
    same positions in every row, or (B, 1, T, hs), each row's own (one angle for all heads).

    Each pair (x_i, x_{i+hs/2}) at position t turns by angle (t, i). Computed in fp32 (fp64
    for fp64 inputs, with `rope_dtype`'s angles) and returned in x's dtype: under bf16
    autocast, rounding the rotated vectors once keeps the angles exact, where rounding cos
    and sin to bf16 first would blur far positions.
    """
    wide = x.to(rope_dtype(x.dtype))
    y = wide * cos + rotate_half(wide) * sin
    return y.to(x.dtype)


def rope_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE computes in for inputs of `dtype`: fp32, or fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)
