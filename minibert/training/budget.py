"""A compute budget: how many optimizer steps fit in a given time (Cramming's budget,
Geiping and Goldstein 2023, "Cramming: Training a Language Model on a Single GPU in One Day").

    seconds = parse_duration("1h")                                   # 3600.0
    times = measure_step_times(model, train_set, collate, cfg, ctx, lengths, precision)
    fit = fit_steps(seconds, times, cfg, full_length)                # fit.steps: the run's N

A run given a time rather than a step count still stops at a step count: `fit_steps` turns
the time into the largest N whose estimated duration fits, and the run is then a run of N
steps, its warmup and decay fitted to N. Measuring is the one decision minibert makes by a
timing. Our rule is that a decision never depends on one ("same command, same result",
docs/runs.md), and a budget is what a user asks for when they ask for a time: so the
decision is taken once, at the run's first start, said in its log, recorded in the run,
and kept by every resume, never measured again. Two machines (or one machine, busier) may
fit other N, hence other runs; given the same N, the run is the same bit for bit as the
run given `--max-steps N`, since measuring trains a throwaway copy and puts back every
random generator it moved.

The estimate of N steps integrates the sequence-length warmup (data/seq_warmup.py): a step
costs more the longer its sequences, and the first steps of a run are short. A step is
timed at a few lengths, the time at the others interpolated between them; the periodic
evaluations are counted from a timed evaluation batch, with whatever an evaluation scores
beyond its batches (`ExtraScores`: the main job's --eval-blimp pairs), and `RESERVE` of the
budget is held back for what is not timed (checkpoints, the log, a machine a little busier
than when it was measured).
"""

from __future__ import annotations

import copy
import numbers
import re
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import Dataset

from ..data.seq_warmup import schedule_lengths, truncate
from ..labels import count_targets
from ..machine.meters import synchronize
from ..machine.precision import autocast_context
from .distributed import DistContext, all_gather_objects, unwrap
from .engine import loss_of, micro_step_weight
from .evaluation import to_device
from .optim import build_optimizer, resolve_warmup
from .rng import rng_state, set_rng_state
from .state import TrainConfig

# The share of the budget held back for what the estimate does not time: checkpoint saves,
# the log, and the spread of step times on a shared machine.
RESERVE = 0.05
# Timed steps at each measured length, after one that is not timed (the first allocates
# AdamW's state and warms the kernels' caches); their median is the step's time.
REPEATS = 3
# The most steps a budget may fit: beyond it, a step count is the plainer way to say a run.
MAX_STEPS = 10_000_000

# Read before and after each timed step; a test sets it to a clock of its own.
clock: Callable[[], float] = time.perf_counter

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)", re.IGNORECASE)
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration as people write it: `90s`, `45m`, `1h`, `1.5h`, or plain seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: write one such as 90s, 45m, 1h or "
                         f"1.5h, or plain seconds")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    if not seconds > 0:
        raise ValueError(f"{text!r}: a time budget must be more than 0, e.g. 90s, 45m, 1h "
                         f"or 1.5h")
    return seconds


@dataclass(frozen=True)
class StepTimes:
    """Seconds an optimizer step takes at some sequence lengths, one evaluation batch at full
    length (0: the run evaluates nothing), and what each evaluation scores beyond its batches
    (`ExtraScores`; 0: nothing)."""

    by_length: Mapping[int, float]
    eval_batch: float
    eval_extra: float = 0.0

    def at(self, length: float) -> float:
        """A step's seconds at `length`: linear between the measured lengths, and the
        nearest one's outside them."""
        lengths = sorted(self.by_length)
        return float(np.interp(length, lengths, [self.by_length[n] for n in lengths]))


@dataclass(frozen=True)
class ExtraScores:
    """What an evaluation scores beyond its batches, for a budget to count: an `eval_fn`'s own
    work, such as scoring BLiMP's pairs. `score(model, precision)` does `share` of it (a
    part is timed, not the whole: scoring costs about its pairs), and its time over `share`
    is an evaluation's."""

    score: Callable[[nn.Module, str], object]
    share: float = 1.0


