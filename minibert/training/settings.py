"""A run's settings by concern (lingua's OptimArgs, CheckpointArgs): `TrainConfig` holds the
run's length and seed, and five groups, each validated where it is declared.

    OptimConfig       AdamW and the learning-rate schedule
    BatchConfig       what one step computes on: the batch, its micro-batches, precision
    LogConfig         what the run says: log rows, evaluations, the bar, MFU's ceiling
    CheckpointConfig  how often checkpoints are written, and how many are kept
    ProcessConfig     what `train()` may do to the process beyond the model

Every setting is also a keyword of `TrainConfig` and an attribute of it, by its own name:
`TrainConfig(lr=3e-4, batch_size=64)` sets `cfg.optim.lr` and `cfg.batch.batch_size`, and
`cfg.lr` reads it. Checkpoints record the settings flat (`TrainConfig.flat`), by those
names, as they always have, so a run started before the groups existed still resumes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Union

from ..machine.precision import PRECISIONS
from ..model.config import check_int
from .optim import SCHEDULES, resolve_warmup


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule (optim.lr_at)."""

    # The main job's rate, with which it reaches transformers' quality; twice stalls on the
    # unigram plateau (Liu et al. 2020; benchmarks/RESULTS.md). Fine-tuning sets its own.
    lr: float = 1e-3
    min_lr: float = 0.0  # the rate at the horizon, and after it
    warmup: Union[int, float] = 0.1  # optimizer steps, or a fraction of decay_steps
    schedule: str = "linear"
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule={self.schedule!r} is not one of {SCHEDULES}")
        if not self.lr > 0 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr}, "
                             f"min_lr={self.min_lr}")
        # Each of these makes a run that exits 0 and trains nothing, or trains backwards.
        if not self.max_grad_norm > 0:
            raise ValueError(f"TrainConfig.max_grad_norm={self.max_grad_norm} must be > 0: 0 "
                             f"clips every gradient to nothing, and a negative norm flips it")
        if not self.adam_eps > 0:
            raise ValueError(f"TrainConfig.adam_eps={self.adam_eps} must be > 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"TrainConfig.weight_decay={self.weight_decay} must be >= 0")
        resolve_warmup(self.warmup, 2**62)  # its form; its length against the horizon below


@dataclass
class BatchConfig:
    """What one optimizer step computes on."""

    batch_size: int = 32  # global: sequences per optimizer step, over all ranks
    micro_batch_size: Optional[int] = None  # per rank and forward pass; None = batch / world
    auto_micro_batch: bool = False  # halve the micro-batch on out-of-memory and go on
    precision: str = "auto"  # see precision.resolve_precision
    compile: bool = False
    # Steps (or a fraction of decay_steps) over which batches grow to full length; 0 = off.
    seq_len_warmup: Union[int, float] = 0
    seq_len_start: int = 32

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len_start"):
            check_int("TrainConfig", name, getattr(self, name), 1)
        if self.micro_batch_size is not None:
            check_int("TrainConfig", "micro_batch_size", self.micro_batch_size, 1)
        if self.precision not in ("auto",) + PRECISIONS:
            raise ValueError(f"TrainConfig.precision={self.precision!r} is not one of "
                             f"{('auto',) + PRECISIONS}")
        resolve_warmup(self.seq_len_warmup, 2**62, name="TrainConfig.seq_len_warmup")

    def split_batch(self, world_size: int) -> tuple[int, int]:
        """(sequences per rank, per micro-batch) of a global batch over `world_size` ranks;
        refused unless whole ranks and micro-batches, as exact accumulation needs."""
        per_rank, rest = divmod(self.batch_size, world_size)
        micro = self.micro_batch_size or per_rank
        if rest or per_rank == 0 or per_rank % micro:
            raise ValueError(f"batch_size={self.batch_size} must split into {world_size} "
                             f"process(es) x whole micro-batches of micro_batch_size={micro}")
        return per_rank, micro


@dataclass
class LogConfig:
    """What the run says and measures."""

    log_every: int = 10
    eval_every: int = 0  # 0 = only at the end
    eval_batches: int = 50  # global batches of the evaluation set per evaluation
    eval_at_start: bool = False  # also evaluate at step 0: where a continued training began
    progress: bool = True
    peak_flops: Optional[float] = None  # MFU ceiling, FLOP/s; None = meters.mfu_ceiling

    def __post_init__(self) -> None:
        for name in ("log_every", "eval_batches"):
            check_int("TrainConfig", name, getattr(self, name), 1)
        check_int("TrainConfig", "eval_every", self.eval_every, 0)
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ValueError(f"TrainConfig.peak_flops={self.peak_flops} must be > 0 (FLOP/s), "
                             f"or None for this machine's recorded ceiling")


@dataclass
class CheckpointConfig:
    """How often the run is saved, and how much of it is kept."""

    save_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        check_int("TrainConfig", "save_every", self.save_every, 0)
        check_int("TrainConfig", "keep_checkpoints", self.keep_checkpoints, 1)


@dataclass
class ProcessConfig:
    """What train() may do to the process beyond the model (its docstring says each one)."""

    handle_signals: bool = True  # SIGTERM / SIGINT save a checkpoint and return
    release_memory: bool = True  # hand glibc's free memory back (memory.release_freed_memory)


GROUPS = {"optim": OptimConfig, "batch": BatchConfig, "log": LogConfig,
          "checkpoints": CheckpointConfig, "process": ProcessConfig}
_GROUP_OF = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclass(init=False)
class TrainConfig:
    """Everything about a run that is not the model. Stored in every checkpoint."""

    max_steps: int = 1000  # where this run stops; may change on resume
    decay_steps: Optional[int] = None  # the schedule's horizon; None = max_steps of the start
    seed: int = 0
    max_bad_steps: int = 5  # consecutive non-finite steps before the run is stopped
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    process: ProcessConfig = field(default_factory=ProcessConfig)

    def __init__(self, max_steps: int = 1000, decay_steps: Optional[int] = None, seed: int = 0,
                 max_bad_steps: int = 5, optim: Optional[OptimConfig] = None,
                 batch: Optional[BatchConfig] = None, log: Optional[LogConfig] = None,
                 checkpoints: Optional[CheckpointConfig] = None,
                 process: Optional[ProcessConfig] = None, **settings: Any) -> None:
        """The groups as given (or their defaults), with `settings`, any group's setting by
        its own name, set in its group."""
        unknown = sorted(set(settings) - set(_GROUP_OF))
        if unknown:
            raise TypeError(f"TrainConfig has no setting {', '.join(map(repr, unknown))}")
        self.max_steps, self.decay_steps, self.seed = max_steps, decay_steps, seed
        self.max_bad_steps = max_bad_steps
        given = {"optim": optim, "batch": batch, "log": log, "checkpoints": checkpoints,
                 "process": process}
        for group, cls in GROUPS.items():
            mine = {k: v for k, v in settings.items() if _GROUP_OF[k] == group}
            base = given[group] if given[group] is not None else cls()
            object.__setattr__(self, group, dataclasses.replace(base, **mine))  # a copy of its own
        for name in ("max_steps", "max_bad_steps"):
            check_int("TrainConfig", name, getattr(self, name), 1)
        if decay_steps is not None:
            check_int("TrainConfig", "decay_steps", decay_steps, 1)
            # Without decay_steps only `train` knows the horizon: the form alone was checked.
            resolve_warmup(self.optim.warmup, decay_steps)
            resolve_warmup(self.batch.seq_len_warmup, decay_steps,
                           name="TrainConfig.seq_len_warmup")

    def __getattr__(self, name: str) -> Any:
        group = _GROUP_OF.get(name)  # only for names that are not the config's own
        if group is None or group not in self.__dict__:
            raise AttributeError(f"TrainConfig has no setting {name!r}")
        return getattr(self.__dict__[group], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _GROUP_OF:  # a group's setting by its own name: set in its group
            setattr(getattr(self, _GROUP_OF[name]), name, value)
        else:
            object.__setattr__(self, name, value)

    def flat(self) -> dict[str, Any]:
        """Every setting by its own name, the groups' included: what checkpoints record."""
        own = {k: getattr(self, k) for k in ("max_steps", "decay_steps", "seed",
                                              "max_bad_steps")}
        return {**own, **{k: v for group in GROUPS for k, v in asdict(getattr(self, group))
                          .items()}}

    def split_batch(self, world_size: int) -> tuple[int, int]:
        """(sequences per rank, per micro-batch): BatchConfig.split_batch."""
        return self.batch.split_batch(world_size)
