"""What a run executes on, and the mismatches that silently cost speed (a CUDA device
without a CUDA build, more threads than CPUs, emulated bf16): `environment_report`,
`environment_warnings`, and `log_environment`, which logs both at the start of a run.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, Optional

import torch

from . import precision as _precision
from .memory import Device, freed_memory_kept, kernel_cache_capacity

logger = logging.getLogger(__name__)


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else what `platform` says."""
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
    """What this run executes on: versions, device, threads, CPUs, `bf16_supported` (autocast
    runs) and `bf16_native` (in hardware; None: a CPU whose flags cannot be read here)."""
    device = torch.device(device)
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
        # the CPUs this process may run on: its affinity mask (which containers restrict)
        "cpu_count": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "freed_memory_kept": freed_memory_kept(),  # see keep_freed_memory
        "kernel_cache_capacity": kernel_cache_capacity(),  # see limit_kernel_cache
    }
    if device.type == "cpu":
        report["device_name"] = cpu_name()
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


# What decides a run's rounding beside its settings: the order of its sums, split across
# threads and chosen by torch's kernels for the machine (docs/runs.md, "The same result").
ROUNDING_FIELDS = ("torch", "device_name", "cpu_capability", "torch_threads")


def rounding_context(device: Device) -> dict[str, Any]:
    """The `ROUNDING_FIELDS` of `environment_report`, which a checkpoint records; a resume
    where they differ says it goes on equivalent, not bit for bit."""
    report = environment_report(device)
    return {k: report[k] if isinstance(report[k], int) else str(report[k])
            for k in ROUNDING_FIELDS}  # plain values: a checkpoint loads them weights-only


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
        warnings.append(f"bf16 matmuls are emulated on {report['device_name']} (no AMX, "
                        f"AVX512-BF16 or Arm BF16 instructions): a bf16 run will be many "
                        f"times slower than fp32; use fp32")
    elif precision == "bf16" and report["device"] == "cpu" and report["bf16_native"] is None:
        warnings.append(f"bf16 was requested, and this system does not say whether "
                        f"{report['device_name']} multiplies bf16 in hardware; where it "
                        f"emulates bf16, a run is many times slower than in fp32")
    return warnings


def log_environment(device: Device, precision: Optional[str] = None) -> dict[str, Any]:
    """Log the environment report and a warning for each mismatch; return the report, with
    the warnings under "warnings", to be stored with the run."""
    report = environment_report(device)
    report["warnings"] = environment_warnings(report, precision)
    logger.info("environment: %s", ", ".join(f"{k}={v}" for k, v in report.items()
                                              if k != "warnings"))
    for message in report["warnings"]:
        logger.warning(message)
    return report
