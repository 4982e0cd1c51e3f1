"""Speed levers: faster ways to compute what plain PyTorch already computes.

Each lever here was kept because a benchmark measured it (`benchmarks/bench_levers.py`; the
numbers, with the machine, are in `benchmarks/RESULTS.md`, "Speed levers kept, each
measured"). Reading BERT, you can skip this file: every function says which plain call it
replaces, and the tests check that both compute the same thing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014): zero each element with probability p and
    scale the survivors by 1 / (1 - p), so the expected value is unchanged.

    On the CPU, `F.dropout` draws one 32-bit random number per element through torch's
    generator. Here one 64-bit draw serves four elements, each keeping 15 random bits (p is
    rounded to a multiple of 1/32768), and only the boolean mask is saved for the backward
    pass: faster per call, forward and backward (measured by benchmarks/bench_levers.py;
    the numbers are in benchmarks/RESULTS.md, "Speed levers kept, each measured"). The
    numbers still come from torch's generator, so `set_seed` and checkpointed RNG states
    reproduce them.
    On other devices `F.dropout` is already a fused kernel and is used as it is.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each
    # Four 16-bit lanes per draw; the low 15 bits of every lane are uniform. (The top lane's
    # sign bit is always 0, which is why 15 and not 16 bits are used.)
    lanes = bits.view(torch.int16)[:n].view(x.shape)
    keep = (lanes & 0x7FFF) >= round(p * 32768)
    return torch.where(keep, x * (1.0 / (1.0 - p)), 0.0)
