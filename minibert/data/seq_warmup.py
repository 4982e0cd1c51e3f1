"""Sequence-length warmup: the first steps of pretraining see shorter sequences.

Each global batch of the first `warmup_steps` steps is cut to its first L(step) positions,
L growing linearly from `start` to the full length and rounded to a multiple of 8 (the
shape the matmul kernels like):

    L(step) = clamp(8 * round((start + (T - start) * (step - 1) / warmup_steps) / 8),
                    start, T)          for 1 <= step <= warmup_steps, else T

(halves rounded up)

Li, Zhang and He (2022), "The Stability-Efficiency Dilemma: Investigating Sequence Length
Warmup for Training GPT Models", introduced it for stability at large batches and learning
rates, and DeepSpeed ships it as truncation of each batch, as here. It pays in two ways:

* an early step costs less, about in proportion to its tokens;
* on the main job, the eval loss leaves the plateau where the model predicts from word
  frequencies and topic alone sooner than with full blocks from the start, and ends lower.
  The main job's warmup, from 16 positions over half the schedule, reached a given loss
  in well under half the time of one from 32 over 30% (benchmarks/RESULTS.md, "Sequence-
  length warmup, and the learning-rate warmup's length" and "On a CPU with native bf16,
  against transformers at its best precision").

Truncation keeps the first L positions of every per-position tensor, masks and labels
included, so the masking stays exactly that of the full block (a pure function of seed,
epoch and example index) and a resumed run truncates exactly as the original did. The
packed blocks then lose their closing [SEP] during the warmup; evaluation always uses
full blocks.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def seq_len_at(step: int, full: int, start: int, warmup_steps: int) -> int:
    """Positions kept at optimizer step `step` (1-based) of blocks `full` tokens long."""
    if step > warmup_steps or start >= full:
        return full
    raw = start + (full - start) * (step - 1) / warmup_steps
    return min(full, max(start, 8 * math.floor(raw / 8 + 0.5)))


def truncate(batch: dict, length: int) -> dict:
    """`batch` with every (B, T) tensor cut to its first `length` positions.

    Only batches labelled per position (masked LM, token classification) can be cut: a
    question-answering batch's answer positions could point past the cut.
    """
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
    """The micro-batches of optimizer step `step` (1-based) cut to L(step), and whether L
    changed from the step before (a new shape, for which memory kept for the old is stale).

    `full` is the global batch's width: with packed blocks every micro-batch has it; under
    dynamic padding it is the widest micro-batch's on any rank (the engine takes the
    maximum over ranks), so that L(step), and with it the step, does not depend on how the
    batch is split. Default: the widest of `micros`. A micro-batch narrower than L is left
    as it is.
    """
    if full is None:
        full = max(b["input_ids"].shape[1] for b in micros)
    length = seq_len_at(step, full, start, warmup_steps)
    changed = length != seq_len_at(step - 1, full, start, warmup_steps)
    return [truncate(b, length) for b in micros], changed
