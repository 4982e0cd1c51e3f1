"""The training loop: one function, `train`, read top to bottom, and `evaluate`.

One optimizer step of `train`:

    1. take this rank's share of the next global batch and cut it into micro-batches;
    2. count the predicted tokens of the *whole* global batch (all micro-batches, all ranks);
    3. forward + backward each micro-batch under autocast, scaling its loss so that the
       accumulated gradient is exactly that of the global batch (see `_micro_step_weight`);
    4. unscale (fp16), clip, skip the step if anything is non-finite, else step AdamW;
    5. log, evaluate and checkpoint when due; stop cleanly on SIGTERM / SIGINT.

The schedule is `lr_at(step)`, a pure function, and the data position is two integers, so a
checkpoint holds everything needed to continue a run exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .data.sampler import LengthGroupedBatchSampler, ShardedSampler
from .distributed import DistContext, all_gather_objects, all_reduce_sum, barrier
from .optim import build_optimizer, lr_at, resolve_warmup, set_lr
from .runtime import (PRECISIONS, autocast_context, flops_per_token, log_environment,
                      measure_peak_flops, mfu, peak_memory_mb, reset_peak_memory,
                      resolve_precision, rng_state, set_rng_state, unwrap)

logger = logging.getLogger(__name__)



class TrainingError(RuntimeError):
    """Training cannot go on (diverged, or out of memory with nothing left to shrink)."""


@dataclass
class TrainConfig:
    """Everything about a run that is not the model. Stored in every checkpoint."""

    batch_size: int = 32  # global: sequences per optimizer step, over all ranks
    micro_batch_size: Optional[int] = None  # per rank and forward pass; None = batch / world
    max_steps: int = 1000
    lr: float = 5e-4
    min_lr: float = 0.0
    warmup: Union[int, float] = 0.1  # optimizer steps, or a fraction of max_steps
    schedule: str = "linear"
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0
    precision: str = "auto"  # auto = bf16 on CUDA devices that support it, fp32 on CPU
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # 0 = only at the end
    eval_batches: int = 50  # global batches of the evaluation set per evaluation
    save_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 3
    max_bad_steps: int = 5  # consecutive non-finite steps before the run is stopped
    auto_micro_batch: bool = False  # halve the micro-batch on out-of-memory and go on
    compile: bool = False
    progress: bool = True
    peak_flops: Optional[float] = None  # FLOP/s for MFU; None = measure once at start

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_steps", "log_every", "eval_batches", "keep_checkpoints",
                     "max_bad_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} must be an "
                                 f"integer >= 1")
        for name in ("eval_every", "save_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be an integer >= 0 (0 = at the end)")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"TrainConfig.micro_batch_size={self.micro_batch_size} must be >= 1")
        if self.precision not in ("auto",) + PRECISIONS:
            raise ValueError(f"TrainConfig.precision={self.precision!r} is not one of "
                             f"{('auto',) + PRECISIONS}")
        if not self.lr > 0 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr}, "
                             f"min_lr={self.min_lr}")
        resolve_warmup(self.warmup, self.max_steps)  # raises on a bad warmup


def count_targets(batch: dict[str, torch.Tensor]) -> int:
    """Predicted items in a batch: masked tokens (MLM) or examples (classification)."""
    return int((batch["labels"] != -100).sum())


@torch.no_grad()
def evaluate(model: nn.Module, batches, precision: str, device: torch.device,
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
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast_context(precision, device):
            out = model(**batch)
        targets = batch["labels"][batch["labels"] != -100]  # (N,), in the order of out.logits
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


def _micro_step_weight(n_micro: int, n_global: int, world_size: int) -> float:
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


class _StopFlag:
    """Set by SIGTERM / SIGINT; the loop finishes its step, saves and returns."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopFlag":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _progress_bar(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def train(model: nn.Module, train_set: Dataset, collate: Callable, cfg: TrainConfig,
          out_dir: Union[str, Path], ctx: DistContext = DistContext(),
          eval_set: Optional[Dataset] = None, resume: bool = False,
          run_info: Optional[dict] = None, lengths: Optional[Sequence[int]] = None,
          eval_fn: Optional[Callable[[nn.Module], dict[str, float]]] = None) -> dict[str, Any]:
    """Train `model` on `train_set` (examples that `collate` turns into batches).

    `collate(examples, epoch=e)` must return a dict of (B, T) tensors with `labels`
    (-100 where nothing is predicted), and be a pure function of its inputs: the masking of
    `MLMCollator` is keyed by (seed, epoch, example index), which is what makes gradient
    accumulation, DDP and resume exact. Writes `metrics.jsonl` and `checkpoints/` under
    `out_dir` (rank 0 only). Returns the final evaluation and run totals.

    Evaluation: with `eval_set`, the MLM metrics of `evaluate`; for other tasks pass
    `eval_fn(model) -> dict of metrics` instead (e.g. accuracy and F1 of a classifier).
    With `lengths` (tokens per example), each global batch holds examples of similar length,
    so dynamic padding wastes little (fine-tuning); without, the order is a plain shuffle
    (packed pretraining blocks all have the same length).
    """
    out_dir, device = Path(out_dir), ctx.device
    precision = resolve_precision(cfg.precision, device)
    per_rank, rem = divmod(cfg.batch_size, ctx.world_size)
    micro = cfg.micro_batch_size or per_rank
    if rem or per_rank % micro:
        raise ValueError(f"batch_size={cfg.batch_size} must split into world_size="
                         f"{ctx.world_size} ranks x whole micro-batches of {micro}")
    model.to(device).train()
    raw = unwrap(model)
    config = raw.config
    optimizer = build_optimizer(raw, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    warmup = resolve_warmup(cfg.warmup, cfg.max_steps)
    if eval_fn is not None and eval_set is not None:
        raise ValueError("pass eval_set (MLM metrics) or eval_fn (your own), not both")
    if len(train_set) < cfg.batch_size:
        raise ValueError(f"the training set has {len(train_set)} examples, fewer than one "
                         f"batch of {cfg.batch_size}; lower the batch size")
    step, epoch, consumed, tokens_seen = 0, 0, 0, 0
    env = log_environment(device, precision) if ctx.is_main else {}
    # Measured before any RNG state is restored, so a resumed run draws what the original did.
    peak = cfg.peak_flops or measure_peak_flops(
        device, torch.bfloat16 if precision == "bf16" else torch.float32)

    ckpt_root = out_dir / "checkpoints"
    if resume:
        last = latest_checkpoint(ckpt_root)
        if last is None:
            raise FileNotFoundError(f"--resume: no intact checkpoint under {ckpt_root}")
        state = load_checkpoint(last)
        _check_resumable(state, asdict(config), asdict(cfg), last)
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        step, tokens_seen = state["step"], state["tokens_seen"]
        epoch, consumed = state["data"]["epoch"], state["data"]["consumed"]
        rngs = state["rng"]
        set_rng_state(rngs[ctx.rank] if ctx.rank < len(rngs) else rngs[0])
        logger.info("resumed from %s (step %d)", last, step)

    if ctx.world_size > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        model = torch.compile(model)

    def epoch_order(e: int) -> list:
        """The global batches of epoch `e` (lists of example indices), a function of the seed."""
        if lengths is None:
            order = ShardedSampler(len(train_set), cfg.batch_size, seed=cfg.seed)
            order.set_epoch(e)
            idx = order.order()
            return [idx[b:b + cfg.batch_size] for b in range(0, len(idx) - cfg.batch_size + 1,
                                                            cfg.batch_size)]
        order = LengthGroupedBatchSampler(lengths, cfg.batch_size, seed=cfg.seed, drop_last=True)
        order.set_epoch(e)
        return order.batches()

    def global_batches():
        """(epoch, this rank's examples) of each global batch, from the saved position on."""
        nonlocal epoch, consumed
        while True:
            for batch in epoch_order(epoch)[consumed // cfg.batch_size:]:
                mine = batch[ctx.rank * per_rank:(ctx.rank + 1) * per_rank]  # this rank's slice
                consumed += cfg.batch_size
                yield epoch, [train_set[int(i)] for i in mine]
            epoch, consumed = epoch + 1, 0

    def checkpoint_state() -> dict[str, Any]:
        return {"model": raw.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "rng": all_gather_objects(rng_state(), ctx),
                "step": step, "tokens_seen": tokens_seen,
                "data": {"epoch": epoch, "consumed": consumed},
                "model_config": asdict(config), "train_config": asdict(cfg),
                "run_info": run_info or {}}

    def save() -> None:
        state = checkpoint_state()  # every rank takes part in gathering the RNG states
        if ctx.is_main:
            save_checkpoint(ckpt_root, step, state, keep=cfg.keep_checkpoints)
        barrier(ctx)

    def run_eval() -> dict[str, float]:
        if eval_fn is not None:  # called in eval mode, without gradients, then back to train
            raw.eval()
            with torch.no_grad():
                metrics = eval_fn(raw)
            raw.train()
            return metrics
        return evaluate(model, eval_batches(), precision, device, ctx)

    def eval_batches():
        # eval_batches global batches, whatever the micro-batch size or number of ranks.
        n = min(len(eval_set), cfg.eval_batches * cfg.batch_size)
        mine = list(range(ctx.rank, n, ctx.world_size))
        for b0 in range(0, len(mine), micro):
            yield collate([eval_set[i] for i in mine[b0:b0 + micro]], epoch=0)

    metrics_file = out_dir / "metrics.jsonl"
    if ctx.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    batches = global_batches()
    has_mlm_head = hasattr(raw, "head")  # a classifier's FLOPs are the encoder's alone
    bar = _progress_bar(cfg.progress and ctx.is_main, cfg.max_steps, step)
    bad_steps, skipped, start_step = 0, 0, step
    window_tokens, window_flops, window_start = 0, 0.0, time.perf_counter()
    run_start = time.perf_counter()
    reset_peak_memory(device)
    with _StopFlag() as stop:
        while step < cfg.max_steps:
            # ---- 1-2: the global batch, its micro-batches and its number of targets
            data_epoch, examples = next(batches)
            micros = [collate(examples[i:i + micro], epoch=data_epoch)
                      for i in range(0, per_rank, micro)]
            counts = [count_targets(b) for b in micros]
            n_global = int(all_reduce_sum(torch.tensor(float(sum(counts)), device=device), ctx))
            set_lr(optimizer, lr_at(step + 1, max_lr=cfg.lr, min_lr=cfg.min_lr,
                                    warmup_steps=warmup, total_steps=cfg.max_steps,
                                    schedule=cfg.schedule))
            # ---- 3: forward + backward, gradients accumulate over micro-batches
            try:
                loss_sum = _accumulate(model, micros, counts, n_global, ctx, precision,
                                       device, scaler)
            except torch.OutOfMemoryError:
                optimizer.zero_grad(set_to_none=True)
                shape = tuple(micros[0]["input_ids"].shape)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if not cfg.auto_micro_batch or micro == 1:
                    raise TrainingError(
                        f"out of memory at step {step + 1} with micro-batch {shape} (peak "
                        f"{peak_memory_mb(device):.0f} MB); lower --micro-batch-size (the "
                        f"global batch stays the same) or pass auto_micro_batch") from None
                micro //= 2
                logger.warning("out of memory with micro-batch %s: retrying the step with "
                               "micro-batch %d (accumulation %d)", shape, micro,
                               per_rank // micro)
                batches = _prepend((data_epoch, examples), batches)  # the same batch again
                continue
            # ---- 4: clip and step, unless something is not finite
            scaler.unscale_(optimizer)  # true gradients before clipping (no-op unless fp16)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.max_grad_norm))
            # One all-reduce for the step's loss, its tokens and whether any rank was signalled.
            local_tokens = sum(int(b["attention_mask"].sum()) for b in micros)
            totals = all_reduce_sum(torch.tensor(
                [float(loss_sum), float(local_tokens), float(stop.signal is not None)],
                dtype=torch.float64, device=device), ctx).tolist()
            loss = totals[0] / max(n_global, 1)  # a batch with no targets has loss 0
            step_tokens, stopping = int(totals[1]), totals[2] > 0
            if math.isfinite(loss) and (math.isfinite(grad_norm) or precision == "fp16"):
                # fp16: an overflow in the *scaled* gradients is the scaler's business: it
                # skips the step and halves the scale. That is calibration, not divergence,
                # so it is counted as skipped but does not bring the run closer to a stop.
                scale = scaler.get_scale() if scaler.is_enabled() else 0.0
                scaler.step(optimizer)
                scaler.update()
                if scaler.is_enabled() and scaler.get_scale() < scale:
                    skipped += 1
                bad_steps = 0
            else:
                bad_steps, skipped = bad_steps + 1, skipped + 1
                logger.warning("step %d: non-finite loss %.4g or gradient norm %.4g, step "
                               "skipped (%d in a row)", step + 1, loss, grad_norm, bad_steps)
                if bad_steps >= cfg.max_bad_steps:
                    optimizer.zero_grad(set_to_none=True)
                    raise TrainingError(
                        f"{bad_steps} consecutive steps had a non-finite loss or gradient; "
                        f"stopping. The last good checkpoint is kept under {ckpt_root}. Lower "
                        f"--lr, raise --warmup-steps, or use --norm pre")
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_seen += step_tokens
            window_tokens += step_tokens
            # Model FLOPs of this step: the sparse MLM head is counted for predicted tokens only.
            window_flops += step_tokens * flops_per_token(
                config, micros[0]["input_ids"].shape[1],
                mlm_fraction=n_global / step_tokens if has_mlm_head else 0.0)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
            # ---- 5: log, evaluate, save
            if ctx.is_main and (step % cfg.log_every == 0 or step == cfg.max_steps):
                seconds = time.perf_counter() - window_start
                tps = window_tokens / max(seconds, 1e-9)
                row = {"step": step, "loss": round(loss, 5), "lr": optimizer.param_groups[0]["lr"],
                       "grad_norm": round(grad_norm, 4), "tokens_per_s": round(tps, 1),
                       # tokens/s counts every rank; so does the ceiling (one per process)
                       "mfu": round(mfu(tps, window_flops / max(window_tokens, 1),
                                        peak * ctx.world_size), 4),
                       "peak_mem_mb": round(peak_memory_mb(device), 1), "skipped": skipped}
                _log_row(metrics_file, row, bar)
                window_tokens, window_flops, window_start = 0, 0.0, time.perf_counter()
                reset_peak_memory(device)
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps and \
                    (eval_set is not None or eval_fn is not None):
                result = run_eval()
                if ctx.is_main:
                    _log_row(metrics_file, {"step": step, **result}, bar)
            periodic = cfg.save_every and step % cfg.save_every == 0 and bad_steps == 0
            if periodic or stopping or step == cfg.max_steps:
                save()
            if stopping:
                logger.warning("stopped by signal at step %d; checkpoint saved, resume with "
                               "--resume", step)
                break
    if bar is not None:
        bar.close()
    result: dict[str, Any] = {"steps": step, "tokens_seen": tokens_seen, "skipped_steps": skipped,
                              "wall_seconds": round(time.perf_counter() - run_start, 2),
                              "interrupted": step < cfg.max_steps, "precision": precision,
                              "environment": env, "steps_this_run": step - start_step}
    if (eval_set is not None or eval_fn is not None) and step == cfg.max_steps:
        metrics = run_eval()
        result.update(metrics)
        if ctx.is_main:
            _log_row(metrics_file, {"step": step, **metrics}, None)
    return result


def _accumulate(model: nn.Module, micros: list[dict], counts: list[int], n_global: int,
                ctx: DistContext, precision: str, device: torch.device,
                scaler: torch.amp.GradScaler) -> torch.Tensor:
    """Forward + backward every micro-batch; returns this rank's summed token loss."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i, (batch, n) in enumerate(zip(micros, counts)):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        last = i == len(micros) - 1
        # DDP all-reduces gradients in backward; on all but the last micro-batch that would
        # be wasted communication, so no_sync() lets them accumulate locally first.
        sync = contextlib.nullcontext() if last or ctx.world_size == 1 else model.no_sync()
        with sync:
            with autocast_context(precision, device):
                out = model(**batch)
            if n == 0:  # nothing to predict here: a zero loss still joins DDP's all-reduce
                loss = out.logits.sum() * 0.0
            else:
                loss = out.loss * _micro_step_weight(n, n_global, ctx.world_size)
                loss_sum += out.loss.detach().double() * n
            scaler.scale(loss).backward()
    return loss_sum


# Fields that may change between a run and its resumption without changing what it computes.
_RESUME_MAY_CHANGE = {"max_steps", "micro_batch_size", "auto_micro_batch", "log_every",
                      "eval_every", "eval_batches", "save_every", "keep_checkpoints",
                      "max_bad_steps", "compile", "progress", "peak_flops"}


def _check_resumable(state: dict, model_config: dict, train_config: dict, path: Path) -> None:
    """Refuse to resume with settings that contradict the checkpoint, naming them."""
    diffs = [f"model {k}: checkpoint {v!r}, now {model_config.get(k)!r}"
             for k, v in state["model_config"].items() if model_config.get(k) != v]
    diffs += [f"{k}: checkpoint {v!r}, now {train_config.get(k)!r}"
              for k, v in state["train_config"].items()
              if k not in _RESUME_MAY_CHANGE and train_config.get(k) != v]
    if diffs:
        raise ValueError(f"cannot resume from {path}: the settings differ from the "
                         f"checkpoint's ({'; '.join(diffs)}); use the original settings or a "
                         f"new --out directory")


def _prepend(item, iterator):
    yield item
    yield from iterator


def _log_row(path: Path, row: dict, bar) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    text = " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in row.items())
    if bar is not None:
        bar.write(text)
    else:
        logger.info(text)
