"""Which labels a loss scores: the one rule the heads, the collators and the counts share.

A position or example that predicts nothing carries IGNORE_INDEX, the value torch's
`cross_entropy` skips. Kept apart so that the heads (the model) and the collators (the data)
both read it without either importing the other.
"""

from __future__ import annotations

from typing import Optional

import torch

IGNORE_INDEX = -100  # label value that torch's cross_entropy skips


def predicted(labels: torch.Tensor, attention_mask: Optional[torch.Tensor] = None
              ) -> torch.Tensor:
    """Where a loss scores a label: not IGNORE_INDEX, and, for per-token labels (B, T), on a
    real token (attention_mask 1). The encoder does not compute padding, so the heads never
    score a label there; every count of targets must agree with them. Same shape as labels.

    IGNORE_INDEX marks a class id. A float label is a regression target, which any number
    may be: -100.0 is scored like 0.5 (an MSE averages over every one), so it is kept."""
    if labels.is_floating_point():
        keep = torch.ones_like(labels, dtype=torch.bool)
    else:
        keep = labels != IGNORE_INDEX
    if attention_mask is not None and attention_mask.shape == labels.shape:
        keep &= attention_mask.bool()
    return keep
