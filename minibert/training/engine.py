"""The training loop: `train`, read top to bottom, its state, and `evaluate`.

One optimizer step of `train`:

    1. `batches.next()`: this rank's share of the next global batch, cut into micro-batches
       (and cut short during a sequence-length warmup, data/seq_warmup.py);
    2. count the predicted tokens of the *whole* global batch (all micro-batches, all ranks);
    3. forward + backward each micro-batch under autocast, scaling its loss so that the
       accumulated gradient is exactly that of the global batch (`micro_step_weight`);
    4. unscale (fp16), clip, and step AdamW, unless something is non-finite (recovery.py);
    5. log, evaluate and checkpoint when due; stop cleanly on SIGTERM / SIGINT.

Everything that moves during a run is in one `TrainState` (step, tokens, data position,
counters), saved and restored whole; the learning rate is `lr_at(step)`, a pure function of
a horizon fixed when the run starts. What a checkpoint holds, and the *run identity* that
a resume must match, are in state.py; how a checkpoint is written and found, in resume.py;
the log's rows and the progress shown, in runlog.py; how a signal stops the loop, in
signals.py.
`train` reads over named phases: `_start` (start or resume), the step (`_global_batch`,
`_accumulate`, `_clip_and_step`, `_count_step`), `_log_step`, evaluation and save, stop,
and `_finish`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import Dataset

from ..atomic import PathLike
from ..data.mlm import count_targets
from ..labels import predicted
from ..data.sampler import GlobalBatches
from ..data.seq_warmup import cut_for_step
from .distributed import DistContext, all_reduce_sum, max_over_ranks, unwrap
from .optim import build_optimizer, lr_at, resolve_warmup, set_lr
from ..machine.precision import autocast_context, keep_precision, resolve_precision
from .recovery import TrainingError  # noqa: F401 (re-exported: minibert.training.engine.TrainingError)
from .recovery import back_off, optimizer_out_of_memory, skip_step
from .resume import claim_out_dir, resume_run, save_run
from .runlog import RunLog, progress_bar, shown
from ..machine.meters import flops_per_token, matmul_weights, parameter_flops_per_token
from ..machine.environment import log_environment
from ..interop.hf import decodes
from ..machine.memory import release_freed_memory, reset_peak_memory
from ..machine.meters import StepMeter, say_if_beaten, stated_ceiling
from .rng import rank_seed, set_seed
from .signals import StopFlag
from .state import TrainConfig, TrainState, bert_config

logger = logging.getLogger(__name__)

# Steps between two hand-backs of the C allocator's free memory (memory.release_freed_memory).
# The number of masked tokens, hence the size of the MLM head's largest blocks, differs from
# step to step, so blocks kept for reuse fit the next request less and less and the heap
# grows beside them: without this, the main job's resident set kept climbing after the
# sequence-length warmup (benchmarks/RESULTS.md, "Sequence-length warmup, and the
# learning-rate warmup's length").
# A trim costs at most one step's page faults (freed pages are mapped again on next use).
RELEASE_EVERY = 50


def micro_step_weight(n_micro: int, n_global: int, world_size: int) -> float:
    """The factor that turns a micro-batch's *mean* loss into its share of the global mean.

    The global-batch loss is  L = (1 / n_global) Σ_ranks Σ_micro Σ_tokens ℓ, where n_global
    counts predicted tokens over every micro-batch on every rank. A micro-batch's mean loss
    is (1 / n_micro) Σ_tokens ℓ, so it contributes mean · n_micro / n_global. DDP averages
    gradients over ranks (divides by world_size), which we undo by multiplying by it.
    Averaging per-micro-batch means instead (loss / accumulation_steps) weights a token in a
    micro-batch with few masked tokens more than one in a micro-batch with many: that is
    not the gradient of the global batch.
    """
    return n_micro * world_size / n_global


def eval_batches(eval_set: Dataset, collate: Callable, cfg: TrainConfig,
                 ctx: DistContext = DistContext(),
                 micro_batch_size: Optional[int] = None) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches of the first `cfg.eval_batches` global batches of `eval_set`.

    The same examples and, with `MLMCollator` (masks keyed by seed and example index), the
    same masks whatever the number of ranks or the micro-batch size, so evaluations of
    different models or runs are comparable number for number. Micro-batches of
    `micro_batch_size` examples (default: the training micro-batch of `cfg`).
    """
    n = min(len(eval_set), cfg.eval_batches * cfg.batch_size)
    mine = list(range(ctx.rank, n, ctx.world_size))
    micro = micro_batch_size or cfg.micro_batch_size or cfg.batch_size // ctx.world_size
    for b0 in range(0, len(mine), micro):
        yield collate([eval_set[i] for i in mine[b0:b0 + micro]], epoch=0)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Mapping[str, Tensor]], precision: str,
             device: torch.device,
             ctx: Optional[DistContext] = None) -> dict[str, float]:
    """Mean MLM loss, accuracy on masked tokens and perplexity over `batches`.

    Streams: only sums are kept, never the logits of more than one micro-batch, so the
    memory does not grow with the evaluation set. Under DDP each rank evaluates its own
    batches and the sums are added over ranks.
    """
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for batch in batches:
        batch = _to_device(batch, device)
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


