"""Everything about the process a run lives in: seeds, RNG state, memory, FLOPs, environment.

* `set_seed`, `rng_state`, `set_rng_state`: reproducible runs and exact resume. The RNG state
  is made of tensors and plain python values only, so it can be stored in a checkpoint that
  is loaded with `torch.load(weights_only=True)`.
* `reset_peak_memory`, `peak_memory_mb`: the peak memory of a logging window, on any device.
* `keep_freed_memory`: stop the C allocator from returning memory to the kernel, which
  saves a CPU training step its page faults.
* `mfu`: model FLOPs utilisation, from `model.flops_per_token` and the ceiling that
  `precision.measure_peak_flops` measures.
* `StopFlag`: SIGTERM / SIGINT noted, so the training loop can finish its step and save.
* `environment_report`, `log_environment`: what the run is running on, with warnings for
  the mismatches that silently cost speed.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import re
import sys
from typing import Any, Optional, Union

import numpy as np
import torch

from . import precision as _precision

logger = logging.getLogger(__name__)

Device = Union[str, torch.device]


# ---- seeds and RNG state ------------------------------------------------------------------

def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python's `random`, numpy's global generator and torch on every device.

    `deterministic=True` also makes torch choose deterministic kernels (and raise on an
    operation that has none), turns off cuDNN's benchmark autotuning (which may pick a
    different algorithm on each run), and sets `CUBLAS_WORKSPACE_CONFIG`, without which
    cuBLAS matmuls are not reproducible on CUDA >= 10.2. It costs speed; `False` leaves
    those global switches as they are.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} must be an integer in [0, 2**32) (numpy's range)")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA device's default generator
    if deterministic:
        # Must be set before the first cuBLAS call to take effect; setdefault keeps a value
        # the user chose (":16:8" uses less memory).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def rng_state() -> dict[str, Any]:
    """Every RNG state a training step draws from: python, numpy, torch CPU and CUDA.

    numpy's state is converted from its array to a tensor, so the whole dict survives
    `torch.save` then `torch.load(weights_only=True)`.
    """
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),  # (version, tuple of 625 ints, gauss_next)
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()  # one ByteTensor per device
    return state


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
    if cuda:
        if not torch.cuda.is_available():
            logger.warning("the RNG state has %d CUDA device state(s) but CUDA is not "
                           "available; CUDA random draws will not repeat", len(cuda))
            return
        count = torch.cuda.device_count()
        if count != len(cuda):
            logger.warning("the RNG state has %d CUDA device state(s), this machine has %d; "
                           "restoring the first %d", len(cuda), count, min(count, len(cuda)))
        for i, s in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(s.cpu(), i)


# ---- peak memory --------------------------------------------------------------------------

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
_freed_memory_kept = False


def keep_freed_memory() -> bool:
    """Make the C allocator reuse freed memory instead of handing it back to the kernel.

    Why: torch's CPU allocator has no cache of its own, so every tensor is one `malloc` and
    one `free`. glibc serves each block above its mmap threshold (128 KiB, rising with use to
    at most 32 MiB) with a fresh `mmap` and returns it with `munmap` when freed, and it trims
    free space off the top of its heap; the kernel must then map and zero every page again
    on first touch. A training step allocates the same large buffers every time, so it pays
    those page faults every step, tens of thousands of them for BERT-base (counted, with the
    speed-up without them, by `benchmarks/bench_process.py`; numbers in benchmarks/RESULTS.md,
    "Process settings"). With mmap off (`M_MMAP_MAX = 0`) and trimming off
    (`M_TRIM_THRESHOLD`), freed blocks stay in malloc's heap and the next step reuses them,
    already mapped.

    It pays when a step has blocks above 32 MiB, such as the gradient of a 30,522 x 768
    embedding (94 MB) or the sparse head's logits over a 30k vocabulary; a step whose blocks
    all stay below gains little (the bench_process.py rows for a vocabulary of 8,192). The
    cost: the resident set no longer shrinks after a peak, and fragmentation makes that peak
    higher. The setting is process-wide and cannot be undone, so the engine never makes it;
    call this once, at the start of a CPU training script (the example scripts'
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
    sequence-length warmup, whose batches change length about a dozen times, doubled the
    main job's peak resident set, and the varying number of masked tokens alone took it
    from 1.2 to 2.6 GB over 300 steps (benchmarks/RESULTS.md, "Sequence-length warmup").
    The engine calls this at each change of length and every `engine.RELEASE_EVERY` steps;
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


# ---- MFU ------------------------------------------------------------------------

def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the fraction of `peak_flops` that training turns into model
    FLOPs (`tokens_per_s * flops_per_token / peak_flops`, in [0, 1] for a sound peak)."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r} must be > 0")
    return tokens_per_s * flops_per_token / peak_flops


# ---- environment --------------------------------------------------------------------------

