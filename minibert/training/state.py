"""The state of a training run, below the loop: what it was asked to do (`TrainConfig`),
everything that moves while it runs (`TrainState`), and what makes two runs the same run
(the *run identity*).

`TrainState` is the one place that knows what a checkpoint holds: its `state_dict()` builds
the whole dict (the weights, the counters, the data position, the micro-batch in use, the
optimizer, the gradient scaler, the random generators and the run identity), and
`load_state_dict()` puts the run back from it, so a resumed run continues exactly where
the checkpoint left it (lingua's `TrainState` is the model). resume.py only orchestrates:
it gathers every rank's generators, writes the dict and finds the checkpoint to resume.

The *run identity* is everything that decides what a run computes: the model config (for a
model of your own without one, the shape of each of its tensors: `model_config`), the
training settings but those in `RESUME_MAY_CHANGE`, and the data's identity given by the
caller. A resume with any of them changed is refused by name (`check_identity`).

The evaluation data belongs to the identity as much as the training data: its examples,
how many of them are scored (`eval_batches`) and how they are scored. A resume that
evaluated on other data would log, under one run, scores that cannot be compared, with
nothing in metrics.jsonl to tell them apart. A model is scored on other data by evaluating
its final/ folder, which leaves the run's log as it was.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
import torch.nn as nn

from ..model.config import BertConfig, check_int
from .distributed import unwrap
from ..machine.environment import rounding_context
from ..interop.hf import minibert_class
from .optim import SCHEDULES, resolve_warmup
from ..machine.precision import PRECISIONS
from .rng import rank_seed, rng_state, set_rng_state, set_seed

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Everything about a run that is not the model. Stored in every checkpoint."""

    batch_size: int = 32  # global: sequences per optimizer step, over all ranks
    micro_batch_size: Optional[int] = None  # per rank and forward pass; None = batch / world
    max_steps: int = 1000  # where this run stops; may change on resume
    decay_steps: Optional[int] = None  # the schedule's horizon; None = max_steps of the start
    # The peak rate: the main job's (examples/pretrain_wikitext.py takes it as it is), at
    # which its Post-LN mini model reaches transformers' quality in its time-to-quality runs;
    # twice it did not pay, sitting on the unigram plateau as Post-LN does at high rates (Liu
    # et al. 2020; benchmarks/RESULTS.md, "Time to quality against transformers"). Fine-tuning
    # sets its own (cli/finetune.py, FINETUNE).
    lr: float = 1e-3
    min_lr: float = 0.0  # the rate at the horizon, and after it
    warmup: Union[int, float] = 0.1  # optimizer steps, or a fraction of decay_steps
    schedule: str = "linear"
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0
    precision: str = "auto"  # see precision.resolve_precision
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
    # Steps (or a fraction of decay_steps) over which batches grow to full length; 0 = off.
    seq_len_warmup: Union[int, float] = 0
    seq_len_start: int = 32
    # The MFU ceiling, FLOP/s; None = this machine's, measured by its first run and recorded
    # (meters.mfu_ceiling).
    peak_flops: Optional[float] = None
    # What train() may do to the process beyond the model (its docstring says each one):
    handle_signals: bool = True  # SIGTERM / SIGINT save a checkpoint and return
    release_memory: bool = True  # hand glibc's free memory back (memory.release_freed_memory)

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_steps", "log_every", "eval_batches", "keep_checkpoints",
                     "max_bad_steps"):
            check_int("TrainConfig", name, getattr(self, name), 1)
        for name in ("eval_every", "save_every"):
            check_int("TrainConfig", name, getattr(self, name), 0)
        for name in ("micro_batch_size", "decay_steps"):
            if getattr(self, name) is not None:
                check_int("TrainConfig", name, getattr(self, name), 1)
        if self.precision not in ("auto",) + PRECISIONS:
            raise ValueError(f"TrainConfig.precision={self.precision!r} is not one of "
                             f"{('auto',) + PRECISIONS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule={self.schedule!r} is not one of "
                             f"{SCHEDULES}")
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
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ValueError(f"TrainConfig.peak_flops={self.peak_flops} must be > 0 (FLOP/s), "
                             f"or None for this machine's recorded ceiling")
        # Without decay_steps the horizon is max_steps at a fresh start but the checkpoint's
        # on a resume, which may stop earlier: a warmup's length is then checked by `train`,
        # once it knows the horizon, and only its form here.
        horizon = self.decay_steps if self.decay_steps is not None else 2**62
        resolve_warmup(self.warmup, horizon)  # raises on a bad one
        resolve_warmup(self.seq_len_warmup, horizon, name="TrainConfig.seq_len_warmup")
        check_int("TrainConfig", "seq_len_start", self.seq_len_start, 1)

    def split_batch(self, world_size: int) -> tuple[int, int]:
        """(sequences per rank, sequences per micro-batch) of one global batch of
        `batch_size` over `world_size` ranks; refused unless it splits into whole ranks and
        whole micro-batches, as exact accumulation needs (engine.micro_step_weight)."""
        per_rank, rest = divmod(self.batch_size, world_size)
        micro = self.micro_batch_size or per_rank
        if rest or per_rank == 0 or per_rank % micro:
            raise ValueError(f"batch_size={self.batch_size} must split into {world_size} "
                             f"process(es) x whole micro-batches of micro_batch_size={micro}")
        return per_rank, micro


