"""Memory: how much a run uses, and how the C allocator holds it on a CPU.

* `reset_peak_memory`, `peak_memory_mb`, `current_memory_mb`: the peak and current memory of
  a window of work, on any device (tensors on an accelerator, the resident set on a CPU).
* `keep_freed_memory`, `release_freed_memory`: glibc's allocator, which backs every CPU
  tensor, told to keep freed memory for reuse (no page faults on the next step), or to hand
  what it keeps back to the kernel now (a flat resident set).
* `limit_kernel_cache`: a bound on oneDNN's cache of compiled matmul kernels, one per
  matmul shape, which torch's CPU bf16 matmuls fill and never empty.
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


def _device(device: Device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def _accelerator(device: torch.device) -> Optional[Any]:
    """torch.cuda, torch.xpu, ... for an accelerator with memory statistics, else None."""
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    return module if hasattr(module, "max_memory_allocated") else None


def reset_peak_memory(device: Device) -> None:
    """Start a new peak-memory window (see `peak_memory_mb`)."""
    device = _device(device)
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
    """Peak memory in MiB since the last `reset_peak_memory(device)`.

    On CUDA (and other accelerators with memory statistics) this is the peak of memory
    allocated to tensors on `device`. On CPU it is the peak resident set size of the whole
    process (VmHWM on Linux; `ru_maxrss`, which cannot be reset, where /proc is missing):
    it includes the python interpreter and libraries, not only tensors.
    """
    device = _device(device)
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
    """Memory in use now, in MiB: tensors on an accelerator, the resident set on CPU.

    With `reset_peak_memory` and `peak_memory_mb` it gives the extra memory one piece of work
    needs: reset, note `current_memory_mb`, run it, subtract from `peak_memory_mb`.
    """
    device = _device(device)
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
    """Make the C allocator reuse freed memory instead of handing it back to the kernel.

    Why: torch's CPU allocator has no cache of its own, so every tensor is one `malloc` and
    one `free`. glibc serves each block above its mmap threshold (128 KiB, rising with use to
    at most 32 MiB) with a fresh `mmap` and returns it with `munmap` when freed, and it trims
    free space off the top of its heap; the kernel must then map and zero every page again
    on first touch. A training step allocates the same large buffers every time, so it pays
    those page faults every step, tens of thousands of them for BERT-base (counted, with the
    speed-up without them, by `benchmarks/bench_process.py`; numbers in benchmarks/RESULTS.md,
    "Process settings: the allocator and the threads"). With mmap off (`M_MMAP_MAX = 0`) and
    trimming off (`M_TRIM_THRESHOLD`), freed blocks stay in malloc's heap and the next step
    reuses them, already mapped.

    It pays when a step has blocks above 32 MiB, such as the gradient of a 30,522 x 768
    embedding (94 MB) or the sparse head's logits over a 30k vocabulary; a step whose blocks
    all stay below gains little (the bench_process.py rows for a vocabulary of 8,192). The
    cost: the resident set no longer shrinks after a peak. It does not make the set climb
    over a long run: what did was the sparse MLM head's blocks taking a new size every
    step, with or without this setting, and their sizes now repeat (`kernels.PREDICTION_ROWS`;
    `benchmarks/bench_soak.py` measures both ways, in "Memory over a long run").
    The setting is process-wide and cannot be undone, so the engine never makes it; call
    this once, at the start of a CPU training script (the example scripts'
    `--keep-freed-memory`). Accelerator memory is not affected.

    Returns True when the setting is in force (now or from an earlier call). Returns False,
    changing nothing, where the C library is not glibc (macOS, Windows, musl) or another
    allocator is preloaded (LD_PRELOAD of tcmalloc, jemalloc, ...: its own `mallopt`, if
    any, does something else).
    """
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
    """Hand the C allocator's free memory back to the kernel now (glibc `malloc_trim(0)`).

    Why: glibc keeps freed blocks for reuse (always with `keep_freed_memory`, and below its
    rising thresholds without it). When the sizes a step asks for change, the kept blocks
    often no longer fit, so the heap grows beside them and the resident set climbs: a
    sequence-length warmup, whose batches change length about a dozen times, raised the
    main job's peak resident set far above a run without one, and the varying number of
    masked tokens alone kept it climbing after the warmup (benchmarks/RESULTS.md,
    "Sequence-length warmup, and the learning-rate warmup's length").
    The engine calls this at each change of length and every `engine.RELEASE_EVERY` steps
    (unless `TrainConfig.release_memory` is off);
    the blocks still in use are then faulted in once more and reused. Returns False, doing
    nothing, where the C library is not glibc.
    """
    malloc_trim = _glibc_malloc("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


def _glibc_malloc(name: str) -> Optional[Any]:
    """glibc's function `name` when glibc's malloc serves this process, else None (another
    C library, or an allocator preloaded with LD_PRELOAD, whose functions differ)."""
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


# oneDNN's cache of compiled kernels (its "primitive cache"), see limit_kernel_cache; the
# variable that bounds it, and the older name oneDNN still reads.
KERNEL_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
_KERNEL_CACHE_ENVS = (KERNEL_CACHE_ENV, "DNNL_PRIMITIVE_CACHE_CAPACITY")
KERNEL_CACHE_CAPACITY = 128


def limit_kernel_cache(capacity: int = KERNEL_CACHE_CAPACITY) -> bool:
    """Bound oneDNN's cache of compiled matmul kernels at `capacity` kernels (least recently
    used first out). Call it before the process's first bf16 matmul on a CPU.

    Why: torch runs a CPU's bf16 matmuls through oneDNN, which compiles a kernel for each
    matmul shape (sizes, layouts, dtypes) and keeps up to 1,024 of them, each holding its
    code and buffers. A step at one sequence length needs about twenty (one per distinct
    shape, forward and backward; BERT's layers share theirs), so every new length a step
    runs at, from dynamic padding or a sequence-length warmup, adds about twenty kernels that
    stay: in a fine-tuning job, whose batches take nearly every length, a third of its
    resident set. A cache that is off, though, compiles every kernel again at every step.
    `KERNEL_CACHE_CAPACITY` holds every kernel of a step at a few lengths, so a run that
    repeats its shapes compiles each once, and one that does not keeps few (measured by
    `benchmarks/bench_soak.py` and `bench_shapes.py`; benchmarks/RESULTS.md, "A bound on
    oneDNN's kernel cache"). fp32 matmuls do not go through oneDNN on a CPU.

    oneDNN reads the bound from the environment (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`) once,
    when it builds the cache at its first matmul, so this sets that variable: a call after
    that first matmul changes nothing. A value already in the environment is the user's and
    is left alone. The example scripts call this as they start (`cli.Script.start`).
    Returns True when this call set the bound.
    """
    if capacity < 0:
        raise ValueError(f"limit_kernel_cache: capacity={capacity} must be >= 0 kernels")
    if any(name in os.environ for name in _KERNEL_CACHE_ENVS):
        return False
    os.environ[KERNEL_CACHE_ENV] = str(capacity)
    return True


def kernel_cache_capacity() -> Optional[int]:
    """The bound on oneDNN's kernel cache that this process's environment sets (None: oneDNN's
    own default of 1,024), for the environment report."""
    value = next((os.environ[v] for v in _KERNEL_CACHE_ENVS if v in os.environ), None)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