def train(model: nn.Module, train_set: Dataset, collate: Callable, cfg: TrainConfig,
          out_dir: PathLike, ctx: DistContext = DistContext(),
          eval_set: Optional[Dataset] = None, resume: bool = False, overwrite: bool = False,
          data_identity: Optional[dict] = None, lengths: Optional[Sequence[int]] = None,
          eval_fn: Optional[Callable[[nn.Module, str], Mapping[str, Any]]] = None,
          batches: Optional[GlobalBatches] = None) -> dict[str, Any]:
    """Train `model` on `train_set` (examples that `collate` turns into batches).

    `model`: minibert's, or any nn.Module of yours (docs/runs.md, "A model of your own"):
    `model(**batch)` returns an object with a scalar `.loss` (as the heads' NamedTuples),
    the mean over the batch's targets. `collate(examples, epoch=e)` returns a dict of
    tensors: `input_ids` (B, T), `labels`, any other argument of the forward (without an
    `attention_mask` every position is a token), and is a pure function of its inputs, as
    `MLMCollator` is: that makes accumulation, DDP and resume exact. A micro-batch's loss
    weighs by its targets (`count_targets`): its labels, but IGNORE_INDEX in integer ones
    and padding in per-token ones; each float label (a regression's) is one.
    Writes `metrics.jsonl` and `checkpoints/` under `out_dir` (rank 0); a fresh start into a
    folder holding a run is refused unless `overwrite`. `data_identity`: what the data is,
    compared on `resume` (state.py). Evaluation: `eval_set` for `evaluate`'s MLM metrics, or
    `eval_fn(model, precision) -> scores`, whose numbers are logged and added to the result
    (the last scores whole in result["scores"]); `precision` (result["precision"]) is the
    run's since its first start: evaluate in it. `lengths` (tokens per example) groups
    similar lengths into a batch; `batches` is an order of your own (`next`, `position`,
    `seek`, as `GlobalBatches`, e.g. `TaskMixtureBatches`). Returns the final evaluation and
    the run's totals; a run stopped by a signal saves a checkpoint and returns
    result["interrupted"] and result["stop_signal"].

    What `train` does to the process beyond its model, each a TrainConfig setting:
    - `handle_signals` (default on): SIGTERM / SIGINT end the step in progress, save and
      return (a notebook's interrupt included); the previous handlers are back on return.
    - `peak_flops` (default None): the MFU ceiling is this machine's, measured by its first
      run and recorded in the cache folder (`meters.mfu_ceiling`); a number skips both.
    - `release_memory` (default on): glibc's free memory goes back to the kernel at each new
      sequence length and every RELEASE_EVERY steps (`memory.release_freed_memory`).
    - `progress` (default on): rank 0 draws a tqdm bar, or without tqdm logs a line every
      `log_every` steps, shown on stderr for the call where logging is not set up (`shown`).
    The process's random generators are the run's: seeded per rank, or put back on resume.
    `train` writes no environment variable and no global torch flag.
    """
    with shown(cfg.progress and ctx.is_main):  # runlog.shown: log lines a notebook sees
        run, state = _start(model, train_set, collate, cfg, Path(out_dir), ctx, eval_set,
                            eval_fn, resume, overwrite, dict(data_identity or {}), lengths,
                            batches)
        cfg = run.cfg  # with the run's horizon (decay_steps)
        scores: Optional[Mapping[str, Any]] = None  # the last evaluation's, returned whole
        stop_signal: Optional[int] = None
        with StopFlag(enabled=cfg.handle_signals) as stop:
            while state.step < cfg.max_steps:
                step_start, position = time.perf_counter(), run.batches.position()
                # ---- 1-2: the global batch, its micro-batches and its number of targets
                micros, counts, n_global = _global_batch(run, state)
                set_lr(run.optimizer, _lr(cfg, run.warmup, state.step + 1,
                                          first=state.step == run.start_step))
                # ---- 3: forward + backward, gradients accumulate over micro-batches
                try:
                    loss_sum = _accumulate(run.model, micros, counts, n_global, ctx,
                                           run.precision, ctx.device, run.scaler)
                except torch.OutOfMemoryError:  # the same global batch, in smaller pieces
                    _smaller_micro_batches(run, state, micros[0], position)
                    continue
                # ---- 4: clip and step, unless something is not finite; then the counters
                step = _clip_and_step(run, state, micros, loss_sum, n_global, stop)
                _count_step(run, state, step, micros, n_global, step_start)
                # ---- 5: log, evaluate, save
                _log_step(run, state, step)
                if run.evaluates and _due(cfg.eval_every, state) and state.step < cfg.max_steps:
                    scores = _evaluate_and_log(run, state)
                if (_due(cfg.save_every, state) and state.bad_steps == 0) or step.stopping \
                        or state.step == cfg.max_steps:
                    _save(run, state)
                if cfg.release_memory and state.step % RELEASE_EVERY == 0:
                    release_freed_memory()
                # ---- 6: stop on this rank's signal, or another rank's (told by the all-reduce)
                if step.stopping:
                    stop_signal = stop.signal or signal.SIGTERM
                    logger.warning("stopped by signal at step %d; checkpoint saved, resume "
                                   "with --resume", state.step)
                    break
            stop_signal = stop_signal or _signalled_during_save(stop, ctx)
        return _finish(run, state, scores, stop_signal)