@dataclass
class TrainState:
    """Everything that moves during a run, saved with each checkpoint and restored whole.

    The counters are plain fields; `optimizer` and `scaler` are the run's own objects, held
    here so that `state_dict` / `load_state_dict` cover them and the random generators in one
    call.
    """

    step: int = 0  # optimizer steps taken (skipped ones included)
    tokens_seen: int = 0  # non-padding tokens over all ranks
    epoch: int = 0  # the data position: the epoch of the next global batch,
    consumed: int = 0  # and the examples of that epoch already used, over all ranks
    skipped: int = 0  # steps not applied: non-finite, or an fp16 overflow
    bad_steps: int = 0  # consecutive non-finite steps; the run stops at max_bad_steps
    # Seconds spent training, over every start of the run: evaluation, checkpoint saves and
    # logging excluded, so time-to-loss curves compare runs that evaluate at different rates.
    train_seconds: float = 0.0
    # Seconds the run has taken, evaluations and saves included, over every start up to its
    # last checkpoint: a resumed run's wall time adds to it, as its training time does.
    wall_seconds: float = 0.0
    # The micro-batch in use when an out-of-memory error made the run halve it
    # (recovery.back_off); None: TrainConfig.micro_batch_size. A resumed run keeps it, so
    # it does not run out of memory again to find it, unless the resume sets another one.
    micro_batch_size: Optional[int] = None
    # The precision the run computes in, decided at its first start: "auto" reads what the
    # device declares (precision.auto_precision), and a resume on another machine, or under
    # another torch, must not switch the run to another precision.
    precision: Optional[str] = None
    optimizer: Optional[torch.optim.Optimizer] = field(default=None, repr=False, compare=False)
    scaler: Optional[torch.amp.GradScaler] = field(default=None, repr=False, compare=False)

    def due(self, every: int) -> bool:
        """Whether a thing done every `every` steps (0: never) is due at this step."""
        return bool(every) and self.step % every == 0

    def counters(self) -> dict[str, Any]:
        """The plain fields: what `TrainState(**counters)` rebuilds."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("optimizer", "scaler")}

    def state_dict(self, model: nn.Module, cfg: "TrainConfig", data_identity: dict,
                   rngs: Optional[list] = None) -> dict[str, Any]:
        """The whole checkpoint of the run at `step`, under the keys every reader of a
        checkpoint uses: the weights (`model`, with `model_class`, and a classifier's
        `id2label`, which export writes into its config), the run in motion (`train_state`:
        the counters; `optimizer`, `scaler`, and `rng`: `rngs`, every rank's generators,
        which `resume.save_run` gathers, else this process's alone) and the run identity
        (`model_config`, `train_config`, `data_identity`), and what decides its rounding
        (`rounding`: the torch version, the device, the thread count), which a resume
        compares. They are read by name through `Saved`."""
        raw = unwrap(model)
        names = getattr(raw, "id2label", None)
        # The class export rebuilds: minibert's own, for a user's subclass of it.
        return {"model": raw.state_dict(), "model_class": minibert_class(type(raw)).__name__,
                "train_state": self.counters(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rngs if rngs is not None else [rng_state()],
                "id2label": list(names) if names else None,
                "model_config": model_config(raw), "train_config": asdict(cfg),
                "data_identity": data_identity,
                "rounding": rounding_context(next(raw.parameters()).device)}

    def load_state_dict(self, saved: dict[str, Any], model: nn.Module, rank: int = 0,
                        seed: int = 0) -> None:
        """Put back what `state_dict` gave: the weights into `model`, then the counters, the
        optimizer, the scaler and this rank's generators (`rng` as saved: one state per
        rank). A rank the checkpoint has no generator state for gets a stream of its own
        from (seed, rank). The run identity is `check_identity`'s to compare, beforehand."""
        unwrap(model).load_state_dict(saved["model"])
        known = set(self.counters())
        for name, value in saved["train_state"].items():
            if name in known:
                setattr(self, name, value)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scaler.load_state_dict(saved["scaler"])
        rngs = saved["rng"]
        if rank < len(rngs):
            set_rng_state(rngs[rank])
        else:  # more ranks than the checkpoint had: a stream of its own, not a copy of rank 0's
            logger.warning("rank %d has no saved RNG state (the run had %d ranks); seeding it "
                           "from (seed, rank)", rank, len(rngs))
            set_seed(rank_seed(seed, rank))


