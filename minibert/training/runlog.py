"""A run's log: `metrics.jsonl` in its folder, one strict-JSON object per line (`null` for
a non-finite number): a row per logged step and one per evaluation (no `lr`), across all the
run's starts (docs/runs.md, "What the folder holds"). Rank 0 shows the rows as it trains:
above a tqdm bar where one draws in place (a terminal, a notebook), else as log lines, one
a row, that a file holds and grep finds (`shown`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
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


def _bar_class(enabled: bool) -> Any:
    """tqdm's bar class (`tqdm.auto`) where a bar is `enabled` and draws in place: on a
    terminal, or as a notebook's widget. Else None, and the rows are log lines: written
    into a file, each frame of a text bar follows the last after a carriage return, and a
    whole run becomes one line in which rows and notices are lost."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional extra
        return None
    widget = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)  # auto's pick in Jupyter
    isatty = getattr(sys.stderr, "isatty", None)  # tqdm draws on stderr; None under pythonw
    return tqdm if widget or (isatty is not None and isatty()) else None


def progress_bar(enabled: bool, total: int, initial: int) -> Any:
    """A bar of the run's steps, from `initial` to `total`, or None (`_bar_class` says when)."""
    bar = _bar_class(enabled)
    return bar(total=total, initial=initial, unit="step", dynamic_ncols=True) if bar else None


@contextlib.contextmanager
def shown(progress: bool, main: bool = True) -> Iterator[None]:
    """How a run shows itself while it trains, on rank 0 (`main`): its rows and notices as
    log lines, and a bar where `progress` asks for one and `_bar_class` draws one. Where
    nobody has set logging up, a handler writes INFO and up to stderr for the call (Python's
    fallback would show warnings alone, and a run silent for minutes looks hung); logging
    set up is left as it is. Beside a bar, the lines go above it, each on a line of its own,
    never into its frame."""
    if not main:
        yield
        return
    bar = _bar_class(progress)
    with _logged(), (_above(bar) if bar is not None else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def _above(bar: Any) -> Iterator[None]:
    """Console handlers of the root and "minibert" loggers write through `bar.write`, which
    clears the bar, writes the line and draws the bar again (tqdm's logging_redirect_tqdm,
    for the loggers that have such a handler: it would add one to those without)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    def console(handler: logging.Handler) -> bool:
        return (isinstance(handler, logging.StreamHandler)
                and handler.stream in (sys.stdout, sys.stderr))

    loggers = [logger for logger in (logging.getLogger(), _package())
               if any(console(h) for h in logger.handlers)]
    with logging_redirect_tqdm(loggers, tqdm_class=bar):
        yield


@contextlib.contextmanager
def _logged() -> Iterator[None]:
    """A handler writing INFO and up to stderr on the "minibert" logger, where nobody has
    set logging up, taken off after."""
    package = _package()
    if package.hasHandlers() or package.level != logging.NOTSET:
        yield
        return
    handler = logging.StreamHandler()  # sys.stderr, where Python's fallback writes
    handler.setFormatter(logging.Formatter("%(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(logging.NOTSET)


def _package() -> logging.Logger:
    return logging.getLogger(__name__.partition(".")[0])  # "minibert", above every module's


def spoken_seconds(seconds: float) -> str:
    """A duration as a log line says it: `40 s`, `14 min`, `2.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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