# ---- the phases of a run ----------------------------------------------------------------------

@dataclass
class _Run:
    """A run's wiring, fixed at its start: what the phases of `train` read. What moves is in
    `TrainState`; the optimizer, scaler, meter and log are objects of the run, held here."""

    model: nn.Module  # as the steps call it: DDP- and compile-wrapped where asked
    raw: nn.Module  # the model itself, whose weights are saved (distributed.unwrap)
    cfg: TrainConfig  # with the run's horizon
    ctx: DistContext
    precision: str  # the run's, kept by every resume
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batches: GlobalBatches
    train_set: Dataset
    collate: Callable
    eval_set: Optional[Dataset]
    eval_fn: Optional[Callable[[nn.Module, str], Mapping[str, Any]]]
    data_identity: dict
    ckpt_root: Path
    per_rank: int  # examples per rank of a global batch
    micro: int  # examples per micro-batch, as configured (TrainState's when backed off)
    warmup: int  # learning-rate warmup, in steps
    seq_warmup: int  # sequence-length warmup, in steps (0: off)
    decodes: bool  # a masked LM: its sparse head's FLOPs count on predicted tokens
    own_flops: Optional[float]  # per token, of a model without a BertConfig (`_own_flops`)
    peak: float  # the MFU ceiling of one rank (0 on ranks that do not log)
    env: dict
    log: RunLog
    bar: Any  # tqdm's bar, or None
    meter: StepMeter
    start_step: int
    started: float  # perf_counter() at this start, for wall_seconds
    wall_before: float  # the run's wall time over its earlier starts (TrainState's)

    @property
    def evaluates(self) -> bool:
        return self.eval_set is not None or self.eval_fn is not None

    def micro_batch(self, state: TrainState) -> int:
        """The micro-batch in use: one an out-of-memory error backed off to, else `micro`."""
        return state.micro_batch_size or self.micro