# ---- reading a checkpoint --------------------------------------------------------------------

@dataclass(frozen=True)
class Saved:
    """A checkpoint's content (`TrainState.state_dict`) by name, for the modules that resume,
    export or check it: its keys are written and read in this module alone. What the
    checkpoint lacks (one not saved by minibert's loop) is None."""

    weights: Optional[dict]  # the model's state_dict
    model_class: Optional[str]  # minibert's class, which export rebuilds
    model_config: Optional[dict]
    id2label: Optional[list]  # a classifier's class names
    train_config: Optional[dict]
    data_identity: Optional[dict]
    train_state: Optional[dict]  # TrainState's counters
    rounding: Optional[dict]  # environment.rounding_context at the save

    @classmethod
    def of(cls, saved: Mapping[str, Any]) -> "Saved":
        return cls(weights=saved.get("model"), model_class=saved.get("model_class"),
                   model_config=saved.get("model_config"), id2label=saved.get("id2label"),
                   train_config=saved.get("train_config"),
                   data_identity=saved.get("data_identity"),
                   train_state=saved.get("train_state"), rounding=saved.get("rounding"))

    @property
    def step(self) -> int:
        return int(self.train_state["step"])

    @property
    def precision(self) -> str:  # decided at the run's first start, kept by every resume
        return self.train_state["precision"]


# ---- the run identity -------------------------------------------------------------------------

# Fields that may change between a run and its resumption without changing what it computes,
# or what its log reports. (Not `eval_batches`: the share of the evaluation set scored is
# what each eval_loss means; see the module docstring.)
RESUME_MAY_CHANGE = frozenset({
    "max_steps", "micro_batch_size", "auto_micro_batch", "log_every", "eval_every",
    "save_every", "keep_checkpoints", "max_bad_steps", "compile", "progress", "peak_flops",
    "handle_signals", "release_memory"})


