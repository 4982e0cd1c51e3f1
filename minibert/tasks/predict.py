"""Batched prediction: run a model over a list of encoded examples, get one output each.

    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)
    pred = predict(model, features, collate, batch_size=32)
    classes = [int(c) for c in pred.argmax()]          # sequence classification: (C,) each
    tags = word_predictions(features, pred.argmax())   # token classification: (T, C) each
    starts = pred.outputs["start_logits"]              # question answering: (T,) each

Batches are sorted by length (stable), for little padding; outputs come back in input order,
each cut to its own length, so they do not depend on the batch.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from ..labels import count_targets
from ..machine.precision import autocast_context

# Outputs of two dimensions, (B, T), that are per token (QA's span scores); any output of
# three or more, (B, T, C), is per token too, while a 2-D `logits` is (B, C).
TOKEN_FIELDS = ("start_logits", "end_logits")


class Predictions(NamedTuple):
    """`outputs[field][i]`: example i's float32 CPU output, (C,) or (T_i, ...) per token;
    `loss`: the mean over every target of the set (None without targets)."""

    outputs: dict[str, list[Tensor]]
    loss: Optional[float]

    def argmax(self, field: str = "logits") -> list[Tensor]:
        """Per example, the argmax over the last dimension: a 0-d class id, or (T_i,)."""
        return [x.argmax(-1) for x in self.outputs[field]]


@torch.no_grad()
def predict(model: nn.Module, examples: Sequence[Mapping], collate: Callable[[list], dict],
            batch_size: int, precision: str = "fp32",
            device: torch.device | str = "cpu") -> Predictions:
    """Run `model` (in eval mode, restored after) over `examples`, encoded examples with
    `input_ids`; `collate` makes the model's keyword arguments, its tensors moved to `device`.
    `loss` weights each batch's mean by its targets (`count_targets`): not a mean of means."""
    device = torch.device(device)
    order = np.argsort([len(e["input_ids"]) for e in examples], kind="stable")
    outputs: dict[str, list] = {}
    loss_sum, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for b0 in range(0, len(order), batch_size):
            idx = order[b0:b0 + batch_size]
            batch = {k: v.to(device) if torch.is_tensor(v) else v
                     for k, v in collate([examples[i] for i in idx]).items()}
            with autocast_context(precision, device):
                out = model(**batch)
            if out.loss is not None and (n := count_targets(batch)):  # a batch of no targets
                loss_sum, count = loss_sum + float(out.loss) * n, count + n  # has a NaN mean
            # minibert's outputs are dicts of the fields set; a NamedTuple of one's own head
            # has them all, None included.
            fields = out if isinstance(out, Mapping) else out._asdict()
            for field, value in fields.items():
                if field == "loss" or value is None:
                    continue
                if value.shape[0] != len(idx):  # e.g. MLM logits of the masked rows only
                    raise ValueError(f"the model's {field} has {value.shape[0]} rows for a "
                                     f"batch of {len(idx)} examples; not one per example")
                per_token = value.dim() >= 3 or field in TOKEN_FIELDS  # (B, T, ...)
                value = value.float().cpu()
                if field not in outputs:
                    outputs[field] = [None] * len(examples)
                rows = outputs[field]
                for row, i in enumerate(idx):
                    rows[i] = value[row, :len(examples[i]["input_ids"])] if per_token \
                        else value[row]
    finally:
        model.train(was_training)
    return Predictions(outputs, loss_sum / count if count else None)
