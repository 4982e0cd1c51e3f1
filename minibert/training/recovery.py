"""What the training loop does when a step goes wrong, kept apart so the loop reads as its
normal path: `skip_step` (non-finite: no update), `back_off` (out of memory: retry in smaller
micro-batches, the gradient still exact) and `optimizer_out_of_memory` (no way back).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .checkpoint import latest_checkpoint
from ..machine.memory import peak_memory_mb
from .state import TrainConfig, TrainState

logger = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, or out of memory with nothing left to shrink)."""


def skip_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
              state: TrainState, cfg: TrainConfig, loss: float, grad_norm: float,
              ckpt_root: Path) -> None:
    """A non-finite loss or gradient: no update, counted; too many in a row stop the run."""
    if scaler.is_enabled():
        # unscale_ has run this step; update() closes it (and halves the scale), without
        # which the next unscale_ raises "unscale_() has already been called".
        scaler.update()
    state.bad_steps += 1
    state.skipped += 1
    logger.warning("step %d: non-finite loss %.4g or gradient norm %.4g, step skipped (%d in "
                   "a row)", state.step + 1, loss, grad_norm, state.bad_steps)
    if state.bad_steps >= cfg.max_bad_steps:
        optimizer.zero_grad(set_to_none=True)
        kept = (f"The last good checkpoint is kept under {ckpt_root}. "
                if latest_checkpoint(ckpt_root) is not None else "No checkpoint was saved. ")
        raise TrainingError(f"{state.bad_steps} consecutive steps had a non-finite loss or "
                            f"gradient; stopping. {kept}The learning rate ({cfg.lr:g}) is the "
                            f"likely cause: lower it, lengthen the warmup, or train Pre-LN "
                            f"blocks (norm_position='pre')")


def back_off(batch: dict, micro: int, per_rank: int, cfg: TrainConfig, state: TrainState,
             optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Out of memory: the micro-batch to retry the step with, or a TrainingError."""
    optimizer.zero_grad(set_to_none=True)
    shape = tuple(batch["input_ids"].shape)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not cfg.auto_micro_batch or micro == 1:
        raise TrainingError(f"out of memory at step {state.step + 1} with micro-batch {shape} "
                            f"(peak {peak_memory_mb(device):.0f} MB); lower --micro-batch-size "
                            f"(the global batch stays the same) or pass auto_micro_batch") from None
    micro //= 2
    while per_rank % micro:  # whole micro-batches only, so the global batch is unchanged
        micro -= 1
    # The same global batch and gradients; with dropout on, other masks than a run that fit.
    logger.warning("out of memory with micro-batch %s: retrying the step with micro-batch %d "
                   "(accumulation %d; with dropout on, the masks drawn differ from a run "
                   "that fitted)", shape, micro, per_rank // micro)
    return micro


def optimizer_out_of_memory(error: torch.OutOfMemoryError, state: TrainState,
                            device: torch.device) -> TrainingError:
    """Out of memory in the optimizer step: the error to stop with, with torch's first line."""
    first = (str(error).strip().splitlines() or ["out of memory"])[0]
    return TrainingError(
        f"out of memory at step {state.step + 1} in the optimizer step (peak "
        f"{peak_memory_mb(device):.0f} MB; {first}): AdamW keeps two fp32 tensors the size of "
        f"the weights, made at the first step, and a smaller micro-batch does not shrink them; "
        f"train a smaller model or use a device with more memory")
