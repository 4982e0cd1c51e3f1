"""AdamW with BERT's parameter groups, and the learning-rate schedule as a pure function:
`build_optimizer` (decay on the matrices only, RoBERTa's betas and eps) and `lr_at` (a linear
warmup, then a linear or cosine decay to `min_lr`), so a resume needs only the step. The loop
calls `set_lr` before each update. `step` is 1-based, as the log shows it: step 1, the first
update, gets `max_lr / warmup_steps` (0-based, it would be spent at zero).
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Union

import torch
import torch.nn as nn

logger = logging.getLogger(__name__)

SCHEDULES = ("linear", "cosine")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay on matrices (ndim >= 2, whatever their names), none on biases
    and LayerNorm gains, where it only fights the normalisation (as the original BERT code). Tied
    weights are listed once, frozen ones left out, empty groups dropped."""
    if not isinstance(weight_decay, (int, float)) or isinstance(weight_decay, bool) \
            or not weight_decay >= 0:
        raise ValueError(f"weight_decay={weight_decay!r} must be a number >= 0")
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():  # a tensor shared by two modules comes once
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": float(weight_decay)},
              {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError(f"{type(model).__name__} has no trainable parameters to optimize")
    return groups


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.01,
                    betas: tuple[float, float] = (0.9, 0.98),
                    eps: float = 1e-6) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019): the decay `w -= lr * wd * w` is decoupled from the
    gradient, where Adam's per-coordinate scaling would decay large-gradient weights less.

    eps bounds the update `lr * m / (sqrt(v) + eps)` where `v` is tiny (a rare token's row, early
    steps, coarse half-precision gradients): PyTorch's 1e-8 lets updates explode. RoBERTa (Liu et
    al. 2019): eps=1e-6 with beta2=0.98, so `v` follows a change of gradient scale within about 50
    steps, not 1000. Fused where torch can, else `foreach`; a checkpoint keeps its run's kernel."""
    if not (len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
        raise ValueError(f"betas={betas!r} must be two numbers in [0, 1), e.g. (0.9, 0.98)")
    groups = param_groups(model, weight_decay)
    try:
        opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or torch
        opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, foreach=True)
    logger.debug("AdamW (%s), %d parameter group(s)",
                 "fused" if opt.defaults.get("fused") else "foreach", len(groups))
    return opt


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (call before `optimizer.step()`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def resolve_warmup(warmup: Union[int, float], total_steps: int, name: str = "warmup") -> int:
    """Warmup length in steps from a step count (int, in [0, total_steps]) or a fraction of
    the run (float in [0, 1), rounded: RoBERTa's 0.06 of 10,000 steps is 600). `name` is the
    setting's name in error messages."""
    if isinstance(warmup, bool) or not isinstance(warmup, numbers.Real):
        raise ValueError(f"{name}={warmup!r} must be a step count (int) or a fraction (float)")
    if isinstance(warmup, numbers.Integral):
        steps = int(warmup)
    else:
        if not 0.0 <= warmup < 1.0:
            raise ValueError(f"{name}={warmup!r}: a float is a fraction of the run and must "
                             f"be in [0, 1); pass an int for a number of steps")
        steps = round(float(warmup) * total_steps)
    if steps < 0:
        raise ValueError(f"{name}={warmup!r} must be >= 0")
    if steps > total_steps:
        raise ValueError(f"{name} of {steps} steps is longer than the run "
                         f"(total_steps={total_steps}); shorten {name} or run longer")
    return steps


def lr_at(step: int, *, max_lr: float, min_lr: float = 0.0, warmup_steps: int = 0,
          total_steps: int, schedule: str = "linear") -> float:
    """The learning rate of optimizer step `step` (1-based, see the module docstring).

        warmup   (1 <= step <= warmup_steps):  max_lr * step / warmup_steps
        decay    (warmup_steps < step <= total_steps), p = (step - warmup_steps)
                 / (total_steps - warmup_steps) from 0 to 1:
                     linear:  max_lr - (max_lr - min_lr) * p
                     cosine:  min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2
        after    (step > total_steps):  min_lr

    Post-LN BERT needs the warmup (Xiong et al. 2020); the cosine is SGDR (Loshchilov & Hutter
    2017) without restarts. The arguments are a TrainConfig's, already checked."""
    if warmup_steps > 0 and step <= warmup_steps:  # step 0 is the foot of the ramp: 0
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return float(min_lr)
    p = (step - warmup_steps) / (total_steps - warmup_steps)  # in (0, 1)
    if schedule == "linear":
        return max_lr - (max_lr - min_lr) * p
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
