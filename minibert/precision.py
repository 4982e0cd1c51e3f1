"""The precision a run computes in, and what each precision costs on this device.

* `resolve_precision`, `autocast_context`: the run's precision, checked against the device,
  and the one autocast context built from it (fp32: none; bf16 / fp16: `torch.autocast`).
* `cpu_bf16_native`, `cpu_bf16_speedup`: whether this CPU multiplies bf16 matrices in
  hardware, and how much faster than fp32 it does so. bf16 is the fast precision on GPUs
  and on CPUs with AMX or AVX512-BF16; elsewhere torch emulates it, tens of times slower.

`cpu_bf16_speedup` probes with `meters.measure_peak_flops`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from typing import Optional, Union

import torch

from .meters import measure_peak_flops

logger = logging.getLogger(__name__)

Device = Union[str, torch.device]
PRECISIONS = ("fp32", "bf16", "fp16")
# The dtype each precision's matmuls run in: autocast's dtype, and the MFU ceiling's.
MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# "auto" takes bf16 on a CPU only if its matmuls run this much faster than fp32's: autocast
# adds a cast of every weight and of activations where fp32 and bf16 ops meet (a small share
# of a BERT-base step: benchmarks/RESULTS.md, "Process settings: the allocator and the
# threads"), and a 0.1 s probe is noisy on a busy machine.
_BF16_AUTO_MIN_SPEEDUP = 1.5


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision a run uses; refuse what the device lacks.

    "auto" -> bf16 on CUDA devices with native bf16; on a CPU, bf16 where its matmuls are
    native (`cpu_bf16_native`) and measured at least 1.5x faster than fp32's
    (`cpu_bf16_speedup`, once per process); fp32 elsewhere. bf16 asked for by name on a CPU
    that emulates it is allowed (it is correct, only slow); `log_environment` warns.
    """
    if precision == "auto":
        if device.type == "cuda":
            cuda_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
            return "bf16" if cuda_bf16 else "fp32"
        if device.type == "cpu" and cpu_bf16_native():
            speedup = cpu_bf16_speedup()
            choice = "bf16" if speedup >= _BF16_AUTO_MIN_SPEEDUP else "fp32"
            logger.info("precision auto: %s (bf16 matmuls %.1fx as fast as fp32 on this CPU)",
                        choice, speedup)
            return choice
        return "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("--precision fp16 needs a CUDA device (fp16 autocast with loss "
                         "scaling); on CPU use bf16, which needs no scaler")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--precision bf16: {torch.cuda.get_device_name(device)} does not "
                         f"support bfloat16; use fp16")
    return precision


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The one precision context of a run: autocast for bf16/fp16, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=MATMUL_DTYPES[precision])


def _read_cpuinfo() -> Optional[str]:
    """The text of /proc/cpuinfo (Linux), or None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return None


# The instruction sets that multiply bf16 matrices, as /proc/cpuinfo names them: Intel's AMX
# tiles (Sapphire Rapids on), AVX512-BF16 dot products (Cooper Lake, Sapphire Rapids, AMD Zen
# 4 on), and Arm's FEAT_BF16 (BFMMLA; Graviton 3, Neoverse V1 on), listed as "bf16".
_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})


@functools.lru_cache(maxsize=None)
def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (cached per process).

    Why it matters: elsewhere torch still runs bf16 (autocast works on every CPU), but it
    emulates each bf16 multiply-add with fp32 arithmetic plus conversions, tens of times
    slower than fp32, where a CPU that has them runs bf16 several times faster than fp32
    (both measured in benchmarks/RESULTS.md, whose opening section names the machines).

    Read from the CPU's instruction-set flags in /proc/cpuinfo (`_BF16_CPU_FLAGS`); where
    there are none to read (macOS, Windows), a short timed probe decides: bf16 counts as
    native when its matmuls run at least half as fast as fp32's, which emulation never does.
    """
    cpuinfo = _read_cpuinfo()
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo or "", re.MULTILINE)
    if match:
        return not _BF16_CPU_FLAGS.isdisjoint(match.group(1).split())
    return cpu_bf16_speedup() >= 0.5


@functools.lru_cache(maxsize=None)
def cpu_bf16_speedup() -> float:
    """bf16 matmul FLOP/s over fp32 matmul FLOP/s on this CPU, measured once per process.

    Two `measure_peak_flops` runs of 0.1 s each, on one thread: on a shared machine a small
    multi-threaded product waits for its slowest thread to be scheduled, and that wait
    would be timed instead of the arithmetic; the ratio per core is what decides. Above 1,
    bf16 multiplies faster; far below 1 where it is emulated (benchmarks/RESULTS.md, its
    opening section on the machines).
    """
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bf16 = measure_peak_flops(cpu, torch.bfloat16, budget_s=0.1)
        fp32 = measure_peak_flops(cpu, torch.float32, budget_s=0.1)
    finally:
        torch.set_num_threads(threads)
    return bf16 / fp32


def _device(device: Device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)
