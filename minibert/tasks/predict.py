"""Batched prediction: run a model over a list of encoded examples, get one output each.

Fine-tuning evaluates by predicting every example of a set and scoring the predictions,
and so does research code that loads a fine-tuned model. `predict` is that loop, once:

    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)
    pred = predict(model, features, collate, batch_size=32)
    classes = [int(c) for c in pred.argmax()]          # sequence classification: (C,) each
    tags = word_predictions(features, pred.argmax())   # token classification: (T, C) each
    starts = pred.outputs["start_logits"]              # question answering: (T,) each

Examples are batched by length (sorted, stable), so a batch holds examples of similar
length and little padding; the outputs come back in the order of the input, each cut to
its own example's length, so they do not depend on the batch an example fell into (the
attention mask keeps padding out of every real token's output).
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from ..data.mlm import count_targets
from ..machine.precision import autocast_context

# Outputs with one value per token although they have only two dimensions, (B, T):
# transformers' names for question answering's span scores. Any output of three or more
# dimensions, (B, T, C), is per token too; a 2-D `logits` is (B, C), one row per example.
TOKEN_FIELDS = ("start_logits", "end_logits")


class Predictions(NamedTuple):
    """`outputs[field][i]`: the model's `field` for example i, a float32 CPU tensor
    ((C,) per sequence; (T_i, ...) per token, T_i the example's own length). `loss`: the
    mean loss over every target of the set (None when the batches carry no targets)."""

    outputs: dict[str, list[Tensor]]
    loss: Optional[float]

    def argmax(self, field: str = "logits") -> list[Tensor]:
        """The argmax over the last dimension, per example: a class id (a 0-d tensor) for
        (C,) outputs, one per token ((T_i,)) for (T_i, C) outputs."""
        return [x.argmax(-1) for x in self.outputs[field]]


@torch.no_grad()
def predict(model: nn.Module, examples: Sequence[Mapping], collate: Callable[[list], dict],
            batch_size: int, precision: str = "fp32",
            device: torch.device | str = "cpu") -> Predictions:
    """Run `model` over `examples` in batches of `batch_size`; outputs in input order.

    examples: encoded examples, each with `input_ids` (its length sorts the batches).
    collate: turns a list of examples into the model's keyword arguments (e.g.
    `data.TaskCollator`); tensors are moved to `device`, other values (a task name) pass.
    precision: the run's precision ("fp32", "bf16", "fp16"), for `autocast_context`.

    The model runs in eval mode (no dropout) without gradients and gets its training mode
    back. When the batches carry targets, `loss` is the mean over all of them: each batch's
    mean loss weighted by its number of targets (`data.mlm.count_targets`: examples, or
    labelled tokens), so it is the loss of the whole set, not a mean of batch means.
    """
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
            for field, value in out._asdict().items():
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
