"""A training run on disk: what a checkpoint holds, and what must match to resume it.

`train` (engine.py) calls these to start, save and resume a run:

* `claim_out_dir`: a fresh start never mixes with an older run in the same folder.
* `save_run`: the checkpoint of a step: weights, optimizer, scaler, every rank's RNG state,
  the TrainState, and the run identity.
* `resume_run`: the newest intact checkpoint, loaded after `check_identity` has compared
  its run identity with this run's.
* `drop_rows_after`: the log rows a killed run wrote after its last checkpoint go.

The *run identity* is everything that decides what a run computes: the model config, the
training settings but those in `RESUME_MAY_CHANGE`, and the data's identity given by the
caller (a corpus fingerprint, `--seq-len`, the tokenizer...). The saved data position only
means something on the same data, so a resume with any of them changed is refused by name.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.nn as nn

from .checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from .distributed import DistContext, all_gather_objects, barrier, unwrap
from .runtime import rng_state, set_rng_state, set_seed

if TYPE_CHECKING:
    from .engine import TrainConfig, TrainState

logger = logging.getLogger(__name__)


# Fields that may change between a run and its resumption without changing what it computes.
RESUME_MAY_CHANGE = frozenset({
    "max_steps", "micro_batch_size", "auto_micro_batch", "log_every", "eval_every",
    "eval_batches", "save_every", "keep_checkpoints", "max_bad_steps", "compile", "progress",
    "peak_flops"})


def rank_seed(seed: int, rank: int) -> int:
    """A seed for `rank`'s own random stream, a function of (seed, rank) (SeedSequence)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


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
        out_dir.mkdir(parents=True, exist_ok=True)


def run_identity(model: nn.Module, cfg: "TrainConfig") -> dict[str, Any]:
    """The model and training settings that decide what a run computes (see RESUME_MAY_CHANGE)."""
    return {"model_config": asdict(unwrap(model).config),
            "train_config": {k: v for k, v in asdict(cfg).items() if k not in RESUME_MAY_CHANGE}}


def resume_run(raw: nn.Module, optimizer, scaler, cfg: "TrainConfig", data_identity: dict,
               ckpt_root: Path, ctx: DistContext) -> tuple[dict[str, int], "TrainConfig"]:
    """Load the newest checkpoint into the model, optimizer, scaler and RNGs, after checking
    that it belongs to this run; returns its TrainState fields and `cfg` with the run's
    horizon (`decay_steps`), which a resumed run keeps whatever `max_steps` is now."""
    last = latest_checkpoint(ckpt_root)
    if last is None:
        raise FileNotFoundError(f"--resume: no intact checkpoint under {ckpt_root}")
    saved = load_checkpoint(last)
    if "train_state" not in saved:
        raise CheckpointError(f"checkpoint {last} was written by an older minibert and has no "
                              f"training state; it cannot be resumed, only read for weights")
    # A setting added to TrainConfig after the checkpoint was written takes its default,
    # which by convention is what training did before the setting existed.
    saved["train_config"] = {**asdict(type(cfg)()), **saved["train_config"]}
    if cfg.decay_steps is None:  # the horizon is the run's, whatever max_steps is now
        cfg = replace(cfg, decay_steps=saved["train_config"]["decay_steps"])
    now = {**run_identity(raw, cfg), "data_identity": data_identity}
    check_identity(saved, now, last)
    raw.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    rngs = saved["rng"]
    if ctx.rank < len(rngs):
        set_rng_state(rngs[ctx.rank])
    else:  # more ranks than the checkpoint had: a stream of its own, not a copy of rank 0's
        logger.warning("rank %d has no saved RNG state (the run had %d ranks); seeding it "
                       "from (seed, rank)", ctx.rank, len(rngs))
        set_seed(rank_seed(cfg.seed, ctx.rank))
    logger.info("resumed from %s (step %d)", last, saved["train_state"]["step"])
    return saved["train_state"], cfg


def check_identity(saved: dict, now: dict, path: Path) -> None:
    """Refuse to resume when any setting of the run identity differs, naming each one."""
    diffs = []
    for section, label in (("model_config", "model "), ("train_config", ""),
                           ("data_identity", "")):
        old = saved.get(section, {}) if section != "train_config" else \
            {k: v for k, v in saved[section].items() if k not in RESUME_MAY_CHANGE}
        new = now[section]
        for key in sorted(set(old) | set(new), key=str):
            if old.get(key, _UNSET) != new.get(key, _UNSET):
                diffs.append(f"{label}{key}: checkpoint {_show(old.get(key, _UNSET))}, now "
                             f"{_show(new.get(key, _UNSET))}")
    if diffs:
        raise ValueError(f"cannot resume from {path}: the settings differ from the "
                         f"checkpoint's ({'; '.join(diffs)}); use the original settings or a "
                         f"new --out directory")


_UNSET = object()


def _show(value: Any) -> str:
    return "not set" if value is _UNSET else repr(value)


def save_run(ckpt_root: Path, raw: nn.Module, optimizer, scaler, state: "TrainState",
             cfg: "TrainConfig", data_identity: dict, ctx: DistContext) -> None:
    """Write the checkpoint of `state.step`: weights, optimizer, RNGs, state and identity."""
    rngs = all_gather_objects(rng_state(), ctx)  # every rank takes part in the gathering
    if ctx.is_main:
        save_checkpoint(ckpt_root, state.step, {
            "model": raw.state_dict(), "model_class": type(raw).__name__,
            "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "rng": rngs,
            "train_state": asdict(state), "model_config": asdict(raw.config),
            "train_config": asdict(cfg), "data_identity": data_identity},
            keep=cfg.keep_checkpoints)
    barrier(ctx)


def drop_rows_after(metrics_file: Path, step: int) -> None:
    """Resuming at `step`: the rows a killed run logged after its checkpoint go, so each
    step appears once. Rewritten through a temporary file, so a crash keeps the old one."""
    if not metrics_file.is_file():
        return
    lines = metrics_file.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if ln.strip() and _row_step(ln) <= step]
    if len(kept) == len(lines):
        return
    tmp = metrics_file.with_name(f".{metrics_file.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, metrics_file)
    logger.info("dropped %d rows of %s logged after step %d", len(lines) - len(kept),
                metrics_file, step)


def _row_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):  # a row cut short by the kill
        return math.inf
