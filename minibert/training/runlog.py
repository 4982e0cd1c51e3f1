"""A run's log: `metrics.jsonl` in its folder, one JSON object per line.

`train` appends a row for each logged step (`step`, `loss`, `lr`, `grad_norm`,
`tokens_per_s`, `mfu`, ...) and one for each evaluation (`step` and the scores, no `lr`).
The file is the run's record across all its starts: a resume drops the rows a killed run
wrote after the checkpoint it resumes from, so that each step appears once, and a reader
skips the one row a kill may have cut short.

Non-finite numbers (a skipped step's loss, an overflowed gradient norm) are written as
`null`, so the file is strict JSON that any reader takes.

While a run trains, rank 0 shows its progress (`TrainConfig.progress`): a tqdm bar where
tqdm is installed (`progress_bar`), with each row written above it; without tqdm, each row
is a log line at INFO, which `shown` makes visible where nobody has set logging up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterator, Optional

from ..atomic import atomic_file, reported
from ..atomic import writing

logger = logging.getLogger(__name__)


class RunLog:
    """The run's metrics.jsonl, as one start of it appends rows (rank 0 only).

    A resumed start drops the rows a killed run logged after its checkpoint, `stale_after`:
    when it writes its own first row, or `settle`s at the end of a run that finished. A
    start stopped before either leaves the log as it found it.
    """

    def __init__(self, path: Path, stale_after: Optional[int] = None) -> None:
        self.path, self.stale_after = path, stale_after
        self.ceiling_beaten = False  # whether a row has beaten the MFU ceiling (said once)

    def settle(self) -> None:
        if self.stale_after is not None:
            with writing(self.path):
                drop_rows_after(self.path, self.stale_after)
            self.stale_after = None

    def write(self, row: dict[str, Any], bar: Any = None) -> None:
        """Append `row`, and show it on `bar` (a tqdm progress bar) or in the log."""
        self.settle()
        strict = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                  for k, v in row.items()}
        with writing(self.path), reported(self.path), open(self.path, "a") as f:
            f.write(json.dumps(strict, allow_nan=False) + "\n")
        text = " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in row.items())
        if bar is not None:
            bar.write(text)
        else:
            logger.info(text)

    def has_eval(self, step: int) -> bool:
        """Whether the log holds an evaluation row (one without a training "lr") of `step`."""
        return any(row.get("step") == step and "lr" not in row for row in read_rows(self.path))


def _tqdm() -> Any:
    """tqdm's bar class (`tqdm.auto`: a widget in a notebook with ipywidgets, text on a
    terminal), or None where tqdm, an optional extra, is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def progress_bar(enabled: bool, total: int, initial: int) -> Any:
    """A bar of the run's steps, from `initial` to `total`, or None: not enabled, or no tqdm."""
    bar = _tqdm() if enabled else None
    return bar(total=total, initial=initial, unit="step", dynamic_ncols=True) if bar else None


@contextlib.contextmanager
def shown(enabled: bool) -> Iterator[None]:
    """For the duration of a run whose progress is shown (`enabled`: `progress` on, rank 0)
    and has no bar to draw it (tqdm not installed): where nobody has set logging up, as in
    a fresh notebook (no handler on the "minibert" logger or above it, and its level
    unset), a handler on the "minibert" logger writes its records from INFO up to stderr,
    the log rows among them, and is taken off when the run returns or raises.

    Logging that the caller has set up is theirs: left as it is, it shows what it was set
    to show (`logging.basicConfig(level=logging.INFO)` shows the rows). Python's own
    fallback would show warnings alone, and a library call that trains for minutes in
    silence looks hung."""
    package = logging.getLogger(__name__.partition(".")[0])  # "minibert", above every module's
    if (not enabled or _tqdm() is not None or package.hasHandlers()
            or package.level != logging.NOTSET):
        yield
        return
    handler = logging.StreamHandler()  # sys.stderr, where tqdm and Python's fallback write
    handler.setFormatter(logging.Formatter("%(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(logging.NOTSET)


def read_rows(metrics_file: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl ([] without one), skipping a row cut short by a
    kill. A non-finite number is None."""
    if not metrics_file.is_file():
        return []
    rows = []
    for line in metrics_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def last_training_loss(metrics_file: Path) -> Optional[float]:
    """The loss of the last training row (nan where it was not finite; None without one)."""
    loss = None
    for row in read_rows(metrics_file):
        if "loss" in row:
            loss = float("nan") if row["loss"] is None else float(row["loss"])
    return loss


def drop_rows_after(metrics_file: Path, step: int) -> None:
    """Resuming at `step`: the rows a killed run logged after its checkpoint go, so each
    step appears once. The file is replaced whole (atomic.py): a crash keeps the old one."""
    if not metrics_file.is_file():
        return
    lines = metrics_file.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if ln.strip() and _row_step(ln) <= step]
    if len(kept) == len(lines):
        return
    with atomic_file(metrics_file, "w") as f:
        f.writelines(kept)
    logger.info("dropped %d rows of %s logged after step %d", len(lines) - len(kept),
                metrics_file, step)


def _row_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):  # a row cut short by the kill
        return math.inf