class _Step(NamedTuple):
    """What one optimizer step reports to the rest of the loop."""

    loss: float  # the global batch's mean loss over its predicted tokens
    grad_norm: float  # before clipping
    tokens: int  # non-padding tokens of the global batch, over all ranks
    stopping: bool  # a signal reached some rank: save and return


def _start(model: nn.Module, train_set: Dataset, collate: Callable, cfg: TrainConfig,
           out_dir: Path, ctx: DistContext, eval_set: Optional[Dataset],
           eval_fn: Optional[Callable], resume: bool, overwrite: bool, data_identity: dict,
           lengths: Optional[Sequence[int]], batches: Optional[GlobalBatches]
           ) -> tuple[_Run, TrainState]:
    """Start or resume: check the settings, build the optimizer, scaler and batch order,
    then resume from the newest checkpoint or claim the folder, and settle the precision,
    the MFU ceiling and the data position."""
    device = ctx.device
    if cfg.auto_micro_batch and ctx.world_size > 1:
        # A rank that ran out of memory would retry its forward alone while the others wait
        # in the gradient all-reduce: the collectives stop matching and the job hangs.
        raise ValueError("auto_micro_batch backs off within one process only; under DDP set "
                         "micro_batch_size (--micro-batch-size) to one that fits instead")
    precision = resolve_precision(cfg.precision, device)
    per_rank, micro = cfg.split_batch(ctx.world_size)
    if eval_fn is not None and eval_set is not None:
        raise ValueError("pass eval_set (MLM metrics) or eval_fn (your own), not both")
    model.to(device).train()
    raw = unwrap(model)
    optimizer = build_optimizer(raw, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    batches = batches or GlobalBatches(len(train_set), cfg.batch_size, seed=cfg.seed,
                                       rank=ctx.rank, world_size=ctx.world_size, lengths=lengths)
    env = log_environment(device, precision) if ctx.is_main else {}
    ckpt_root = out_dir / "checkpoints"
    state = TrainState(optimizer=optimizer, scaler=scaler)
    if resume:
        cfg = resume_run(raw, state, cfg, data_identity, ckpt_root, ctx)
    else:  # the horizon first: a warmup longer than it is refused before the folder is cleared
        cfg = replace(cfg, decay_steps=cfg.decay_steps or cfg.max_steps)
        claim_out_dir(out_dir, overwrite, ctx)
        if ctx.rank > 0:  # DDP puts rank 0's weights everywhere; dropout must differ by rank
            set_seed(rank_seed(cfg.seed, ctx.rank))
    state.precision = state.precision or precision  # a resume keeps the run's precision
    precision = keep_precision(state.precision, cfg.precision, precision, device, ctx.is_main)
    peak = (stated_ceiling(cfg.peak_flops, device, precision, ctx.world_size)
            if ctx.is_main else 0.0)  # only rank 0 logs MFU
    batches.seek(state.epoch, state.consumed)
    warmup = resolve_warmup(cfg.warmup, cfg.decay_steps)
    seq_warmup = resolve_warmup(cfg.seq_len_warmup, cfg.decay_steps)
    run = _Run(
        model=_wrap(model, cfg, ctx, device), raw=raw, cfg=cfg, ctx=ctx, precision=precision,
        optimizer=optimizer, scaler=scaler, batches=batches, train_set=train_set,
        collate=collate, eval_set=eval_set, eval_fn=eval_fn, data_identity=data_identity,
        ckpt_root=ckpt_root, per_rank=per_rank, micro=micro,
        warmup=warmup, seq_warmup=seq_warmup,
        # Only a masked LM decodes over the vocabulary; a classifier's FLOPs are the encoder's.
        decodes=decodes(type(raw)), own_flops=_own_flops(raw, ctx.is_main), peak=peak, env=env,
        log=RunLog(out_dir / "metrics.jsonl", stale_after=state.step if resume else None),
        bar=progress_bar(cfg.progress and ctx.is_main, cfg.max_steps, state.step),
        meter=StepMeter(), start_step=state.step, started=time.perf_counter(),
        wall_before=state.wall_seconds)
    reset_peak_memory(device)
    return run, state


def _global_batch(run: _Run, state: TrainState) -> tuple[list[dict], list[int], int]:
    """The next global batch: this rank's micro-batches (cut short during a sequence-length
    warmup), the targets of each, and the targets of the whole batch over all ranks."""
    epoch, indices = run.batches.next()
    examples = [run.train_set[i] for i in indices]
    micro = run.micro_batch(state)
    # An epoch's last batch may be smaller (data/sampler.py): its micro-batches are then
    # fewer or smaller, and the weights of `_accumulate` still make its gradient exact.
    micros = [_checked(run.collate(examples[i:i + micro], epoch=epoch))
              for i in range(0, len(examples), micro)]
    if run.seq_warmup and state.step <= run.seq_warmup:  # data/seq_warmup.py
        # L(step) from the global batch's width, the same however it is split
        full = max_over_ranks(max(b["input_ids"].shape[1] for b in micros), run.ctx)
        micros, new_length = cut_for_step(micros, state.step + 1, run.cfg.seq_len_start,
                                          run.seq_warmup, full)
        if new_length and run.cfg.release_memory:  # the blocks kept for the old shape are stale
            release_freed_memory()
    counts = [count_targets(b) for b in micros]
    n_global = int(all_reduce_sum(torch.tensor(float(sum(counts)), device=run.ctx.device),
                                  run.ctx))
    return micros, counts, n_global


def _smaller_micro_batches(run: _Run, state: TrainState, batch: dict,
                           position: dict[str, int]) -> None:
    """Out of memory: halve the micro-batch (recovery.back_off, which raises where it
    cannot) and put the data back where the failed step took its batch."""
    micro = back_off(batch, run.micro_batch(state), run.per_rank, run.cfg, state,
                     run.optimizer, run.ctx.device)
    state.micro_batch_size = micro  # saved, so a resumed run keeps it
    run.batches.seek(**position)


def _clip_and_step(run: _Run, state: TrainState, micros: list[dict], loss_sum: Tensor,
                   n_global: int, stop: StopFlag) -> _Step:
    """Unscale, clip, and step AdamW, or skip a step whose loss or gradient is not finite
    (recovery.skip_step); one all-reduce tells every rank the loss, the tokens and whether
    any rank was signalled."""
    optimizer, scaler, device = run.optimizer, run.scaler, run.ctx.device
    scaler.unscale_(optimizer)  # true gradients before clipping (no-op unless fp16)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.raw.parameters(),
                                                     run.cfg.max_grad_norm))
    local_tokens = sum(_tokens(b) for b in micros)
    totals = all_reduce_sum(torch.tensor(
        [float(loss_sum), float(local_tokens), float(stop.signal is not None)],
        dtype=torch.float64, device=device), run.ctx).tolist()
    loss = totals[0] / max(n_global, 1)  # a batch with no targets has loss 0
    if math.isfinite(loss) and (math.isfinite(grad_norm) or run.precision == "fp16"):
        _optimizer_step(optimizer, scaler, state, device)
    else:
        skip_step(optimizer, scaler, state, run.cfg, loss, grad_norm, run.ckpt_root)
    optimizer.zero_grad(set_to_none=True)
    return _Step(loss, grad_norm, int(totals[1]), totals[2] > 0)


