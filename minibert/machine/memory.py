"""Memory: how much a run uses (`reset_peak_memory`, `peak_memory_mb`, `current_memory_mb`),
and how the C allocator holds it on a CPU: `keep_freed_memory`, `release_freed_memory` and
`limit_kernel_cache` (oneDNN's kernels), explained in docs/machine-room.md, §3 and §4.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, Optional, Union

import torch

logger = logging.getLogger(__name__)

Device = Union[str, torch.device]


def _accelerator(device: torch.device) -> Optional[Any]:
    """torch.cuda, torch.xpu, ... for an accelerator with memory statistics, else None."""
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    return module if hasattr(module, "max_memory_allocated") else None


def reset_peak_memory(device: Device) -> None:
    """Start a new peak-memory window (see `peak_memory_mb`)."""
    device = torch.device(device)
    acc = _accelerator(device)
    if acc is not None:
        acc.reset_peak_memory_stats(device)
        return
    # Writing "5" to clear_refs resets the kernel's peak resident set size (VmHWM) to the
    # current one (Linux >= 4.0). Elsewhere, or if refused, the peak covers the whole run.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        logger.debug("cannot reset the peak RSS here; peak_memory_mb reports the process peak")


def peak_memory_mb(device: Device) -> float:
    """Peak memory in MiB since the last `reset_peak_memory(device)`: of tensors on an
    accelerator; on a CPU, the process's peak resident set (VmHWM, else `ru_maxrss`)."""
    device = torch.device(device)
    acc = _accelerator(device)
    if acc is not None:
        return acc.max_memory_allocated(device) / 2**20
    peak = _proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    import resource  # POSIX only, hence not at the top

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB else


def current_memory_mb(device: Device) -> float:
    """Memory in use now, in MiB: tensors on an accelerator, the resident set on CPU. The
    extra memory of a piece of work is `peak_memory_mb` after it minus this before it."""
    device = torch.device(device)
    acc = _accelerator(device)
    if acc is not None:
        return acc.memory_allocated(device) / 2**20
    current = _proc_status_mb("VmRSS")
    return 0.0 if current is None else current  # unknown here: peaks are then absolute


def _proc_status_mb(field: str) -> Optional[float]:
    """A memory field of /proc/self/status (Linux) in MiB, or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


# mallopt(3) parameter numbers, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_freed_memory_kept = False  # see keep_freed_memory, freed_memory_kept


def keep_freed_memory() -> bool:
    """Make the C allocator reuse freed memory instead of handing it back to the kernel:
    glibc's `mallopt` with mmap and trimming off, so the next step reuses pages already mapped
    (docs/machine-room.md, §3). Process-wide and for good, so the engine never calls it. Returns
    True when in force (now or before); False, changing nothing, where malloc is not glibc's."""
    global _freed_memory_kept
    if _freed_memory_kept:
        return True
    import ctypes

    mallopt = _glibc_malloc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success. Trimming stops only for free space below the threshold,
    # so it is set to the largest value an int holds (2 GiB).
    if mallopt(_M_MMAP_MAX, 0) != 1:
        return False
    if mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        mallopt(_M_MMAP_MAX, 65536)  # mmap back on, with glibc's default count
        return False
    _freed_memory_kept = True
    logger.info("CPU allocator: freed memory is kept for reuse (glibc mallopt)")
    return True


def release_freed_memory() -> bool:
    """Hand the C allocator's free memory back to the kernel now (glibc `malloc_trim(0)`), as
    the engine does at each change of length and every `engine.RELEASE_EVERY` steps: kept blocks
    stop fitting when a step's sizes change. Returns False, doing nothing, where not glibc."""
    malloc_trim = _glibc_malloc("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


def _glibc_malloc(name: str) -> Optional[Any]:
    """glibc's function `name` when glibc's malloc serves this process, else None."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc" or "malloc" in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)  # the symbols of the running process
    except (OSError, AttributeError, TypeError):
        return None


def freed_memory_kept() -> bool:
    """Whether `keep_freed_memory` is in force in this process (for the environment report)."""
    return _freed_memory_kept


# The variable that bounds oneDNN's kernel ("primitive") cache, and the older name it reads.
KERNEL_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
_KERNEL_CACHE_ENVS = (KERNEL_CACHE_ENV, "DNNL_PRIMITIVE_CACHE_CAPACITY")
KERNEL_CACHE_CAPACITY = 128


def limit_kernel_cache(capacity: int = KERNEL_CACHE_CAPACITY) -> bool:
    """Bound oneDNN's cache of compiled matmul kernels at `capacity` (least recently used out;
    docs/machine-room.md, §4), before the first CPU bf16 matmul, when oneDNN reads it. A value
    already in the environment is left alone. Returns True when this call set the bound."""
    if capacity < 0:
        raise ValueError(f"limit_kernel_cache: capacity={capacity} must be >= 0 kernels")
    if any(name in os.environ for name in _KERNEL_CACHE_ENVS):
        return False
    os.environ[KERNEL_CACHE_ENV] = str(capacity)
    return True


def kernel_cache_capacity() -> Optional[int]:
    """The bound on oneDNN's kernel cache this process's environment sets (None: its default,
    1,024), for the environment report."""
    value = next((os.environ[v] for v in _KERNEL_CACHE_ENVS if v in os.environ), None)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