class StepMeter:
    """Tokens, seconds and model FLOPs of the steps since the last log row: throughput, MFU
    and peak memory. Only the steps' own time counts: an evaluation or a checkpoint save
    between two rows does not lower the throughput of the next."""

    def __init__(self) -> None:
        self.tokens, self.seconds, self.flops = 0, 0.0, 0.0

    def add(self, tokens: int, seconds: float, flops: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.flops += flops

    def flops_per_s(self) -> float:
        """The model FLOP/s of the steps since the last row."""
        return self.flops / max(self.seconds, 1e-9)

    def take(self, peak_flops: float, device: torch.device) -> dict[str, float]:
        """The window's numbers, then a new window. Tokens/s and the ceiling count every rank."""
        tps = self.tokens / max(self.seconds, 1e-9)
        row = {"tokens_per_s": round(tps, 1),
               "mfu": round(mfu(tps, self.flops / max(self.tokens, 1), peak_flops), 4),
               "peak_mem_mb": round(peak_memory_mb(device), 1)}
        self.__init__()
        reset_peak_memory(device)
        return row


def _cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which containers restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            match = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
        if match:
            return match.group(1).strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def environment_report(device: Device) -> dict[str, Any]:
    """What this run executes on: versions, device, bf16 support, threads, CPUs.

    `bf16_supported`: bf16 autocast runs on the device (always on a CPU). `bf16_native`: its
    bf16 matmuls run in hardware, not emulated, so bf16 can be faster than fp32.
    """
    device = _device(device)
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,  # None for a CPU-only build of torch
        "python": sys.version.split()[0],
        "device": str(device),
        "device_name": None,
        "device_available": True,
        "bf16_supported": None,
        "bf16_native": None,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": _cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "freed_memory_kept": _freed_memory_kept,  # see keep_freed_memory
    }
    if device.type == "cpu":
        report["device_name"] = _cpu_name()
        report["bf16_supported"] = True  # always runs on a CPU, emulated where not native
        report["bf16_native"] = _precision.cpu_bf16_native()
    elif device.type == "cuda":
        report["device_available"] = torch.cuda.is_available()
        if report["device_available"]:
            report["device_name"] = torch.cuda.get_device_name(device)
            try:  # emulated bf16 (pre-Ampere GPUs) is far too slow to count as support
                report["bf16_supported"] = torch.cuda.is_bf16_supported(including_emulation=False)
            except TypeError:  # older torch without the argument
                report["bf16_supported"] = torch.cuda.is_bf16_supported()
            report["bf16_native"] = report["bf16_supported"]
    else:
        module = getattr(torch, device.type, None)
        report["device_available"] = bool(module and module.is_available())
    return report


def environment_warnings(report: dict[str, Any], precision: Optional[str] = None) -> list[str]:
    """The mismatches in an `environment_report`, one sentence each (empty when all is well)."""
    if precision is not None and precision not in _precision.PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {_precision.PRECISIONS}")
    warnings = []
    if report["device"].startswith("cuda") and report["torch_cuda"] is None:
        warnings.append(f"device {report['device']} was requested but torch "
                        f"{report['torch']} is built without CUDA; install a CUDA build")
    elif not report["device_available"]:
        warnings.append(f"device {report['device']} was requested but is not available")
    if report["torch_threads"] > report["cpu_count"]:
        warnings.append(f"torch uses {report['torch_threads']} threads on "
                        f"{report['cpu_count']} CPUs; oversubscription slows every op, "
                        f"set torch.set_num_threads({report['cpu_count']}) or OMP_NUM_THREADS")
    if precision == "bf16" and report["bf16_supported"] is False:
        warnings.append(f"bf16 was requested but {report['device_name']} does not support "
                        f"it; use fp16 or fp32")
    elif precision == "bf16" and report["device"] == "cpu" and report["bf16_native"] is False:
        speedup = report.get("bf16_matmul_speedup")  # measured by log_environment
        cost = ("a bf16 run will be far slower than fp32" if speedup is None else
                f"a bf16 matmul runs {1 / speedup:.0f}x slower than fp32 here")
        if speedup is None or speedup < 1:
            warnings.append(f"bf16 matmuls are emulated on {report['device_name']} (no AMX "
                            f"or AVX512-BF16 instructions): {cost}; use fp32")
    return warnings


def log_environment(device: Device, precision: Optional[str] = None) -> dict[str, Any]:
    """Log the environment report and a warning for each mismatch; return the report.

    The returned dict has the warnings under "warnings", ready to be stored with the run.
    """
    report = environment_report(device)
    if precision == "bf16" and report["bf16_native"] is False and report["device"] == "cpu":
        # how much slower, for the warning
        report["bf16_matmul_speedup"] = _precision.cpu_bf16_speedup()
    report["warnings"] = environment_warnings(report, precision)
    logger.info("environment: %s", ", ".join(f"{k}={v}" for k, v in report.items()
                                              if k != "warnings"))
    for message in report["warnings"]:
        logger.warning(message)
    return report


# ---- signals ------------------------------------------------------------------------------

class StopFlag:
    """Set by SIGTERM / SIGINT; the loop finishes its step, saves and returns."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopFlag":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
