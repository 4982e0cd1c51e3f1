"""The run around the loop (engine.py): `start_run` sets up what `train` reads before its
first step: `Run`, what a step reads, and `Around`, what the loop attaches around the steps
(its `log_step`, `evaluate` and `save` are the loop's calls); `finish_run` gives the result.
Nothing here changes what a step computes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from ..data.sampler import GlobalBatches
from ..data.seq_warmup import schedule_lengths
from ..interop.hf import decodes
from ..machine.environment import log_environment
from ..machine.memory import reset_peak_memory
from ..machine.meters import (StepMeter, flops_per_token, matmul_weights,
                              parameter_flops_per_token, say_if_beaten, stated_ceiling)
from ..machine.precision import run_precision, resolve_precision
from .distributed import DistContext, max_over_ranks, unwrap
from .evaluation import checked_scores, eval_batches, evaluate, numbers
from .optim import build_optimizer, resolve_warmup
from .recovery import TrainingError, back_off
from .resume import claim_out_dir, resume_run, save_run
from .rng import rank_seed, set_seed
from .runlog import RunLog, progress_bar, spoken_seconds
from .signals import StopFlag
from .state import TrainConfig, TrainState, bert_config

logger = logging.getLogger(__name__)


class TrainData(NamedTuple):
    """What `train` trains on: `train_set`'s examples, which `collate` turns into batches,
    in the order of `batches` (default `GlobalBatches`, grouped by `lengths` where given);
    `identity`: what the data is, compared on a resume (state.py)."""

    train_set: Dataset
    collate: Callable
    identity: dict
    lengths: Optional[Sequence[int]] = None
    batches: Optional[GlobalBatches] = None


class Evaluation(NamedTuple):
    """What `train` evaluates: `eval_set` for `evaluate`'s MLM metrics, or `eval_fn(model,
    precision) -> scores` of your own, or neither."""

    eval_set: Optional[Dataset] = None
    eval_fn: Optional[Callable[[nn.Module, str], Mapping[str, Any]]] = None


@dataclass
class Run:
    """What an optimizer step reads (engine.step), fixed at the run's start. What moves is in
    `TrainState`; what the loop attaches around the steps is in `Around`."""

    model: nn.Module  # as the steps call it: DDP- and compile-wrapped where asked
    raw: nn.Module  # the model itself, whose weights are saved (distributed.unwrap)
    cfg: TrainConfig  # with the run's horizon
    ctx: DistContext
    precision: str  # the run's, kept by every resume
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    data: TrainData  # with its batch order, `batches`, settled
    per_rank: int  # examples per rank of a global batch
    micro: int  # examples per micro-batch, as configured (TrainState's when backed off)
    warmup: int  # learning-rate warmup, in steps
    seq_warmup: int  # sequence-length warmup, in steps (0: off)
    ckpt_root: Path  # named by a stop after too many non-finite steps (recovery.skip_step)

    def micro_batch(self, state: TrainState) -> int:
        """The micro-batch in use: one an out-of-memory error backed off to, else `micro`."""
        return state.micro_batch_size or self.micro

    def back_off(self, state: TrainState, batch: dict, position: dict[str, int]) -> None:
        """Out of memory: halve the micro-batch (recovery.back_off, which raises where it
        cannot) and put the data back where the failed step took its batch."""
        state.micro_batch_size = back_off(batch, self.micro_batch(state), self.per_rank,
                                          self.cfg, state, self.optimizer, self.ctx.device)
        self.data.batches.seek(**position)  # the same global batch again, in smaller pieces


class Stepped(NamedTuple):
    """What one optimizer step hands the loop: the global batch's loss (its mean over its
    targets), the gradient norm before clipping, the batch's real tokens on every rank, the
    step's seconds, whether any rank was signalled, and the next step's batch, cut while
    this one computed (None at the last step)."""

    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    signalled: bool
    upcoming: Optional[tuple[dict, list, list, int]]


def say_past_horizon(step: int, cfg: TrainConfig) -> None:
    """Said once, at the first step past the schedule's horizon (`train`, or `start_run` for a
    resume already past it)."""
    logger.info("step %d is past the schedule's horizon (decay_steps=%d): the learning rate "
                "stays at min_lr=%g from here on", step, cfg.decay_steps, cfg.min_lr)


@dataclass
class Around:
    """What the loop attaches around the steps of `run`: evaluation, the log and its bar, the
    checkpoints, and the clock of this start."""

    run: Run
    evaluation: Evaluation
    log: RunLog
    bar: Any  # tqdm's bar, or None
    peak: float  # the MFU ceiling of one rank (0 on ranks that do not log)
    flops: Callable[[int, int, int], float]  # (length, tokens, targets) -> model FLOPs
    meter: StepMeter  # tokens, seconds and FLOPs since the last row
    env: dict
    start_step: int
    started: float  # perf_counter() at this start, for wall_seconds
    wall_before: float  # the run's wall time over its earlier starts (TrainState's)
    widest: int = 0  # the widest batch so far, in positions: the full length, for time_left
    eval_seconds: float = 0.0  # the last evaluation's, for time_left

    @property
    def evaluates(self) -> bool:
        return self.evaluation.eval_set is not None or self.evaluation.eval_fn is not None

    def log_step(self, state: TrainState, done: Stepped,
                 batch: tuple[dict, list, list, int]) -> None:
        """The meter, the progress bar, and a log row when due (rank 0): the step's loss (the
        global batch's mean over its targets), rate, gradient norm (before clipping), the
        meter's tokens/s, MFU and peak memory, and the steps skipped so far. `batch`: the
        step's (engine.global_batch), whose width the meter's FLOPs and the time left count
        from."""
        run, cfg = self.run, self.run.cfg
        position, micros, counts, n_global = batch
        self.meter.add(done.tokens, done.seconds,
                       self.flops(micros[0]["input_ids"].shape[1], done.tokens, n_global))
        self.widest = max([self.widest] + [b["input_ids"].shape[1] for b in micros])
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{done.loss:.3f}")
        if run.ctx.is_main and (state.step % cfg.log_every == 0 or state.step == cfg.max_steps):
            row = {"step": state.step, "train_seconds": round(state.train_seconds, 3),
                   "loss": round(done.loss, 5), "lr": run.optimizer.param_groups[0]["lr"],
                   "grad_norm": round(done.grad_norm, 4),
                   **self.meter.take(self.peak * run.ctx.world_size, run.ctx.device),
                   "skipped": state.skipped}
            self.log.write(row, self.bar)
            self.log.ceiling_beaten = self.log.ceiling_beaten or say_if_beaten(row["mfu"])

    def wall_seconds(self) -> float:
        """The run's wall time until now: this start's, after its earlier starts' up to the
        checkpoint it resumed from (docs/runs.md, "Resume")."""
        return self.wall_before + time.perf_counter() - self.started

    def save(self, state: TrainState) -> None:
        """The checkpoint of this step, with the run's wall time until now in it."""
        run = self.run
        state.wall_seconds = self.wall_seconds()
        save_run(run.ckpt_root, run.raw, state, run.cfg, run.data.identity, run.ctx)

    def evaluate(self, state: TrainState) -> Mapping[str, Any]:
        """One evaluation: `evaluate`'s MLM metrics (in micro-batches of the training
        micro-batch in use), or whatever `eval_fn` scores (train's docstring says how)."""
        run, ctx = self.run, self.run.ctx
        began = time.perf_counter()
        try:
            eval_set, eval_fn = self.evaluation
            if eval_fn is None:
                batches = eval_batches(eval_set, run.data.collate, run.cfg, ctx,
                                       run.micro_batch(state))
                scores = evaluate(run.model, batches, run.precision, ctx.device, ctx)
            else:
                run.raw.eval()  # eval_fn is called in eval mode, without gradients, then back
                try:
                    with torch.no_grad():
                        scores = eval_fn(run.raw, run.precision)  # the run's precision
                finally:
                    run.raw.train()
        except torch.OutOfMemoryError as error:
            first = (str(error).strip().splitlines() or ["out of memory"])[0]
            raise TrainingError(
                f"out of memory in the evaluation at step {state.step} ({first}); the "
                f"checkpoints saved before it are kept. Evaluate in smaller batches "
                f"(eval_fn's own; the scripts evaluate in training micro-batches: lower "
                f"--micro-batch-size) and resume") from None
        self.eval_seconds = time.perf_counter() - began
        return checked_scores(scores)

    def log_eval(self, state: TrainState, scores: Mapping[str, Any]) -> None:
        """An evaluation's numbers in a log row of their own, then, within the run, the time
        it is estimated to have left (rank 0)."""
        if not self.run.ctx.is_main:
            return
        self.log.write({"step": state.step, "train_seconds": round(state.train_seconds, 3),
                        **numbers(scores)}, self.bar)
        if 0 < state.step < self.run.cfg.max_steps:
            logger.info("step %d of %d: about %s left, at this run's speed so far (longer "
                        "sequences to come counted)", state.step, self.run.cfg.max_steps,
                        spoken_seconds(self.time_left(state)))

    def time_left(self, state: TrainState) -> float:
        """Seconds the steps after `state.step` and their evaluations are estimated to take.
        A step costs about its tokens (attention's quadratic share aside, at these lengths),
        so the seconds per position of the steps so far are scaled to the positions of the
        steps left, the sequence-length warmup's growing ones included (a tqdm-style rate of
        steps would miss those); each evaluation left takes the last one's time."""
        cfg = self.run.cfg
        lengths = schedule_lengths(cfg.max_steps, self.widest, cfg.seq_len_start,
                                   self.run.seq_warmup)
        done, left = lengths[:state.step].sum(), lengths[state.step:].sum()
        evaluations_left = (cfg.max_steps - 1) // cfg.eval_every if cfg.eval_every else 0
        evaluations_left += 1 - (state.step // cfg.eval_every if cfg.eval_every else 0)
        return state.train_seconds * float(left) / float(done) + \
            max(evaluations_left, 0) * self.eval_seconds


def start_run(model: nn.Module, data: TrainData, evaluation: Evaluation, cfg: TrainConfig,
              ctx: DistContext, out_dir: Path, *, resume: bool, overwrite: bool
              ) -> tuple[Run, Around, TrainState]:
    """Start or resume: check the settings, build the optimizer, scaler and batch order,
    then resume from the newest checkpoint or claim the folder and seed the ranks, and
    settle the precision, the MFU ceiling and the data position."""
    device = ctx.device
    if cfg.auto_micro_batch and ctx.world_size > 1:
        # A rank that ran out of memory would retry its forward alone while the others wait
        # in the gradient all-reduce: the collectives stop matching and the job hangs.
        raise ValueError("auto_micro_batch backs off within one process only; under DDP set "
                         "micro_batch_size (--micro-batch-size) to one that fits instead")
    precision = resolve_precision(cfg.precision, device)
    per_rank, micro = cfg.split_batch(ctx.world_size)
    check_batch_level_loss(unwrap(model), cfg, micro, ctx.world_size)
    if evaluation.eval_fn is not None and evaluation.eval_set is not None:
        raise ValueError("pass eval_set (MLM metrics) or eval_fn (your own), not both")
    model.to(device).train()
    raw = unwrap(model)
    optimizer = build_optimizer(raw, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    data = data._replace(batches=data.batches or GlobalBatches(
        len(data.train_set), cfg.batch_size, seed=cfg.seed, rank=ctx.rank,
        world_size=ctx.world_size, lengths=data.lengths))
    env = log_environment(device, precision) if ctx.is_main else {}
    ckpt_root = out_dir / "checkpoints"
    state = TrainState(optimizer=optimizer, scaler=scaler)
    if resume:  # the model, the optimizer, the scaler, the data position and every generator
        cfg = resume_run(raw, state, cfg, data.identity, ckpt_root, ctx)
    else:  # the horizon first: a warmup longer than it is refused before the folder is cleared
        cfg = replace(cfg, decay_steps=cfg.decay_steps or cfg.max_steps)
        claim_out_dir(out_dir, overwrite, ctx)
        if ctx.rank > 0:  # DDP puts rank 0's weights everywhere; dropout must differ by rank
            set_seed(rank_seed(cfg.seed, ctx.rank))
    state.precision = state.precision or precision  # a resume keeps the run's precision
    precision = run_precision(state.precision, cfg.precision, precision, device, ctx.is_main)
    peak = (stated_ceiling(cfg.peak_flops, device, precision, ctx.world_size)
            if ctx.is_main else 0.0)  # only rank 0 logs MFU
    data.batches.seek(state.epoch, state.consumed)
    run = Run(
        model=_wrap(model, cfg, ctx, device), raw=raw, cfg=cfg, ctx=ctx, precision=precision,
        optimizer=optimizer, scaler=scaler, data=data, per_rank=per_rank, micro=micro,
        warmup=resolve_warmup(cfg.warmup, cfg.decay_steps),
        seq_warmup=resolve_warmup(cfg.seq_len_warmup, cfg.decay_steps), ckpt_root=ckpt_root)
    around = Around(
        run=run, evaluation=evaluation,
        log=RunLog(out_dir / "metrics.jsonl", stale_after=state.step if resume else None),
        bar=progress_bar(cfg.progress and ctx.is_main, cfg.max_steps, state.step),
        peak=peak, flops=_flops(raw, ctx.is_main), meter=StepMeter(), env=env,
        start_step=state.step, started=time.perf_counter(),
        wall_before=state.wall_seconds)
    if cfg.decay_steps < state.step < cfg.max_steps:  # resumed past the horizon: said once
        say_past_horizon(state.step + 1, cfg)
    reset_peak_memory(device)  # the log's peak_mem_mb is this start's
    return run, around, state


def signalled_during_save(stop: StopFlag, ctx: DistContext) -> Optional[int]:
    """A signal that reached a rank during the last step's save, after the step had looked
    for one: the run stops all the same, its checkpoint saved, rather than go on to its
    outputs (evaluated and written on a resume)."""
    return max_over_ranks(stop.signal or 0, ctx) or None


def finish_run(around: Around, state: TrainState, scores: Optional[Mapping[str, Any]],
               stop_signal: Optional[int]) -> dict[str, Any]:
    """The run's result: its totals and, unless it was stopped, its final evaluation."""
    run = around.run
    if around.bar is not None:
        around.bar.close()
        around.bar = None  # the final evaluation's row is logged without it
    result: dict[str, Any] = {"steps": state.step, "tokens_seen": state.tokens_seen,
                              "skipped_steps": state.skipped,
                              "wall_seconds": round(around.wall_seconds(), 2),
                              "train_seconds": round(state.train_seconds, 3),
                              # A signal during the last step stops the run all the same:
                              # the script exits 128 + N, and a resume evaluates it.
                              "interrupted": state.step < run.cfg.max_steps or
                              stop_signal is not None,
                              "precision": run.precision,
                              "environment": around.env,
                              "steps_this_run": state.step - around.start_step,
                              "stop_signal": stop_signal}
    if run.ctx.is_main and not result["interrupted"]:
        around.log.settle()
    if around.evaluates and not result["interrupted"]:
        scores = around.evaluate(state)
        # A resumed run that was already finished (a script's later stage resumed with it)
        # evaluates again for its result; its log may hold that row already, or not (a run
        # stopped at its last step, or during this evaluation).
        if not around.log.has_eval(state.step):
            around.log_eval(state, scores)
    result.update(numbers(scores or {}))
    result["scores"] = scores
    return result


def check_batch_level_loss(raw: nn.Module, cfg: TrainConfig, micro: int,
                           world_size: int) -> None:
    """Refuse, before anything is written, to split the batch of a model whose loss is one
    over the whole batch (a class attribute `batch_level_loss = True`).

    Accumulation is exact for a mean of per-example (or per-target) terms: a micro-batch's
    mean, weighted by its share of the targets, is its part of the batch's mean
    (`engine.micro_step_weight`). A loss that scores each example against the others of its
    batch (in-batch negatives, a contrastive loss) has no such parts: a micro-batch of 4
    gives each example 3 negatives where the batch of 32 gives 31, another objective than
    `batch_size` says. It is refused rather than warned about: a run that trains on it
    looks like a run at batch_size and is not, and the fix costs one setting."""
    declared = getattr(raw, "batch_level_loss", False)  # a model of one's own may not say
    name = type(raw).__name__
    if not isinstance(declared, bool):
        raise TypeError(f"{name}.batch_level_loss={declared!r} must be True or False (True: "
                        f"the loss is one over the whole batch, which micro-batches would "
                        f"change)")
    if not declared:
        return
    why = (f"{name} declares batch_level_loss=True: its loss is one over the whole batch "
           f"(such as in-batch negatives), which a part of the batch does not compute")
    if world_size > 1:
        raise ValueError(f"{why}, and {world_size} processes would each compute it over "
                         f"{cfg.batch_size // world_size} examples of batch_size="
                         f"{cfg.batch_size}: train it in one process")
    if micro < cfg.batch_size:
        raise ValueError(f"{why}, and micro_batch_size={micro} would compute it over "
                         f"{micro} examples of batch_size={cfg.batch_size}: set "
                         f"micro_batch_size={cfg.batch_size} (or leave it unset), or lower "
                         f"batch_size to one that fits")
    if cfg.auto_micro_batch:
        raise ValueError(f"{why}, and auto_micro_batch=True would split the batch after an "
                         f"out-of-memory error: leave auto_micro_batch off and choose a "
                         f"batch_size that fits")


def _flops(raw: nn.Module, say: bool) -> Callable[[int, int, int], float]:
    """Model FLOPs of a step of `tokens` tokens of `length`, for the meter's MFU: from the
    config (`flops_per_token`; a masked LM's sparse head counted for its `n_global`
    predicted tokens only, since only it decodes over the vocabulary), or, for a model
    without a BertConfig, from its weight matrices."""
    if bert_config(raw) is not None:
        masked_lm = decodes(type(raw))
        return lambda length, tokens, n_global: tokens * flops_per_token(
            raw.config, length, mlm_fraction=n_global / tokens if masked_lm else 0.0)
    # Counted rather than left out: every row keeps its `mfu` column (which plots and the
    # ceiling's check read), and a count that errs low by a stated share still says how
    # the run uses the machine, and compares across runs of one model.
    if say:
        logger.info("MFU of %s, a model without a BertConfig: 6 FLOPs per token for each of "
                    "its %s matmul weights; attention's 12 * layers * hidden * length per "
                    "token is left out, so it reads low by that share "
                    "(meters.parameter_flops_per_token)", type(raw).__name__,
                    f"{matmul_weights(raw):,}")
    per_token = parameter_flops_per_token(raw)
    return lambda length, tokens, n_global: tokens * per_token


def _wrap(model: nn.Module, cfg: TrainConfig, ctx: DistContext, device: torch.device):
    """The model as the steps call it: in DDP across processes, compiled where asked."""
    if ctx.world_size > 1:  # a model whose steps leave some parameters unused says so
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=getattr(model, "unused_parameters_per_step", False))
    return torch.compile(model) if cfg.compile else model
