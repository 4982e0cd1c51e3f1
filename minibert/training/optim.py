"""AdamW with BERT's parameter groups, and the learning-rate schedule as a pure function.

Two pieces the training loop needs and research code may want on their own:

* `build_optimizer(model, lr)` gives AdamW with weight decay on the matrices only
  (`param_groups`), RoBERTa's betas and eps, and the fastest kernel the device offers.
* `lr_at(step, ...)` gives the learning rate of an optimizer step: a linear warmup, then a
  linear or cosine decay to `min_lr`. It depends on nothing but its arguments, so resuming a
  run needs no scheduler state in the checkpoint: the step number is enough. The loop sets
  the rate itself before each update with `set_lr(optimizer, lr_at(step, ...))`.

Step numbering: `step` is the 1-based number of the optimizer step about to be taken, the
same number the training log shows once that step is done (1 ... total_steps). Step 1 is the
first update and already gets a non-zero rate, `max_lr / warmup_steps`; step `warmup_steps`
is the peak, `max_lr`; step `total_steps` is the last update and gets `min_lr`. `lr_at(0)`
is the starting point of the ramp (0, or `max_lr` without warmup) and no update uses it. A
0-based convention would spend the whole first update at a learning rate of exactly zero.
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
    """AdamW parameter groups: weight decay on matrices, none on vectors.

    Decay applies to every parameter with two or more dimensions (the weights of the
    matmuls and the embedding tables). Biases and LayerNorm gains (one dimension) are not
    decayed: shrinking a bias or a normalisation gain towards zero is not a useful prior
    and only fights the normalisation, the convention since the original BERT code
    (its `exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]`). Deciding by
    `ndim` instead of by name keeps the rule correct for any module naming.

    Parameters that appear twice (tied weights) are listed once, and frozen parameters
    (`requires_grad=False`) are left out. Empty groups are dropped.
    """
    if not isinstance(weight_decay, (int, float)) or isinstance(weight_decay, bool) \
            or not weight_decay >= 0:
        raise ValueError(f"weight_decay={weight_decay!r} must be a number >= 0")
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    # named_parameters already skips a tensor registered under two names; the id() set
    # also covers the same tensor reached through two different modules.
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
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
    """AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization").

    "Decoupled" means the decay is applied to the weights directly, `w -= lr * wd * w`,
    instead of being added to the gradient as L2 regularisation would be. Through Adam's
    per-coordinate scaling, an L2 term would decay weights with large gradients less than
    weights with small ones; the decoupled form decays all of them at the same rate.

    Why eps matters. Adam's update is `lr * m / (sqrt(v) + eps)`, with `m` and `v` running
    means of the gradient and of its square. When `v` is tiny (a parameter that rarely
    gets a gradient, such as a rare token's embedding row, or the early steps), the ratio
    `m / sqrt(v)` can be large and `eps` is the floor that bounds the step size. With
    half-precision training (bf16, fp16) gradients are coarse, many underflow to zero,
    and `v` can become very small, so an eps that is too small (the PyTorch default, 1e-8)
    lets individual updates explode and the loss spike. An eps that is too large turns
    Adam into SGD with momentum for every coordinate whose `sqrt(v)` is below it, and
    adaptation slows down. RoBERTa (Liu et al. 2019) found eps=1e-6 together with
    beta2=0.98 (instead of 0.999) more stable for large-batch BERT pretraining: the
    shorter memory of beta2 lets `v` follow a sudden change of the gradient scale within
    about 50 steps instead of 1000. Those are the defaults here.

    `lr` is the starting rate; the training loop overrides it before every step with
    `set_lr(optimizer, lr_at(step, ...))`. The fused kernel (one pass over each tensor
    for the whole update) is used wherever torch has it: CUDA, and the CPU since torch 2.4,
    where it is several times faster than the multi-tensor `foreach` kernel (measured in
    benchmarks/RESULTS.md, "Speed levers kept, each measured"); `foreach` is the fallback.
    Both compute AdamW's update, equal up to rounding (not bit for bit: the kernels order
    their floating-point operations differently), so a checkpoint keeps the kernel its run
    began with and a resume uses it.
    """
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
    """Warmup length in steps from a step count (int) or a fraction of the run (float).
    `name` is the setting's name in error messages.

    A float must lie in [0, 1) and is rounded to the nearest step: `0.06` of 10,000 steps is
    600 steps, the fraction RoBERTa used. An int is a step count in [0, total_steps].
    """
    _check_nonneg_int("total_steps", total_steps)
    if isinstance(warmup, bool):
        raise ValueError(f"{name}={warmup!r} must be a step count (int) or a fraction (float)")
    if isinstance(warmup, numbers.Integral):
        steps = int(warmup)
    elif isinstance(warmup, numbers.Real):
        if not 0.0 <= warmup < 1.0:
            raise ValueError(f"{name}={warmup!r}: a float is a fraction of the run and must "
                             f"be in [0, 1); pass an int for a number of steps")
        steps = round(float(warmup) * total_steps)
    else:
        raise ValueError(f"{name}={warmup!r} must be a step count (int) or a fraction (float)")
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
        decay    (warmup_steps < step <= total_steps), with p = (step - warmup_steps)
                 / (total_steps - warmup_steps) going from 0 to 1:
                     linear:  max_lr - (max_lr - min_lr) * p
                     cosine:  min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2
        after    (step > total_steps):  min_lr

    The linear warmup is needed by Post-LN BERT, whose gradients near the output are large
    at initialisation (Xiong et al. 2020); the cosine decay is Loshchilov & Hutter's SGDR
    (2017) without restarts. When `warmup_steps == total_steps` there is no decay phase.
    The arguments are a TrainConfig's, which checked them (`resolve_warmup` the warmup's
    length against the horizon): they are not checked again here.
    """
    if warmup_steps > 0 and step <= warmup_steps:  # step 0 is the foot of the ramp: 0
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return float(min_lr)
    p = (step - warmup_steps) / (total_steps - warmup_steps)  # in (0, 1)
    if schedule == "linear":
        return max_lr - (max_lr - min_lr) * p
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def _check_nonneg_int(name: str, value: object) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}={value!r} must be an integer >= 0")
