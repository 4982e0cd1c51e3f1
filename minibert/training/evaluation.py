"""Evaluation during and after a run (`Around.evaluate`, run.py): the held-out batches, the MLM
metrics over them, and the checks on the scores an `eval_fn` of your own returns.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import Dataset

from ..labels import predicted
from ..machine.precision import autocast_context
from .distributed import DistContext, all_reduce_sum
from .state import TrainConfig

# Keys of train's result and of the log rows, which an evaluation must not overwrite.
RUN_KEYS = frozenset({"step", "steps", "tokens_seen", "skipped_steps", "wall_seconds",
                      "train_seconds", "interrupted", "stop_signal", "precision", "environment",
                      "steps_this_run", "scores"})


def eval_batches(eval_set: Dataset, collate: Callable, cfg: TrainConfig,
                 ctx: DistContext = DistContext(),
                 micro_batch_size: Optional[int] = None) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches of the first `cfg.eval_batches` global batches of `eval_set`: the
    same examples and (`MLMCollator`) masks whatever the ranks or `micro_batch_size`."""
    n = min(len(eval_set), cfg.eval_batches * cfg.batch_size)
    mine = list(range(ctx.rank, n, ctx.world_size))
    micro = micro_batch_size or cfg.micro_batch_size or cfg.batch_size // ctx.world_size
    for b0 in range(0, len(mine), micro):
        yield collate([eval_set[i] for i in mine[b0:b0 + micro]], epoch=0)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Mapping[str, Tensor]], precision: str,
             device: torch.device, ctx: Optional[DistContext] = None) -> dict[str, float]:
    """Mean MLM loss, accuracy on masked tokens and perplexity over `batches`, streamed (only
    sums are kept) and, under DDP, summed over the ranks' own batches."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for batch in batches:
        batch = to_device(batch, device)
        with autocast_context(precision, device):
            out = model(**batch)
        labels = batch["labels"]
        targets = labels[predicted(labels, batch.get("attention_mask"))]  # (N,), as out.logits
        n = targets.numel()
        if n:
            sums += torch.stack([out.loss.double() * n,
                                 (out.logits.argmax(-1) == targets).sum().double(),
                                 torch.tensor(float(n), dtype=torch.float64, device=device)])
    if ctx is not None:
        all_reduce_sum(sums, ctx)
    model.train(was_training)
    loss_sum, correct, count = sums.tolist()
    if count == 0:
        raise ValueError("evaluation saw no predicted tokens; is the evaluation set empty?")
    loss = loss_sum / count
    return {"eval_loss": loss, "eval_accuracy": correct / count,
            "perplexity": math.exp(min(loss, 700.0))}


def checked_scores(scores: Any) -> Mapping[str, Any]:
    """What an `eval_fn` returned, refused unless a mapping that leaves RUN_KEYS alone."""
    if not isinstance(scores, Mapping):
        raise TypeError(f"eval_fn must return a mapping of scores, got {type(scores).__name__}")
    if RUN_KEYS & set(scores):
        raise ValueError(f"eval_fn returned {sorted(RUN_KEYS & set(scores))}, names that "
                         f"train's result already uses for the run; rename them (e.g. "
                         f"'entity_precision')")
    return scores


def numbers(scores: Mapping[str, Any]) -> dict[str, float]:
    """The scores a log row holds: the numbers (not booleans, tables or predictions)."""
    return {k: v for k, v in scores.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict:
    """A batch's tensors on `device` (its other values as they are)."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in batch.items()}