def _count_step(run: _Run, state: TrainState, step: _Step, micros: list[dict], n_global: int,
                step_start: float) -> None:
    """The counters of a step taken (or skipped): step, tokens, data position, time, and
    the step's model FLOPs for the meter."""
    state.step += 1
    state.tokens_seen += step.tokens
    position = run.batches.position()  # where the next batch comes from
    state.epoch, state.consumed = position["epoch"], position["consumed"]
    seconds = time.perf_counter() - step_start
    state.train_seconds += seconds
    # Model FLOPs of this step: the sparse MLM head is counted for predicted tokens only.
    per_token = run.own_flops if run.own_flops is not None else flops_per_token(
        run.raw.config, micros[0]["input_ids"].shape[1],
        mlm_fraction=n_global / step.tokens if run.decodes else 0.0)
    run.meter.add(step.tokens, seconds, step.tokens * per_token)


def _log_step(run: _Run, state: TrainState, step: _Step) -> None:
    """The progress bar, and a log row when due (rank 0)."""
    cfg = run.cfg
    if run.bar is not None:
        run.bar.update(1)
        run.bar.set_postfix(loss=f"{step.loss:.3f}")
    if run.ctx.is_main and (state.step % cfg.log_every == 0 or state.step == cfg.max_steps):
        row = {"step": state.step, "train_seconds": round(state.train_seconds, 3),
               "loss": round(step.loss, 5),
               "lr": run.optimizer.param_groups[0]["lr"], "grad_norm": round(step.grad_norm, 4),
               **run.meter.take(run.peak * run.ctx.world_size, run.ctx.device),
               "skipped": state.skipped}
        run.log.write(row, run.bar)
        run.log.ceiling_beaten = run.log.ceiling_beaten or say_if_beaten(row["mfu"])