@dataclass(frozen=True)
class Fit:
    """What a budget fits: `steps` optimizer steps and `evaluations`, estimated to take
    `estimate` seconds of the `usable` ones (the budget less the reserve)."""

    steps: int
    evaluations: int
    estimate: float
    usable: float


def measured_lengths(full: int, start: int) -> list[int]:
    """The lengths a budget times a step at: the sequence-length warmup's first and last and
    the multiple of 8 halfway (one length, `full`, without a warmup). The time at the
    lengths between is interpolated: a step's cost grows about linearly with its length at
    these sizes, attention's quadratic share aside."""
    if start >= full:
        return [full]
    middle = min(full, max(start, 8 * round((start + full) / 16)))
    return sorted({start, middle, full})


def evaluations(steps: int, cfg: TrainConfig) -> int:
    """Evaluations in a run of `steps`: at each `eval_every` step before the last, and the
    final one (engine.train)."""
    return ((steps - 1) // cfg.eval_every if cfg.eval_every else 0) + 1


def estimate_seconds(steps: int, times: StepTimes, cfg: TrainConfig, full: int) -> float:
    """The seconds a run of `steps` optimizer steps of blocks `full` tokens long is estimated
    to take: each step at its length of `cfg`'s sequence-length warmup (a warmup given in
    steps, fixed; as a fraction, a share of `steps`), and its evaluations."""
    # (A warmup in steps longer than `steps` is refused once the run's steps are chosen;
    # for the estimate it only lengthens the short steps.)
    given = cfg.seq_len_warmup
    warmup = resolve_warmup(given, max(steps, given) if isinstance(given, numbers.Integral)
                            else steps)
    lengths = schedule_lengths(steps, full, cfg.seq_len_start, warmup)
    measured = sorted(times.by_length)
    per_step = np.interp(lengths, measured, [times.by_length[n] for n in measured])
    each_evaluation = cfg.eval_batches * times.eval_batch + times.eval_extra
    return float(per_step.sum()) + evaluations(steps, cfg) * each_evaluation


def fit_steps(budget: float, times: StepTimes, cfg: TrainConfig, full: int,
              reserve: float = RESERVE) -> Fit:
    """The most optimizer steps whose estimate (`estimate_seconds`) fits in `budget` seconds
    less `reserve` of it. The estimate grows with the steps (but for the rounding of lengths
    to multiples of 8), so the count is found by doubling, then halving the interval."""
    usable = budget * (1.0 - reserve)

    def fits(steps: int) -> bool:
        return estimate_seconds(steps, times, cfg, full) <= usable

    if not fits(1):
        raise ValueError(f"a budget of {budget:g} s is less than one step and the evaluation "
                         f"(estimated {estimate_seconds(1, times, cfg, full):.3g} s, with "
                         f"{reserve:.0%} held back); give a longer one")
    low, high = 1, 2  # fits(low), and high, once doubled far enough, does not
    while fits(high):
        if high > MAX_STEPS:
            raise ValueError(f"a budget of {budget:g} s fits more than {MAX_STEPS:,} steps; "
                             f"give a step count instead")
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return Fit(low, evaluations(low, cfg), estimate_seconds(low, times, cfg, full), usable)


def measure_step_times(model: nn.Module, train_set: Dataset, collate: Callable,
                       cfg: TrainConfig, ctx: DistContext, lengths: Sequence[int],
                       precision: str, evaluates: bool = True, repeats: int = REPEATS,
                       extra: Optional[ExtraScores] = None,
                       evaluated: Callable[[nn.Module], nn.Module] = lambda m: m) -> StepTimes:
    """Time training steps of `model` at each of `lengths`, and (`evaluates`) an evaluation
    batch at full length, as `train` would take them: this rank's share of a global batch
    of `train_set`'s first examples, in `cfg`'s micro-batches, forward and backward under
    `precision`, clipped, and AdamW's update. `extra`: what each evaluation scores beyond
    its batches, timed once on the same model after an untimed call. `evaluated`: the part of
    the model an evaluation runs, where it is not the whole (a distillation scores its
    student, without the teacher the steps run).

    The steps train a copy of the model with an optimizer of its own, and every random
    generator is put back afterwards: the model, and the run that follows, are as they would
    have been unmeasured. On several ranks each times its own share (without the gradients'
    all-reduce), and the slowest rank's time at each length is every rank's."""
    saved = rng_state()
    try:
        times = _timed(model, train_set, collate, cfg, ctx, lengths, precision, evaluates,
                       repeats, extra, evaluated)
    finally:
        set_rng_state(saved)  # dropout drew from them: the run draws as if never measured
    ranks = all_gather_objects(times, ctx)
    return StepTimes({n: max(r[0][n] for r in ranks) for n in lengths},
                     max(r[1] for r in ranks), max(r[2] for r in ranks))


def _timed(model: nn.Module, train_set: Dataset, collate: Callable, cfg: TrainConfig,
           ctx: DistContext, lengths: Sequence[int], precision: str, evaluates: bool,
           repeats: int, extra: Optional[ExtraScores],
           evaluated: Callable[[nn.Module], nn.Module]) -> tuple[dict[int, float], float, float]:
    """(seconds per step at each length, per evaluation batch, per evaluation's extra
    scores) on this rank."""
    device = ctx.device
    copied = copy.deepcopy(unwrap(model)).to(device).train()  # as train() runs it
    optimizer = build_optimizer(copied, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    per_rank, micro = cfg.split_batch(ctx.world_size)
    examples = [train_set[i % len(train_set)] for i in range(per_rank)]

    def step(length: int) -> None:
        micros = [truncate(collate(examples[i:i + micro], epoch=0), length)
                  for i in range(0, per_rank, micro)]
        counts = [count_targets(b) for b in micros]
        for batch, n in zip(micros, counts):  # the engine's forward and backward
            with autocast_context(precision, device):
                mean = loss_of(copied(**to_device(batch, device)), copied)
            weight = micro_step_weight(n, max(sum(counts), 1), 1) if n else 0.0
            scaler.scale(mean * weight).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(copied.parameters(), cfg.max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    def evaluation() -> None:
        with torch.no_grad(), autocast_context(precision, device):
            for i in range(0, per_rank, micro):
                batch = collate(examples[i:i + micro], epoch=0)
                evaluated(copied)(**to_device(batch, device))

    by_length = {n: _median_seconds(lambda: step(n), repeats, device) for n in lengths}
    eval_batch = eval_extra = 0.0
    if evaluates:
        copied.eval()
        eval_batch = _median_seconds(evaluation, repeats, device)
        if extra is not None:  # as train calls an eval_fn: in eval mode, without gradients
            with torch.no_grad():
                part = _median_seconds(lambda: extra.score(evaluated(copied), precision), 1,
                                       device)
            eval_extra = part / extra.share
    return by_length, eval_batch, eval_extra


def _median_seconds(work: Callable[[], None], repeats: int, device: torch.device) -> float:
    """The median seconds of `repeats` calls of `work`, after one untimed call: robust to a
    call that something else on the machine slowed."""
    work()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = clock()
        work()
        synchronize(device)
        seconds.append(clock() - start)
    return statistics.median(seconds)


def describe(times: StepTimes) -> str:
    """The measured times as the log says them: `0.41 s at 16 tokens, 1.62 s at 128`."""
    shown = [f"{times.by_length[n]:.3g} s at {n} tokens" for n in sorted(times.by_length)]
    return ", ".join(shown) + (f"; an evaluation batch {times.eval_batch:.3g} s"
                               if times.eval_batch else "") + \
        (f", and an evaluation's own scores {times.eval_extra:.3g} s" if times.eval_extra
         else "")