def run_identity(model: nn.Module, cfg: "TrainConfig") -> dict[str, Any]:
    """The model (its class and config) and the training settings that decide what a run
    computes (see RESUME_MAY_CHANGE)."""
    raw = unwrap(model)
    # The class as checkpoints name it: minibert's own for a user's subclass (export
    # rebuilds it).
    return {"model_class": minibert_class(type(raw)).__name__,
            "model_config": model_config(raw),
            "train_config": {k: v for k, v in asdict(cfg).items() if k not in RESUME_MAY_CHANGE}}


def model_config(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint records of the model's shape, for the run identity: its `config`
    (`asdict`: minibert's BertConfig, or a dataclass of your own), or, for a model of your
    own without one, the shape of each tensor it saves, under "shapes": a resume into a
    model of another shape is then refused naming the tensor ("model shapes
    head.weight"), before torch's size mismatch deep in load_state_dict."""
    config = getattr(model, "config", None)  # a plain nn.Module has none
    if is_dataclass(config) and not isinstance(config, type):
        return asdict(config)
    return {"shapes": {name: list(t.shape) for name, t in model.state_dict().items()}}


def bert_config(model: nn.Module) -> Optional[BertConfig]:
    """The model's BertConfig where it has one (minibert's models, and yours that expose
    one as `config`), from which the engine reads what the model computes (its FLOPs, its
    dropout); None for a model of your own, of which it knows only the parameters."""
    config = getattr(model, "config", None)
    return config if isinstance(config, BertConfig) else None


class SettingsMismatch(ValueError):
    """A resume whose settings are not its checkpoint's: `diffs` holds (setting, the
    checkpoint's value, the value now) for each, the setting named as in TrainConfig (a
    model config's field as "model FIELD"), so a script can say them as its flags."""

    def __init__(self, path: Path, diffs: list[tuple[str, str, str]]):
        self.path, self.diffs = path, diffs
        super().__init__(self.said())

    def said(self, names: Mapping[str, str] = {}) -> str:
        """The message, each setting said as `names` calls it (field -> flag)."""
        shown = "; ".join(dict.fromkeys(  # two fields one flag sets (--dropout) say it once
            f"{names.get(name, name)}: checkpoint {old}, now {new}"
            for name, old, new in self.diffs))
        return (f"cannot resume from {self.path}: the settings differ from the checkpoint's "
                f"({shown}); use the original settings or a new --out directory")


def check_identity(saved: dict, now: dict, path: Path) -> None:
    """Refuse to resume when any setting of the run identity differs, naming each one."""
    diffs = []
    # The same config under another head (an MLM run resumed as a classifier) would fail
    # deep in load_state_dict, or load an encoder under a head it was not trained with.
    if saved["model_class"] != now["model_class"]:
        diffs.append(("model class", repr(saved["model_class"]), repr(now["model_class"])))
    for section, label in (("model_config", "model "), ("train_config", ""),
                           ("data_identity", "")):
        old = saved[section] if section != "train_config" else \
            {k: v for k, v in saved[section].items() if k not in RESUME_MAY_CHANGE}
        new = now[section]
        for key in sorted(set(old) | set(new), key=str):
            before, after = old.get(key, _UNSET), new.get(key, _UNSET)
            if before == after:
                continue
            if isinstance(before, dict) and isinstance(after, dict):
                # e.g. a corpus's text keys, one per split: name the split that changed,
                # rather than two dicts of hashes
                diffs += [(f"{label}{key} {k}", _show(before.get(k, _UNSET)),
                           _show(after.get(k, _UNSET)))
                          for k in sorted(set(before) | set(after), key=str)
                          if before.get(k, _UNSET) != after.get(k, _UNSET)]
            else:
                diffs.append((f"{label}{key}", _show(before), _show(after)))
    if diffs:
        raise SettingsMismatch(path, diffs)


_UNSET = object()


def _show(value: Any) -> str:
    return "not set" if value is _UNSET else repr(value)
