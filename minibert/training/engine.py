"""The training loop: `train`, read top to bottom.

One optimizer step is `step`, one block that reads in the order it happens:

    1. `global_batch`: this rank's share of the next global batch, cut into micro-batches
       (and cut short during a sequence-length warmup, data/seq_warmup.py);
    2. count the predicted tokens of the *whole* global batch (all micro-batches, all ranks),
       and set the rate of the warmup and decay schedule (`optim.lr_at`);
    3. forward + backward each micro-batch under autocast (`torch.autocast`, bf16 or fp16),
       scaling its loss so that the accumulated gradient is exactly that of the global batch
       (`micro_step_weight`), and through the grad scaler under fp16; while a GPU runs
       them, the CPU does 1-2 for the next step;
    4. unscale (fp16), clip the gradient norm, and step AdamW, unless something is
       non-finite (recovery.skip_step);
    5. the counters: step, tokens, the data position, time;
    6. log (loss, rate, gradient norm, tokens/s, MFU and peak memory), evaluate and
       checkpoint when due; stop cleanly on SIGTERM / SIGINT.

`train` runs `step` in a loop and attaches the run around it. Beyond the model and the data
(the batch order, `collate`, and a sequence-length warmup's cut), a step runs the code of
this file and of two helpers: optim.py's schedule (`lr_at`, set by `set_lr`) and labels.py's
`count_targets` (what a loss is a mean over). tests/test_step.py writes steps 1-4 out by hand
in a plain loop and gets `train`'s weights bit for bit. `train` trains the model it is given
as it is: the CPU kernels come in where `minibert.fast(model)` is called (the scripts call
it).

Everything that moves during a run is in one `TrainState` (step, tokens, data position,
counters), saved and restored whole (state.py). The run around the loop attaches at named
points, each in a file of its own, and a first reading can skip them all:
    start_run / finish_run  the start (seeds, AdamW, the scaler, precision, resume or a
                            claimed folder, the meter) and the result (run.py)
    around.log_step, around.evaluate, around.save
                            the log row, evaluation (evaluation.py), checkpoints (resume.py)
    StopFlag                SIGTERM / SIGINT end the step in progress (signals.py)
    run.back_off, skip_step an out-of-memory step retried smaller; a non-finite one skipped
                            (recovery.py)
    release_freed_memory    the C allocator's free memory handed back (machine/memory.py)
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor
from torch.utils.data import Dataset

from ..atomic import PathLike
from ..data.sampler import GlobalBatches
from ..data.seq_warmup import cut_for_step
from ..labels import count_targets, count_tokens
from ..machine.memory import release_freed_memory
from ..machine.precision import MATMUL_DTYPES
from .distributed import DistContext, max_over_ranks, unwrap
from .optim import lr_at, set_lr
from .recovery import TrainingError  # noqa: F401 (re-exported: minibert.training.engine.TrainingError)
from .recovery import optimizer_out_of_memory, skip_step
from .run import (Evaluation, Run, Stepped, TrainData, finish_run, say_past_horizon,
                  signalled_during_save, start_run)
from .runlog import shown
from .signals import StopFlag
from .state import TrainConfig, TrainState

logger = logging.getLogger(__name__)

# Steps between two hand-backs of the C allocator's free memory (memory.release_freed_memory):
# blocks of sizes that change step to step fit the next request less and less, and the heap
# grows beside them (docs/machine-room.md, §3). A trim costs at most one step's page faults.
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


def train(model: nn.Module, train_set: Dataset, collate: Callable, cfg: TrainConfig,
          out_dir: PathLike, ctx: DistContext = DistContext(),
          eval_set: Optional[Dataset] = None, resume: bool = False, overwrite: bool = False,
          data_identity: Optional[dict] = None, lengths: Optional[Sequence[int]] = None,
          eval_fn: Optional[Callable[[nn.Module, str], Mapping[str, Any]]] = None,
          batches: Optional[GlobalBatches] = None) -> dict[str, Any]:
    """Train `model` on `train_set` (examples that `collate` turns into batches).

    `model`: minibert's, or any nn.Module of yours (docs/runs.md, "A model of your own"):
    `model(**batch)` returns an object with a scalar `.loss`, the mean over the batch's
    targets. `collate(examples, epoch=e)` returns a dict of tensors (`input_ids` (B, T),
    `labels`, any other argument of the forward; without an `attention_mask` every position
    is a token) and is a pure function of its inputs, as `MLMCollator` is: that makes
    accumulation, DDP and resume exact. A micro-batch's loss weighs by its targets
    (`count_targets`), so a loss that is a mean of per-example (or per-target) terms
    accumulates exactly: micro-batches give the whole batch's gradient. A batch-level loss
    (in-batch negatives, a contrastive loss) does not: a part of the batch computes another
    loss. A model declares one by the class attribute `batch_level_loss = True`, and is
    then refused micro-batches smaller than the batch (micro_batch_size, several
    processes, auto_micro_batch) before anything is written (`run.check_batch_level_loss`).
    Writes `metrics.jsonl` and `checkpoints/` under `out_dir` (rank 0);
    a fresh start into a folder holding a run is refused unless `overwrite`.
    `data_identity`: what the data is, compared on `resume` (state.py). Evaluation:
    `eval_set` for `evaluate`'s MLM metrics, or `eval_fn(model, precision) -> scores`, whose
    numbers are logged and returned (whole in result["scores"]); evaluate in `precision`,
    the run's since its first start. `lengths` (tokens per example) groups similar lengths
    into a batch; `batches` is an order of your own (`next`, `position`, `seek`, as
    `GlobalBatches` and `TaskMixtureBatches`). Returns the final evaluation and the run's
    totals; a run stopped by a signal saves a checkpoint and returns result["interrupted"]
    and result["stop_signal"].

    What `train` does to the process beyond its model, each a TrainConfig setting:
    - `handle_signals` (on): SIGTERM / SIGINT end the step, save, return; handlers restored.
    - `peak_flops` (None): MFU's ceiling, else measured once per machine (`meters.mfu_ceiling`).
    - `release_memory` (on): glibc's free memory goes back to the kernel at each new
      sequence length and every RELEASE_EVERY steps (`memory.release_freed_memory`).
    - `progress` (on): rank 0 draws a tqdm bar where one draws in place (a terminal, a
      notebook). The rows are logged every `log_every` steps whatever it is: above the bar,
      else a line each (runlog.shown).
    Random generators are seeded per rank, or put back on resume. No environment variable
    or global torch flag is written.
    """
    with shown(cfg.progress, ctx.is_main):  # runlog.shown: a bar, or a log line a row
        run, around, state = start_run(
            model, TrainData(train_set, collate, dict(data_identity or {}), lengths, batches),
            Evaluation(eval_set, eval_fn), cfg, ctx, Path(out_dir), resume=resume,
            overwrite=overwrite)
        cfg = run.cfg  # with the run's horizon (decay_steps)
        scores: Optional[Mapping[str, Any]] = None  # the last evaluation's, returned whole
        stop_signal: Optional[int] = None
        if around.evaluates and cfg.eval_at_start and state.step == 0:  # the "before" row
            around.log_eval(state, around.evaluate(state))
        with StopFlag(enabled=cfg.handle_signals) as stop:
            upcoming = None  # the next step's batch, cut while this one computes
            while state.step < cfg.max_steps:
                started = time.perf_counter()
                batch, upcoming = upcoming or global_batch(run, state, state.step + 1), None
                if state.step == cfg.decay_steps:  # a resume already past it: start_run's
                    say_past_horizon(state.step + 1, cfg)
                done = step(run, state, batch, stop, started)
                if done is None:  # out of memory: the same global batch, in smaller pieces
                    continue
                upcoming, stopping = done.upcoming, done.signalled
                # ---- log, evaluate, save, and stop on a signal (any rank's)
                around.log_step(state, done, batch)
                if around.evaluates and state.due(cfg.eval_every) and \
                        state.step < cfg.max_steps:
                    scores = around.evaluate(state)
                    around.log_eval(state, scores)
                if (state.due(cfg.save_every) and state.bad_steps == 0) or stopping \
                        or state.step == cfg.max_steps:
                    around.save(state)
                if cfg.release_memory and state.step % RELEASE_EVERY == 0:
                    release_freed_memory()
                if stopping:
                    stop_signal = stop.signal or signal.SIGTERM
                    logger.warning("stopped by signal at step %d; checkpoint saved, resume "
                                   "with --resume", state.step)
                    break
            stop_signal = stop_signal or signalled_during_save(stop, ctx)
        return finish_run(around, state, scores, stop_signal)


def step(run: Run, state: TrainState, batch: tuple[dict, list, list, int], stop: StopFlag,
         started: float) -> Optional[Stepped]:
    """One optimizer step on `batch` (`global_batch`'s), in the order it happens, timed from
    `started`. Out of memory in forward or backward, it backs off (run.back_off) and
    returns None, and `train` runs the same global batch again in smaller pieces."""
    cfg, ctx, model, optimizer, scaler = run.cfg, run.ctx, run.model, run.optimizer, run.scaler
    device, precision, world = ctx.device, run.precision, ctx.world_size
    # ---- 1-2: this rank's micro-batches of the global batch, and the targets of all of it
    position, micros, counts, n_global = batch
    set_lr(optimizer, lr_at(state.step + 1, max_lr=cfg.optim.lr, min_lr=cfg.optim.min_lr,
                            warmup_steps=run.warmup, total_steps=cfg.decay_steps,
                            schedule=cfg.optim.schedule))  # warmup, then decay
    # ---- 3: forward + backward; the gradients accumulate over the micro-batches
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # summed token losses
    try:
        for i, (micro, n) in enumerate(zip(micros, counts)):
            # DDP all-reduces the gradients in backward; before the last micro-batch that
            # is wasted communication: no_sync() defers it.
            last = i == len(micros) - 1
            with contextlib.nullcontext() if last or world == 1 else model.no_sync():
                inputs = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
                          for k, v in micro.items()}
                # matmuls in bf16 / fp16, reductions and the loss in fp32; fp32: autocast off
                with torch.autocast(device.type, dtype=MATMUL_DTYPES[precision],
                                    enabled=precision != "fp32"):
                    mean = loss_of(model(**inputs), model)
                if n == 0:  # no target here: a zero loss, which still joins DDP's all-reduce
                    loss = mean * 0.0  # (a mean over no targets is NaN)
                else:  # the micro-batch's share of the global batch's mean
                    loss = mean * micro_step_weight(n, n_global, world)
                    loss_sum += mean.detach().double() * n
                scaler.scale(loss).backward()  # scaled under fp16 alone
    except torch.OutOfMemoryError:  # recovery: smaller micro-batches from now on
        run.back_off(state, micros[0], position)
        return None
    # cut the next batch while a GPU runs the queued kernels (nanoGPT's loop)
    upcoming = global_batch(run, state, state.step + 2) if state.step + 1 < cfg.max_steps \
        else None
    # ---- 4: unscale, clip, and step AdamW, unless something is not finite
    scaler.unscale_(optimizer)  # true gradients before clipping (fp16)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.raw.parameters(),
                                                     cfg.optim.max_grad_norm))
    # one all-reduce: the loss, the tokens, and whether a rank was signalled
    totals = torch.tensor([float(loss_sum), float(sum(count_tokens(b) for b in micros)),
                           float(stop.signal is not None)], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(totals)
    loss_all, tokens, signalled = totals.tolist()
    loss = loss_all / max(n_global, 1)  # a batch with no targets has loss 0
    if math.isfinite(loss) and (math.isfinite(grad_norm) or precision == "fp16"):
        # fp16: an overflow in the *scaled* gradients is the scaler's business: it skips the
        # step and halves the scale, counted as skipped, but it is calibration, not
        # divergence, so it brings no stop nearer.
        scale = scaler.get_scale() if scaler.is_enabled() else 0.0
        try:
            scaler.step(optimizer)  # the first step allocates AdamW's state
        except torch.OutOfMemoryError as error:
            raise optimizer_out_of_memory(error, state, device) from None
        scaler.update()
        if scaler.is_enabled() and scaler.get_scale() < scale:
            state.skipped += 1
        state.bad_steps = 0
    else:  # recovery.skip_step: counted; too many in a row stop the run
        skip_step(optimizer, scaler, state, cfg, loss, grad_norm, run.ckpt_root)
    optimizer.zero_grad(set_to_none=True)
    # ---- 5: the counters: step, tokens, where the next batch comes from, time
    state.step += 1
    state.tokens_seen += int(tokens)
    next_at = upcoming[0] if upcoming else run.data.batches.position()
    state.epoch, state.consumed = next_at["epoch"], next_at["consumed"]
    seconds = time.perf_counter() - started
    state.train_seconds += seconds
    return Stepped(loss=loss, grad_norm=grad_norm, tokens=int(tokens), seconds=seconds,
                   signalled=signalled > 0, upcoming=upcoming)


def global_batch(run: Run, state: TrainState, step: int) -> tuple[dict, list, list, int]:
    """Global batch `step`: the data's position before it, this rank's micro-batches (cut
    short during a sequence-length warmup), the targets of each, and of the whole batch."""
    batches, ctx = run.data.batches, run.ctx
    position = batches.position()
    epoch, indices = batches.next()
    examples = [run.data.train_set[i] for i in indices]
    micro = state.micro_batch_size or run.micro  # smaller after an out-of-memory back-off
    # An epoch's last batch may be smaller (data/sampler.py): its micro-batches are then
    # fewer or smaller, and micro_step_weight still makes its gradient exact.
    micros = [checked_batch(run.data.collate(examples[i:i + micro], epoch=epoch))
              for i in range(0, len(examples), micro)]
    if run.seq_warmup and step <= run.seq_warmup + 1:  # data/seq_warmup.py
        # L(step) from the global batch's width, the same however it is split
        full = max_over_ranks(max(b["input_ids"].shape[1] for b in micros), ctx)
        micros, new_length = cut_for_step(micros, step, run.cfg.batch.seq_len_start,
                                          run.seq_warmup, full)
        if new_length and run.cfg.process.release_memory:  # blocks kept for the old shape
            release_freed_memory()                          # are stale
    counts = [count_targets(b) for b in micros]  # on the host: no wait for a GPU
    n_global = sum(counts)
    if ctx.world_size > 1:  # every rank's: a micro-batch's share is of the whole batch
        total = torch.tensor(n_global, device=ctx.device)
        dist.all_reduce(total)
        n_global = int(total)
    return position, micros, counts, n_global


def checked_batch(batch: Any) -> dict:
    """A micro-batch as `collate` made it, refused by name unless a dict holding `input_ids`
    (B, T), which train counts tokens from; its `labels` are `count_targets`' to check."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not (torch.is_tensor(ids) and ids.dim() == 2):
        held = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(f"collate must return a dict of tensors with `input_ids` (B, T), from "
                         f"which train counts the tokens; it returned {held}")
    return batch


def loss_of(out: Any, model: nn.Module) -> Tensor:
    """The scalar `.loss` of what `model(**batch)` returned (a NamedTuple's field, or any
    attribute), refused by name where there is none."""
    loss = getattr(out, "loss", None)  # checked here, not defaulted
    if not (torch.is_tensor(loss) and loss.dim() == 0):
        raise TypeError(f"{type(unwrap(model)).__name__}(**batch) returned "
                        f"{type(out).__name__}, without a scalar tensor `.loss`; train needs "
                        f"one: return e.g. a NamedTuple whose `loss` is the mean over the "
                        f"batch's targets")
    return loss
