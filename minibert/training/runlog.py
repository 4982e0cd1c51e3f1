"""A run's log: `metrics.jsonl` in its folder, one strict-JSON object per line (`null` for
a non-finite number): a row per logged step and one per evaluation (no `lr`), across all the
run's starts (docs/runs.md, "What the folder holds"). Rank 0 shows the rows as it trains:
above a tqdm bar where tqdm is installed, else as log lines (`shown`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterator, Optional

from ..atomic import atomic_file, reported, writing

logger = logging.getLogger(__name__)


class RunLog:
    """The run's metrics.jsonl, as one start of it appends rows (rank 0 only). A resumed
    start drops the rows after its checkpoint, `stale_after`, at its first row or `settle`:
    one stopped before either leaves the log as it found it."""

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
    """tqdm's bar class (`tqdm.auto`), or None where tqdm, an optional extra, is missing."""
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
    """While a run shows its progress (`enabled`) without a tqdm bar, and nobody has set
    logging up: a handler writing INFO and up to stderr (Python's fallback would show
    warnings alone, and a run silent for minutes looks hung)."""
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
    """The rows of a run's metrics.jsonl ([] without one), but a row a kill cut short."""
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
    """Resuming at `step`: drop the rows logged after it, so each step appears once."""
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
