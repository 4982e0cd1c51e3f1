"""The tile of chunked attention, chosen by measuring it on this device (docs/machine-room.md,
§7): a tile's matmuls amortise its fixed cost until its temporaries fall out of cache. A
benchmark, not part of the model: run it once and store the tile in
`BertConfig.attention_chunk_size`, so a run and its resumes keep one rounding.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
from torch import Tensor

from ..model.attention import chunked_attention

logger = logging.getLogger(__name__)

# Up to 512, so the memory stays O(T · c) whatever wins. A larger tile must be clearly faster
# to win: one tile timed in two processes can differ by more than a narrow margin.
CHUNK_CANDIDATES = (64, 128, 256, 512)
LARGER_TILE_GAIN = 0.9  # a larger tile wins only in under 90% of the smaller one's time


def time_chunk_sizes(num_heads: int, head_dim: int, seq_len: int,
                     device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32,
                     candidates: tuple[int, ...] = CHUNK_CANDIDATES,
                     repeats: int = 3) -> dict[int, float]:
    """Seconds of one chunked forward + backward pass per tile size, median of `repeats` after
    a warm-up, on one sequence of `seq_len` tokens with `num_heads` heads of `head_dim` dims from a
    private generator. Tiles longer than `seq_len` are left out."""
    if not candidates or any(not isinstance(c, int) or c < 1 for c in candidates):
        raise ValueError(f"candidates {candidates!r} must be a non-empty tuple of tile sizes >= 1")
    if min(num_heads, head_dim, seq_len, repeats) < 1:
        raise ValueError(f"num_heads {num_heads}, head_dim {head_dim}, seq_len {seq_len} and "
                         f"repeats {repeats} must all be at least 1")
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(1, num_heads, seq_len, head_dim, generator=gen, device=device,
                                 dtype=dtype) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fits = [c for c in sorted(set(candidates)) if c <= seq_len] or [min(candidates)]
    return {c: _median_seconds(q, k, v, grad, c, repeats) for c in fits}


def _median_seconds(q: Tensor, k: Tensor, v: Tensor, grad: Tensor, chunk: int,
                    repeats: int) -> float:
    def sync() -> None:
        if q.device.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(repeats + 1):  # the first pass is a warm-up
        sync()
        t0 = time.perf_counter()
        torch.autograd.grad(chunked_attention(q, k, v, None, 0.0, chunk), (q, k, v), grad)
        sync()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pick_chunk_size(num_heads: int, head_dim: int, seq_len: int,
                    device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32,
                    candidates: tuple[int, ...] = CHUNK_CANDIDATES, repeats: int = 3) -> int:
    """The fastest `chunked_attention` tile for this shape on this device (`time_chunk_sizes`):
    from the smallest up, a larger tile wins only in under `LARGER_TILE_GAIN` of the best's time,
    as a difference within timing noise is not worth the memory."""
    timings = time_chunk_sizes(num_heads, head_dim, seq_len, device, dtype, candidates, repeats)
    best = min(timings)
    for c in sorted(timings):
        if timings[c] < LARGER_TILE_GAIN * timings[best]:
            best = c
    logger.info("chunked attention at T=%d on %s: %s s -> tile %d", seq_len, device,
                ", ".join(f"{c}: {t:.3f}" for c, t in timings.items()), best)
    return best