def _evaluate_and_log(run: _Run, state: TrainState) -> Mapping[str, Any]:
    """An evaluation at the current step, its numbers logged in a row of their own (rank 0)."""
    scores = _run_eval(run, state)
    if run.ctx.is_main:
        run.log.write({"step": state.step, "train_seconds": round(state.train_seconds, 3),
                       **_numbers(scores)}, run.bar)
    return scores


def _finish(run: _Run, state: TrainState, scores: Optional[Mapping[str, Any]],
            stop_signal: Optional[int]) -> dict[str, Any]:
    """The run's result: its totals and, unless it was stopped, its final evaluation."""
    if run.bar is not None:
        run.bar.close()
    result: dict[str, Any] = {"steps": state.step, "tokens_seen": state.tokens_seen,
                              "skipped_steps": state.skipped,
                              "wall_seconds": round(_wall_seconds(run), 2),
                              "train_seconds": round(state.train_seconds, 3),
                              # A signal during the last step stops the run all the same:
                              # the script exits 128 + N, and a resume evaluates it.
                              "interrupted": state.step < run.cfg.max_steps or
                              stop_signal is not None,
                              "precision": run.precision,
                              "environment": run.env, "steps_this_run": state.step - run.start_step,
                              "stop_signal": stop_signal}
    if run.ctx.is_main and not result["interrupted"]:
        run.log.settle()
    if run.evaluates and not result["interrupted"]:
        scores = _run_eval(run, state)
        # A resumed run that was already finished (a script's later stage resumed with it)
        # evaluates again for its result; its log may hold that row already, or not (a run
        # stopped at its last step, or during this evaluation).
        if run.ctx.is_main and not run.log.has_eval(state.step):
            run.log.write({"step": state.step, "train_seconds": result["train_seconds"],
                           **_numbers(scores)}, None)
    result.update(_numbers(scores or {}))
    result["scores"] = scores
    return result


# ---- the steps of the loop ------------------------------------------------------------------

