"""Sequence-length warmup: the first steps of pretraining see shorter sequences.

Each global batch of the first `warmup_steps` steps is cut to its first L(step) positions,
growing linearly from `start` to the full length T, in multiples of 8 (halves rounded up):

    L(step) = clamp(8 * round((start + (T - start) * (step - 1) / warmup_steps) / 8),
                    start, T)          for 1 <= step <= warmup_steps, else T

Li, Zhang and He (2022), "The Stability-Efficiency Dilemma: Investigating Sequence Length
Warmup for Training GPT Models"; DeepSpeed ships it as truncation of each batch, as here.
Early steps cost less and the loss leaves its plateau sooner (benchmarks/RESULTS.md,
"Sequence-length warmup, and the learning-rate warmup's length"). Masks and labels are cut
alike, so the masking stays that of the full block, and a resume truncates as the original
did; blocks lose their closing [SEP] meanwhile, and evaluation uses full blocks.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch


def seq_len_at(step: int, full: int, start: int, warmup_steps: int) -> int:
    """Positions kept at optimizer step `step` (1-based) of blocks `full` tokens long."""
    if step > warmup_steps or start >= full:
        return full
    raw = start + (full - start) * (step - 1) / warmup_steps
    return min(full, max(start, 8 * math.floor(raw / 8 + 0.5)))


def schedule_lengths(steps: int, full: int, start: int, warmup_steps: int) -> np.ndarray:
    """The sequence length of each of optimizer steps 1..`steps`: `seq_len_at`, step by
    step, in one array (a budget and a run's time estimate sum over millions of steps)."""
    if not warmup_steps or start >= full:
        return np.full(steps, full, dtype=np.int64)
    step = np.arange(1, steps + 1, dtype=np.int64)
    # The very operations of seq_len_at, so that every length is the one the run will cut.
    raw = start + (full - start) * (step - 1) / warmup_steps
    cut = np.minimum(full, np.maximum(start, 8 * np.floor(raw / 8 + 0.5))).astype(np.int64)
    return np.where(step > warmup_steps, full, cut)


def truncate(batch: dict, length: int) -> dict:
    """`batch` with every (B, T) tensor cut to its first `length` positions; only a batch
    labelled per position can be cut (QA's answer positions could point past the cut)."""
    labels = batch.get("labels")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2:
        raise ValueError("sequence-length warmup cuts batches labelled per position ((B, T) "
                         "`labels`, as in masked LM); this batch has none, so the cut could "
                         "drop what its labels point at: turn the warmup off (seq_len_warmup=0)")
    width = labels.shape[1]
    if length >= width:
        return batch
    return {k: v[:, :length].contiguous() if isinstance(v, torch.Tensor) and v.dim() == 2
            and v.shape[1] == width else v for k, v in batch.items()}


def cut_for_step(micros: list[dict], step: int, start: int, warmup_steps: int,
                 full: Optional[int] = None) -> tuple[list[dict], bool]:
    """The micro-batches of optimizer step `step` (1-based) cut to L(step), and whether L changed
    from the step before (a new shape: memory kept for the old is stale). `full`: the global batch's
    width (under dynamic padding the widest micro-batch on any rank, so that L(step) does not depend
    on the split); default the widest of `micros`."""
    if full is None:
        full = max(b["input_ids"].shape[1] for b in micros)
    length = seq_len_at(step, full, start, warmup_steps)
    changed = length != seq_len_at(step - 1, full, start, warmup_steps)
    return [truncate(b, length) for b in micros], changed
