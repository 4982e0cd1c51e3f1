"""The state of a training run, below the loop: what it was asked to do (`TrainConfig`, its
settings by concern in settings.py), everything that moves (`TrainState`, lingua's model,
which alone builds and reads a checkpoint's dict), and what makes two runs the same run, the
*run identity*: the model's config or shapes, the settings but `RESUME_MAY_CHANGE`, and the
caller's data identity, evaluation data included. A resume that changes it is refused by
name (`check_identity`)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn

from ..model.config import BertConfig
from .distributed import unwrap
from ..machine.environment import rounding_context
from ..interop.hf import minibert_class
from .rng import rank_seed, rng_state, set_rng_state, set_seed
from .settings import TrainConfig  # noqa: F401 (the settings, by concern: settings.py)

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Everything that moves during a run, saved with each checkpoint and restored whole:
    plain counters, and the run's `optimizer` and `scaler`."""

    step: int = 0  # optimizer steps taken (skipped ones included)
    tokens_seen: int = 0  # non-padding tokens over all ranks
    epoch: int = 0  # the data position: the epoch of the next global batch,
    consumed: int = 0  # and the examples of that epoch already used, over all ranks
    skipped: int = 0  # steps not applied: non-finite, or an fp16 overflow
    bad_steps: int = 0  # consecutive non-finite steps; the run stops at max_bad_steps
    train_seconds: float = 0.0  # over every start: in steps alone (no evaluation, saves, logs)
    wall_seconds: float = 0.0  # over every start to its last checkpoint, evaluations included
    micro_batch_size: Optional[int] = None  # recovery.back_off's, kept unless a resume sets one
    precision: Optional[str] = None  # decided at the first start, kept by every resume
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
        """The whole checkpoint of the run at `step`, read by name through `Saved`: weights
        (`model`, `model_class`, `id2label`), the run in motion (`train_state`, `optimizer`,
        `scaler`, `rng`: `rngs`, else this process's), the run identity and `rounding`."""
        raw = unwrap(model)
        names = getattr(raw, "id2label", None)
        return {"model": raw.state_dict(), "model_class": minibert_class(type(raw)).__name__,
                "train_state": self.counters(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rngs if rngs is not None else [rng_state()],
                "id2label": list(names) if names else None,
                "model_config": model_config(raw), "train_config": cfg.flat(),
                "data_identity": data_identity,
                "rounding": rounding_context(next(raw.parameters()).device)}

    def load_state_dict(self, saved: dict[str, Any], model: nn.Module, rank: int = 0,
                        seed: int = 0) -> None:
        """Put back what `state_dict` gave, this rank's generators included; a rank the
        checkpoint has none for is seeded from (seed, rank). Check the identity first."""
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
    """A checkpoint's content (`TrainState.state_dict`) by name: its keys are written and read
    in this module alone. What the checkpoint lacks is None."""

    weights: Optional[dict]  # the model's state_dict
    model_class: Optional[str]  # minibert's class, which export rebuilds
    model_config: Optional[dict]
    id2label: Optional[list]  # a classifier's class names
    train_config: Optional[dict]
    data_identity: Optional[dict]
    train_state: Optional[dict]  # TrainState's counters
    rounding: Optional[dict]  # environment.rounding_context at the save

    @classmethod
    def of(cls, saved: Mapping[str, Any]) -> "Saved":  # weights under "model", the rest by name
        return cls(saved.get("model"), *(saved.get(f.name) for f in fields(cls)[1:]))

    @property
    def step(self) -> int:
        return int(self.train_state["step"])

    @property
    def precision(self) -> str:  # decided at the run's first start, kept by every resume
        return self.train_state["precision"]


# ---- the run identity -------------------------------------------------------------------------

# Settings that change nothing a run computes or logs (eval_batches does: each eval_loss's data).
RESUME_MAY_CHANGE = frozenset({
    "max_steps", "micro_batch_size", "auto_micro_batch", "log_every", "eval_every",
    "eval_at_start", "save_every", "keep_checkpoints", "max_bad_steps", "compile", "progress",
    "peak_flops", "handle_signals", "release_memory"})


def run_identity(model: nn.Module, cfg: "TrainConfig") -> dict[str, Any]:
    """The model (its class and config) and the training settings that decide what a run
    computes (see RESUME_MAY_CHANGE)."""
    raw = unwrap(model)
    # The class as checkpoints name it: minibert's own for a user's subclass (export rebuilds it)
    return {"model_class": minibert_class(type(raw)).__name__,
            "model_config": model_config(raw),
            "train_config": {k: v for k, v in cfg.flat().items() if k not in RESUME_MAY_CHANGE}}


def model_config(model: nn.Module) -> dict[str, Any]:
    """What the run identity records of the model: `asdict` of its dataclass `config`, else each
    tensor's shape under "shapes", so a resume into another is refused naming the tensor."""
    config = getattr(model, "config", None)  # a plain nn.Module has none
    if is_dataclass(config) and not isinstance(config, type):
        return asdict(config)
    return {"shapes": {name: list(t.shape) for name, t in model.state_dict().items()}}


def bert_config(model: nn.Module) -> Optional[BertConfig]:
    """The model's BertConfig where it has one as `config` (its FLOPs, dropout), else None."""
    config = getattr(model, "config", None)
    return config if isinstance(config, BertConfig) else None


class SettingsMismatch(ValueError):
    """A resume whose settings are not its checkpoint's: `diffs` holds (setting as in TrainConfig,
    "model FIELD" for the model's, the checkpoint's value, the value now), for a script's flags."""

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