def _accumulate(model: nn.Module, micros: list[dict], counts: list[int], n_global: int,
                ctx: DistContext, precision: str, device: torch.device,
                scaler: torch.amp.GradScaler) -> torch.Tensor:
    """Forward + backward every micro-batch; returns this rank's summed token loss."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i, (batch, n) in enumerate(zip(micros, counts)):
        batch = _to_device(batch, device)
        last = i == len(micros) - 1
        # DDP all-reduces gradients in backward; on all but the last micro-batch that would
        # be wasted communication, so no_sync() lets them accumulate locally first.
        sync = contextlib.nullcontext() if last or ctx.world_size == 1 else model.no_sync()
        with sync:
            with autocast_context(precision, device):
                mean = _loss(model(**batch), model)
            if n == 0:  # nothing to predict here: a zero loss still joins DDP's all-reduce
                # (the mean over no targets is NaN, and * 0.0 passes it no gradient)
                loss = mean * 0.0
            else:
                loss = mean * micro_step_weight(n, n_global, ctx.world_size)
                loss_sum += mean.detach().double() * n
            scaler.scale(loss).backward()
    return loss_sum


def _save(run: _Run, state: TrainState) -> None:
    """The checkpoint of this step, with the run's wall time until now in it."""
    state.wall_seconds = _wall_seconds(run)
    save_run(run.ckpt_root, run.raw, state, run.cfg, run.data_identity, run.ctx)


def _wall_seconds(run: _Run) -> float:
    """The run's wall time until now: this start's, after what its earlier starts took up
    to the checkpoint it resumed from (the time a killed start ran past it is lost, as its
    steps are)."""
    return run.wall_before + time.perf_counter() - run.started


def _due(every: int, state: TrainState) -> bool:
    """Whether a thing done every `every` steps (0: never here) is due at this step."""
    return bool(every) and state.step % every == 0


def _signalled_during_save(stop: StopFlag, ctx: DistContext) -> Optional[int]:
    """A signal that reached a rank during the last step's save, after the step had looked
    for one: the run stops all the same, its checkpoint saved, rather than go on to its
    outputs (evaluated and written on a resume)."""
    return max_over_ranks(stop.signal or 0, ctx) or None


def _lr(cfg: TrainConfig, warmup: int, step: int, first: bool) -> float:
    """The rate of `step`, on the horizon fixed at the run's start (min_lr past it)."""
    if step > cfg.decay_steps and (first or step == cfg.decay_steps + 1):  # said once a run
        logger.info("step %d is past the schedule's horizon (decay_steps=%d): the learning "
                    "rate stays at min_lr=%g from here on", step, cfg.decay_steps, cfg.min_lr)
    return lr_at(step, max_lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=warmup,
                 total_steps=cfg.decay_steps, schedule=cfg.schedule)


def _optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                    state: TrainState, device: torch.device) -> None:
    """AdamW's update (through the scaler under fp16), and the counters that follow it."""
    # fp16: an overflow in the *scaled* gradients is the scaler's business: it skips the
    # step and halves the scale. That is calibration, not divergence, so it is counted as
    # skipped but does not bring the run closer to a stop.
    scale = scaler.get_scale() if scaler.is_enabled() else 0.0
    try:
        scaler.step(optimizer)  # the first step allocates AdamW's state
    except torch.OutOfMemoryError as error:
        raise optimizer_out_of_memory(error, state, device) from None
    scaler.update()
    if scaler.is_enabled() and scaler.get_scale() < scale:
        state.skipped += 1
    state.bad_steps = 0


# Keys of train's result and of the log rows, which an evaluation must not overwrite.
_RUN_KEYS = frozenset({"step", "steps", "tokens_seen", "skipped_steps", "wall_seconds",
                       "train_seconds", "interrupted", "stop_signal", "precision", "environment",
                       "steps_this_run", "scores"})


