"""Which labels a loss scores: the one rule the heads, the collators and the counts share,
kept apart so that the model and the data both read it without importing each other."""

from __future__ import annotations

from typing import Optional

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
