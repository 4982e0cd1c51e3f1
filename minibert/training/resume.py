"""A training run on disk: how a checkpoint is written, found and checked before a resume:
`claim_out_dir` (a fresh start never mixes with an older run), `save_run`, `resume_run` (the
newest intact checkpoint, once its run identity is this run's and its weights are finite)
and `check_resume` (the same refusals, before a script writes anything).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..atomic import make_folders, writing
from .checkpoint import STATE_FILE, latest_checkpoint, load_checkpoint, save_checkpoint, step_dir
from .distributed import DistContext, all_gather_objects, barrier, unwrap
from ..machine.environment import rounding_context
from ..interop.hf import check_finite
from ..machine.precision import resolve_precision
from .rng import rng_state
from .state import Saved, TrainConfig, TrainState, bert_config, check_identity, run_identity

logger = logging.getLogger(__name__)


def claim_out_dir(out_dir: Path, overwrite: bool, ctx: DistContext) -> None:
    """A fresh start never mixes with an older run: refuse, or (overwrite) clear it first."""
    ckpt_root, metrics = out_dir / "checkpoints", out_dir / "metrics.jsonl"
    found = [p.name for p in (ckpt_root, metrics)
             if p.is_file() or (p.is_dir() and any(p.iterdir()))]
    if found and not overwrite:
        raise FileExistsError(f"{out_dir} already holds a run ({', '.join(found)}); resume it, "
                              f"pass overwrite=True to start again (deleting them), or choose "
                              f"another folder")
    barrier(ctx)  # every rank has looked before rank 0 deletes anything
    if ctx.is_main:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        metrics.unlink(missing_ok=True)
        make_folders(out_dir)


@dataclass
class RunPlan:
    """A training run as a script will start it (`train(model, ..., cfg, out_dir, resume=...,
    data_identity=...)`), for `check_resume`. `model` may be on the meta device."""

    model: nn.Module
    cfg: TrainConfig
    data_identity: dict
    out_dir: Path
    resume: bool


def check_resume(plan: RunPlan, device: torch.device) -> Optional[int]:
    """Refuse a resume of `plan` that `resume_run` would refuse, writing nothing (tensors are
    memory-mapped, not read). Returns the step it goes on from (None: no resume)."""
    if not plan.resume:
        return None
    _, saved, _ = _resumable(unwrap(plan.model), plan.cfg, plan.data_identity,
                             Path(plan.out_dir) / "checkpoints", device, mmap=True)
    return Saved.of(saved).step


def _resumable(raw: nn.Module, cfg: TrainConfig, data_identity: dict, ckpt_root: Path,
               device: torch.device, mmap: bool = False) -> tuple[Path, dict, TrainConfig]:
    """The newest intact checkpoint under `ckpt_root` (its path, its content) once it is
    known to continue this run, and `cfg` with the run's horizon."""
    last = latest_checkpoint(ckpt_root)  # verified: its state file matches its sha256
    if last is None:
        raise FileNotFoundError(f"--resume: no intact checkpoint under {ckpt_root}")
    saved = load_checkpoint(last, mmap=mmap, verify=False)
    run = Saved.of(saved)
    if cfg.decay_steps is None:  # the horizon is the run's, whatever max_steps is now
        cfg = replace(cfg, decay_steps=run.train_config["decay_steps"])
    now = {**run_identity(raw, cfg), "data_identity": data_identity}
    check_identity(saved, now, last)
    step = run.step
    if step > cfg.max_steps:  # said before anything is evaluated or written
        raise ValueError(f"--resume: the run in {ckpt_root.parent} is at step {step}, past "
                         f"max_steps={cfg.max_steps} ({last.name}); a run cannot go back: "
                         f"pass max_steps (--max-steps) >= {step}")
    check_saved_weights(saved, last)  # a diverged run's weights are no start
    precision = run.precision  # a resume keeps the run's precision
    try:
        resolve_precision(precision, device)
    except ValueError as e:
        raise ValueError(f"--resume: the run in {ckpt_root.parent} computes in {precision} "
                         f"since its start, which this device cannot: {e}") from None
    return last, saved, cfg


def resume_run(raw: nn.Module, state: TrainState, cfg: TrainConfig, data_identity: dict,
               ckpt_root: Path, ctx: DistContext) -> TrainConfig:
    """Load the newest checkpoint into the model and `state`, once it is known to belong to this
    run; returns `cfg` with the run's horizon (`decay_steps`), whatever `max_steps` is now."""
    last, saved, cfg = _resumable(raw, cfg, data_identity, ckpt_root, ctx.device)
    state.load_state_dict(saved, raw, rank=ctx.rank, seed=cfg.seed)
    before = Saved.of(saved).train_config["micro_batch_size"]
    if cfg.micro_batch_size != before:
        state.micro_batch_size = None  # the resume chose another micro-batch: it wins
        if _draws_dropout(raw):
            logger.warning("micro-batch %s, was %s, with dropout on: dropout's masks are drawn "
                           "one micro-batch at a time, so the run goes on with other masks "
                           "than it would have drawn (the same gradients otherwise); keep "
                           "the micro-batch for a bit-identical resume",
                           cfg.micro_batch_size, before)
    _say_rounding(Saved.of(saved).rounding, ctx.device)
    logger.info("resumed from %s (step %d)", last, state.step)
    return cfg


def _say_rounding(before: Optional[dict], device: torch.device) -> None:
    """Warn, once, where the resume rounds otherwise than the run's last start (another thread
    count, torch or machine); an older checkpoint without the record says nothing."""
    if not before:
        return
    now = rounding_context(device)
    diffs = [f"{k} {now[k]}, was {before[k]}" for k in now if k in before and now[k] != before[k]]
    if diffs:
        logger.warning("resumed with %s: the run goes on equivalent, not bit for bit (the "
                       "same result needs the same thread count, torch and machine; "
                       "docs/runs.md, 'The same result')", "; ".join(diffs))


def _draws_dropout(raw: nn.Module) -> bool:
    """Whether the model draws dropout masks: by its BertConfig, else by a dropout module with
    p > 0 (dropout drawn by a function call is not seen)."""
    config = bert_config(raw)
    if config is not None:
        return bool(config.hidden_dropout or config.attention_dropout)
    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
             nn.FeatureAlphaDropout)
    return any(isinstance(m, kinds) and m.p > 0 for m in raw.modules())


def check_saved_weights(saved: dict, checkpoint: Path) -> None:
    """Refuse a checkpoint whose weights hold NaN or infinity, naming the tensor and the file: a
    finite update can still overflow a weight, and every step resumed from it would be skipped."""
    check_finite(Saved.of(saved).weights, checkpoint / STATE_FILE, fix=(
        f"move {checkpoint.name} out of {checkpoint.parent} to resume from the checkpoint "
        f"before it, or start the run again (a lower learning rate is the usual cure)"))


def save_run(ckpt_root: Path, raw: nn.Module, state: TrainState, cfg: TrainConfig,
             data_identity: dict, ctx: DistContext) -> None:
    """Write the checkpoint of `state.step`, with every rank's random generators."""
    rngs = all_gather_objects(rng_state(), ctx)  # every rank takes part
    saved = state.state_dict(raw, cfg, data_identity, rngs)
    if ctx.is_main:
        with writing(f"checkpoint {step_dir(ckpt_root, state.step)}"):
            save_checkpoint(ckpt_root, state.step, saved, keep=cfg.keep_checkpoints)
    barrier(ctx)
