"""Which labels a loss scores: the one rule the heads, the collators and the counts share,
kept apart so that the model and the data both read it without importing each other. The
counts are the unit a step's loss is a mean over (training/engine.py weighs each
micro-batch by them)."""

from __future__ import annotations

from typing import Mapping, Optional

import torch

IGNORE_INDEX = -100  # label value that torch's cross_entropy skips


def predicted(labels: torch.Tensor, attention_mask: Optional[torch.Tensor] = None
              ) -> torch.Tensor:
    """Where a loss scores a label, same shape as `labels`: not IGNORE_INDEX, and for
    per-token labels (B, T) on a real token. A float label (a regression target) is kept."""
    if labels.is_floating_point():
        keep = torch.ones_like(labels, dtype=torch.bool)
    else:
        keep = labels != IGNORE_INDEX
    if attention_mask is not None and attention_mask.shape == labels.shape:
        keep &= attention_mask.bool()
    return keep


def count_targets(batch: Mapping[str, torch.Tensor]) -> int:
    """Predicted items in a batch, the unit its loss is a mean over: masked tokens (MLM), labelled
    real positions (token classification), examples (classification, and QA, whose batches carry
    `start_positions` instead of `labels`), a regression's float labels (`predicted`)."""
    if "labels" not in batch and "start_positions" in batch:
        return int(batch["start_positions"].shape[0])
    if not torch.is_tensor(batch.get("labels")):
        raise ValueError(f"a batch needs `labels`, a tensor of the targets its loss is a mean "
                         f"over (they weigh each micro-batch's loss); this one holds "
                         f"{sorted(batch)}: have collate return the targets as `labels`")
    return int(predicted(batch["labels"], batch.get("attention_mask")).sum())


def count_tokens(batch: Mapping[str, torch.Tensor]) -> int:
    """Real tokens in a batch: its attention_mask's ones, or every position without one."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()
