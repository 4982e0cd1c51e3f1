"""Seeds and random-number-generator state: reproducible runs and exact resume. `set_seed`
seeds every generator a run draws from; `rng_state` / `set_rng_state` capture and restore them
all, as tensors and plain values (a checkpoint loads them weights-only).
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python's `random`, numpy's global generator and torch on every device.
    `deterministic=True` also asks for deterministic kernels, cuDNN without autotuning and
    a fixed cuBLAS workspace (docs/runs.md, "The same result"); it costs speed on a GPU."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} must be an integer in [0, 2**32) (numpy's range)")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA device's default generator
    if deterministic:
        # Before the first cuBLAS call; setdefault keeps the user's (":16:8" uses less memory).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def rng_state() -> dict[str, Any]:
    """Every RNG state a training step draws from: python, numpy (its array as a tensor, for
    `torch.load(weights_only=True)`), torch CPU and CUDA."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),  # (version, tuple of 625 ints, gauss_next)
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "torch": torch.get_rng_state(),
        # one ByteTensor per device
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state()` returned, so the next draws repeat exactly."""
    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise ValueError(f"RNG state is missing {sorted(missing)}; pass a dict from rng_state()")
    version, internal, gauss_next = state["python"]
    # A checkpoint may hand back lists where tuples went in; random.setstate wants tuples.
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    count = torch.cuda.device_count()  # 0 where CUDA is not available
    if cuda and count != len(cuda):
        logger.warning("the RNG state has %d CUDA device state(s), this machine has %d; "
                       "restoring the first %d", len(cuda), count, min(count, len(cuda)))
    for i, s in enumerate(cuda[:count]):
        torch.cuda.set_rng_state(s.cpu(), i)


def rank_seed(seed: int, rank: int) -> int:
    """A seed for `rank`'s own random stream, a function of (seed, rank) (SeedSequence)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
