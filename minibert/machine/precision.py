"""The precision a run computes in (`resolve_precision`, `autocast_context`, `run_precision`),
and what "auto" picks (`auto_precision`): from what the device declares (`cpu_bf16_native`),
never from a timing, which would measure the machine's other work too (docs/machine-room.md §1).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from typing import Optional

import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")
# The dtype each precision's matmuls run in: autocast's dtype, and the MFU ceiling's.
MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision a run uses ("auto": `auto_precision`); refuse what the device lacks.
    bf16 on a CPU that emulates it is allowed (only slow); `log_environment` warns."""
    if precision == "auto":
        return auto_precision(device)[0]
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("--precision fp16 needs a CUDA device (fp16 autocast with loss "
                         "scaling); on CPU use bf16, which needs no scaler")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--precision bf16: {torch.cuda.get_device_name(device)} does not "
                         f"support bfloat16; use fp16")
    return precision


def auto_precision(device: torch.device) -> tuple[str, str]:
    """What "auto" picks on `device`, and why: (precision, reason), a phrase for the log. bf16
    where the device declares native bf16 (a CPU's `cpu_bf16_flags`: emulated, bf16 is tens of
    times slower than fp32), else fp32, always correct, also where no flags can be read."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", f"{name} computes bf16 natively"
        return "fp32", f"{name} has no native bf16"
    if device.type != "cpu":
        return "fp32", f"no bf16 check for {device.type} devices; fp32 always works"
    flags = cpu_bf16_flags()
    if flags is None:
        return "fp32", ("this system shows no CPU flags (/proc/cpuinfo) to tell native bf16 "
                        "from emulated; ask for bf16 by name if this CPU has it")
    if flags:
        return "bf16", f"this CPU reports {', '.join(flags)}: native bf16 matmuls"
    return "fp32", (f"this CPU reports none of {', '.join(sorted(_BF16_CPU_FLAGS))}: bf16 "
                    f"matmuls would be emulated")


def run_precision(kept: str, asked: str, decided: str, device: torch.device,
                   say: bool = True) -> str:
    """The run's precision: `kept`, from its first start, whatever "auto" decides today
    (`decided`); said when "auto" (`asked`) chose it, refused where this device lacks it."""
    if say and asked == "auto":
        reason = auto_precision(device)[1]
        if kept == decided:
            logger.info("precision auto: %s (%s)", kept, reason)
        else:
            logger.info("precision auto: %s, the run's since its start, kept (today's choice "
                        "would be %s: %s)", kept, decided, reason)
    return decided if kept == decided else resolve_precision(kept, device)


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


# The bf16 matrix instructions as /proc/cpuinfo names them: Intel's AMX, AVX512-BF16 (Intel,
# AMD Zen 4 on), Arm's FEAT_BF16 ("bf16").
_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})


@functools.lru_cache(maxsize=None)
def cpu_bf16_flags() -> Optional[tuple[str, ...]]:
    """The bf16 matrix instructions this CPU declares in /proc/cpuinfo (sorted; empty: none), or
    None where there are no flags to read (macOS, Windows). Read once per process."""
    cpuinfo = _read_cpuinfo()
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo or "", re.MULTILINE)
    if match is None:
        return None
    return tuple(sorted(_BF16_CPU_FLAGS.intersection(match.group(1).split())))


def cpu_bf16_native() -> Optional[bool]:
    """Whether this CPU multiplies bf16 matrices in hardware (`cpu_bf16_flags`, never timed);
    None where it does not say. Elsewhere torch emulates bf16, tens of times slower."""
    flags = cpu_bf16_flags()
    return None if flags is None else bool(flags)
