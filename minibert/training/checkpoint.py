"""Checkpoint directories that are either complete and verified, or not there at all.

    root/step_00001000/state.pt    torch.save of one dict: state_dicts, RNG states, configs...
    root/step_00001000/meta.json   {"format", "format_version", "step", "files": {bytes, sha256}}

Written into a hidden sibling and renamed into place, verified by size and SHA-256, read with
`torch.load(weights_only=True)`, which never runs code (docs/runs.md, "Checkpoints that are
whole or absent"). `state` is any dict of tensors and plain values: no models here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

import torch

from ..atomic import PathLike, error_gist, is_temporary, replace_folder, write_failure
from ..interop.hf import META_FILE, STATE_FILE

logger = logging.getLogger(__name__)

FORMAT = "minibert-checkpoint"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, damaged or not a minibert checkpoint."""


def step_dir(root: PathLike, step: int) -> Path:
    """Where the checkpoint of `step` lives: `root/step_{step:08d}`."""
    return Path(root) / f"step_{step:08d}"


def save_checkpoint(root: PathLike, step: int, state: dict[str, Any],
                    keep: Optional[int] = 3) -> Path:
    """Atomically write `state` as the checkpoint of `step` under `root`; return its path. Then
    only the newest `keep` remain, this one included (None: all); the same step's is replaced."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step={step!r} must be an integer >= 0")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep={keep!r} must be an integer >= 1, or None to keep all")
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    _check_loadable(state, "state")

    root = Path(root)  # made by replace_folder, which says why where it cannot be
    final = step_dir(root, step)
    meta: dict[str, Any] = {}

    def write(folder: Path) -> None:
        state_path = folder / STATE_FILE
        with open(state_path, "wb") as f:
            torch.save(state, f)
        meta.update({"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
                     "torch": torch.__version__,
                     "files": {STATE_FILE: {"bytes": state_path.stat().st_size,
                                            "sha256": sha256_file(state_path)}}})
        (folder / META_FILE).write_text(json.dumps(meta, indent=2))

    # torch.save's failed write ("unexpected pos") names neither space nor limit: say what
    # was written, what stopped it and what is left.
    before = [p.name for p in _step_dirs(root)]
    left = (f"; the checkpoints saved before it are as they were (the newest: {before[0]})"
            if before else "; no checkpoint was saved before it")
    replace_folder(final, write, owns=lambda name: True, failed=lambda e: write_failure(
        e, f"checkpoint {final}", root, "resume" if before else "save again",
        freeing="some space (or keep fewer checkpoints)") + left)
    logger.info("saved checkpoint %s (%.1f MiB)", final, meta["files"][STATE_FILE]["bytes"] / 2**20)

    _remove_leftovers(root)
    if keep is not None:
        for path in [p for p in _step_dirs(root) if p != final][keep - 1:]:
            shutil.rmtree(path, ignore_errors=True)
            logger.info("removed old checkpoint %s (keeping the newest %d)", path, keep)
    return final


def verify_checkpoint(path: PathLike) -> dict[str, Any]:
    """Check that `path` is a complete, undamaged checkpoint (reading its state file once
    for the SHA-256); return its meta.json dict, or raise CheckpointError naming the path."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {META_FILE}: it is incomplete or not "
                              f"a minibert checkpoint; use an older checkpoint")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path}: {META_FILE} is unreadable ({e}); "
                              f"the checkpoint is damaged, use an older one") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: {META_FILE} does not describe a minibert "
                              f"checkpoint (format {FORMAT!r} expected)")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {version!r}; this minibert "
                              f"reads versions up to {FORMAT_VERSION}, upgrade minibert")
    try:
        expected = meta["files"][STATE_FILE]
        size, digest = int(expected["bytes"]), str(expected["sha256"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"checkpoint {path}: {META_FILE} lacks the size and sha256 of "
                              f"{STATE_FILE}; the checkpoint is damaged") from None
    state_path = path / STATE_FILE
    if not state_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {STATE_FILE}; it is damaged")
    actual_size = state_path.stat().st_size
    if actual_size != size:
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} has {actual_size} bytes, "
                              f"{META_FILE} says {size}; the file is truncated or damaged")
    if sha256_file(state_path) != digest:
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} does not match the sha256 in "
                              f"{META_FILE}; its contents are damaged")
    return meta


def load_checkpoint(path: PathLike, map_location: Any = "cpu", mmap: bool = False,
                    verify: bool = True) -> dict[str, Any]:
    """Verify the checkpoint directory `path` (unless `verify` is False: the caller just did), then
    load its state dict (`mmap`: tensors stay in the file until used). Raises CheckpointError."""
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    try:
        state = torch.load(path / STATE_FILE, map_location=map_location, weights_only=True,
                           mmap=mmap)
    except Exception as e:  # unpickling or zip errors: only the gist goes into the message
        # torch.load's "Unsupported global": objects other than tensors and plain values
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} could not be loaded with "
                              f"weights_only=True, which reads only tensors and plain python "
                              f"values ({error_gist(e)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} holds a "
                              f"{type(state).__name__}, not a dict")
    return state


def latest_checkpoint(root: PathLike) -> Optional[Path]:
    """The newest checkpoint under `root` that verifies, or None; a damaged newer one is
    skipped with a warning, and interrupted saves' temporary folders are ignored."""
    for path in _step_dirs(Path(root)):
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            logger.warning("skipping damaged checkpoint: %s", e)
            continue
        return path
    return None


def checkpoint_written(root: PathLike) -> bool:
    """Whether a save under `root` ever completed: a final-named checkpoint, intact or not."""
    return bool(_step_dirs(Path(root)))


def _step_dirs(root: Path) -> list[Path]:
    """Checkpoint directories under `root` by their final name, newest step first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def _remove_leftovers(root: Path) -> None:
    """Delete hidden folders of interrupted saves (temporary ones are replace_folder's)."""
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(".") and not is_temporary(p.name):
            shutil.rmtree(p, ignore_errors=True)
            logger.info("removed %s, left over from an interrupted save", p)


def sha256_file(path: PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# What torch.load(weights_only=True) rebuilds, by exact type (not numpy scalars, IntEnums or
# namedtuples): checked at save time, so an unloadable checkpoint is an error now, by name.
_LEAF_TYPES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)
_SEQUENCE_TYPES = (list, tuple, set, frozenset, torch.Size)
_DICT_TYPES = (dict, OrderedDict)


def _check_loadable(value: Any, where: str) -> None:
    if isinstance(value, torch.Tensor) or type(value) in _LEAF_TYPES:
        return
    if type(value) in _DICT_TYPES:
        for k, v in value.items():
            _check_loadable(k, f"a key of {where}")
            _check_loadable(v, f"{where}[{k!r}]")
    elif type(value) in _SEQUENCE_TYPES:
        for i, v in enumerate(value):
            _check_loadable(v, f"{where}[{i}]")
    else:
        hint = (" (store dataclasses.asdict(config))" if hasattr(value, "__dataclass_fields__")
                else " (convert it with .tolist() or torch.as_tensor)"
                if type(value).__module__ == "numpy" else "")
        raise TypeError(f"{where} is a {type(value).__name__}, which torch.load(weights_only="
                        f"True) cannot read back; checkpoints hold tensors, plain python "
                        f"values, lists, tuples and dicts{hint}")
