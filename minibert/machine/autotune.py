"""The tile of chunked attention, chosen by measuring it on this device.

`attention.chunked_attention` visits the (query, key) grid in tiles of
`BertConfig.attention_chunk_size`. Every tile pays the same fixed cost (Python, kernel
launches, the elementwise softmax updates) beside its matmuls, whose work grows as c². A
larger tile amortises that cost until its (B, nh, c, c) temporaries fall out of cache or the
matmul kernel stops getting faster; where that balance lies is the device's business, so
`pick_chunk_size` times the candidates on the machine at hand. The default tile and how it
was chosen are in benchmarks/RESULTS.md, "Attention backends: memory and time against
sequence length".

This is a benchmark, not part of the model: run it once and store its answer in the config,
so that a run and its resumes keep one tile (a tile changes the rounding, and a decision
taken by timing would differ between two starts of the same command).
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
from torch import Tensor

from ..model.attention import chunked_attention

logger = logging.getLogger(__name__)

# The candidates stop at 512, so the memory stays O(T · c) with a constant c, whatever wins.
# A larger tile needs more memory and must be clearly faster to win: the same tile timed in
# two processes can differ by more than the margin by which a pick preferred it.
CHUNK_CANDIDATES = (64, 128, 256, 512)
LARGER_TILE_GAIN = 0.9  # a larger tile wins only in under 90% of the smaller one's time


def time_chunk_sizes(num_heads: int, head_dim: int, seq_len: int,
                     device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32,
                     candidates: tuple[int, ...] = CHUNK_CANDIDATES,
                     repeats: int = 3) -> dict[int, float]:
    """Seconds of one chunked forward + backward pass per tile size, median of `repeats`.

    One sequence (batch 1) of `seq_len` tokens with `num_heads` heads of `head_dim` dims, after
    one warm-up pass per tile. Tiles longer than `seq_len` are left out (they would all be the
    same single tile). The inputs come from a private generator, so the global RNG is untouched.
    """
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
    """The fastest `chunked_attention` tile for this shape on this device, by `time_chunk_sizes`.

    From the smallest up, a larger tile replaces the best so far only in under
    `LARGER_TILE_GAIN` of its time: a difference within timing noise is not worth the
    memory. Measure once and pass the result as
    `BertConfig.attention_chunk_size`, so the model, its checkpoints and a resumed run keep it
    (a tile changes the rounding, so a run that re-measured could not resume exactly).
    Timing costs a warm-up and `repeats` passes per tile, most at long sequences on a small
    CPU (benchmarks/RESULTS.md, "Attention backends: memory and time against sequence length").
    """
    timings = time_chunk_sizes(num_heads, head_dim, seq_len, device, dtype, candidates, repeats)
    best = min(timings)
    for c in sorted(timings):
        if timings[c] < LARGER_TILE_GAIN * timings[best]:
            best = c
    logger.info("chunked attention at T=%d on %s: %s s -> tile %d", seq_len, device,
                ", ".join(f"{c}: {t:.3f}" for c, t in timings.items()), best)
    return best