def _run_eval(run: _Run, state: TrainState) -> Mapping[str, Any]:
    """One evaluation: `evaluate`'s MLM metrics, or whatever `eval_fn` scores (a mapping whose
    numbers are logged; the rest, e.g. per-class tables or predictions, is kept for the
    caller in `train`'s result["scores"]). `evaluate` runs in micro-batches of the training
    micro-batch in use (one an out-of-memory error backed off to)."""
    model, raw, ctx, precision, step = run.model, run.raw, run.ctx, run.precision, state.step
    try:
        if run.eval_fn is None:
            batches = eval_batches(run.eval_set, run.collate, run.cfg, ctx, run.micro_batch(state))
            return evaluate(model, batches, precision, ctx.device, ctx)
        raw.eval()  # eval_fn is called in eval mode, without gradients, then back to train
        try:
            with torch.no_grad():
                scores = run.eval_fn(raw, precision)  # the run's, which a resume keeps
        finally:
            raw.train()
    except torch.OutOfMemoryError as error:
        first = (str(error).strip().splitlines() or ["out of memory"])[0]
        raise TrainingError(
            f"out of memory in the evaluation at step {step} ({first}); the checkpoints "
            f"saved before it are kept. Evaluate in smaller batches (eval_fn's own; the "
            f"scripts evaluate in training micro-batches: lower --micro-batch-size) and "
            f"resume") from None
    if not isinstance(scores, Mapping):
        raise TypeError(f"eval_fn must return a mapping of scores, got "
                        f"{type(scores).__name__}")
    if _RUN_KEYS & set(scores):
        raise ValueError(f"eval_fn returned {sorted(_RUN_KEYS & set(scores))}, names that "
                         f"train's result already uses for the run; rename them (e.g. "
                         f"'entity_precision')")
    return scores


def _numbers(scores: Mapping[str, Any]) -> dict[str, float]:
    """The scores a log row holds: the numbers (not booleans, tables or predictions)."""
    return {k: v for k, v in scores.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ---- small pieces -----------------------------------------------------------------------------

def _checked(batch: Any) -> dict:
    """A micro-batch as `collate` made it, refused by name unless it is a dict holding
    `input_ids` (B, T), from which the engine counts tokens and reads the length; its
    `labels` are `count_targets`' to check."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not (torch.is_tensor(ids) and ids.dim() == 2):
        held = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(f"collate must return a dict of tensors with `input_ids` (B, T), from "
                         f"which train counts the tokens; it returned {held}")
    return batch


def _tokens(batch: Mapping[str, Tensor]) -> int:
    """The batch's real tokens: its attention_mask's ones, or every position without one."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def _loss(out: Any, model: nn.Module) -> Tensor:
    """The scalar `.loss` of what `model(**batch)` returned (a NamedTuple's field, or any
    attribute), refused by name where there is none."""
    loss = getattr(out, "loss", None)  # checked here, not defaulted
    if not (torch.is_tensor(loss) and loss.dim() == 0):
        raise TypeError(f"{type(unwrap(model)).__name__}(**batch) returned "
                        f"{type(out).__name__}, without a scalar tensor `.loss`; train needs "
                        f"one: return e.g. a NamedTuple whose `loss` is the mean over the "
                        f"batch's targets")
    return loss


def _own_flops(raw: nn.Module, say: bool) -> Optional[float]:
    """FLOPs per token of a model without a BertConfig, from its weight matrices
    (meters.parameter_flops_per_token), and the log says once what they leave out; None
    for a model whose config gives them (flops_per_token, each step's length)."""
    if bert_config(raw) is not None:
        return None
    # Counted rather than left out: every row keeps its `mfu` column (which plots and the
    # ceiling's check read), and a count that errs low by a stated share still says how
    # the run uses the machine, and compares across runs of one model.
    if say:
        logger.info("MFU of %s, a model without a BertConfig: 6 FLOPs per token for each of "
                    "its %s matmul weights; attention's 12 * layers * hidden * length per "
                    "token is left out, so it reads low by that share "
                    "(meters.parameter_flops_per_token)", type(raw).__name__,
                    f"{matmul_weights(raw):,}")
    return parameter_flops_per_token(raw)


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in batch.items()}


def _wrap(model: nn.Module, cfg: TrainConfig, ctx: DistContext, device: torch.device):
    if ctx.world_size > 1:  # a model whose steps leave some parameters unused says so
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=getattr(model, "unused_parameters_per_step", False))
    return torch.compile(model) if cfg.compile else model
