"""The precision a run computes in, and what this device declares it can do.

* `resolve_precision`, `autocast_context`: the run's precision, checked against the device,
  and the one autocast context built from it (fp32: none; bf16 / fp16: `torch.autocast`).
* `auto_precision`: what "auto" picks on a device, and the reason, in words.
* `keep_precision`: a resumed run computes in the precision of its first start.
* `cpu_bf16_native`: whether this CPU declares bf16 matrix instructions. bf16 is the fast
  precision on GPUs and on CPUs with AMX or AVX512-BF16; elsewhere torch emulates it, tens
  of times slower than fp32.

"auto" is decided from what the device declares, never from a timing: a probe timed at the
start of a run measures whatever else the machine is doing too, and flipped the choice
between two starts of one command, which then ended with other weights.
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
    """The precision a run uses; refuse what the device lacks.

    "auto" -> `auto_precision`: bf16 where the device declares native bf16 (a CUDA device
    that has it, a CPU whose flags name bf16 matrix instructions), fp32 elsewhere. The same
    device gives the same answer however busy it is. bf16 asked for by name on a CPU that
    emulates it is allowed (it is correct, only slow); `log_environment` warns.
    """
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
    """What "auto" picks on `device`, and why: (precision, reason), the reason a phrase such
    as "this CPU reports amx_bf16: native bf16 matmuls" for the run's log.

    Only what the device declares decides. A CPU's instruction-set flags (`cpu_bf16_flags`)
    name the bf16 matrix instructions it has; with one, bf16 matmuls run several times
    faster than fp32's, without, torch emulates them tens of times slower
    (benchmarks/RESULTS.md, its opening section on the machines), so there is nothing in
    between for a timing to settle. Where no flags can be read, fp32: it is always correct,
    and bf16 stays one `precision="bf16"` away.
    """
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


def keep_precision(kept: str, asked: str, decided: str, device: torch.device,
                   say: bool = True) -> str:
    """The precision a run computes in: `kept`, the one decided at its first start, which a
    resume keeps whatever "auto" decides today (`decided`, on another machine or under
    another torch). Said in one line when "auto" (`asked`) chose it; refused where today's
    device cannot compute in it (bf16 on a GPU without)."""
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


# The instruction sets that multiply bf16 matrices, as /proc/cpuinfo names them: Intel's AMX
# tiles (Sapphire Rapids on), AVX512-BF16 dot products (Cooper Lake, Sapphire Rapids, AMD Zen
# 4 on), and Arm's FEAT_BF16 (BFMMLA; Graviton 3, Neoverse V1 on), listed as "bf16".
_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})


@functools.lru_cache(maxsize=None)
def cpu_bf16_flags() -> Optional[tuple[str, ...]]:
    """The bf16 matrix instructions this CPU declares, as /proc/cpuinfo names them (sorted;
    empty where it has none), or None where there are no flags to read (macOS, Windows).
    Read once per process: a CPU's flags do not change while it runs."""
    cpuinfo = _read_cpuinfo()
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo or "", re.MULTILINE)
    if match is None:
        return None
    return tuple(sorted(_BF16_CPU_FLAGS.intersection(match.group(1).split())))


def cpu_bf16_native() -> Optional[bool]:
    """Whether this CPU multiplies bf16 matrices in hardware; None where it does not say.

    Why it matters: elsewhere torch still runs bf16 (autocast works on every CPU), but it
    emulates each bf16 multiply-add with fp32 arithmetic plus conversions, tens of times
    slower than fp32, where a CPU that has them runs bf16 several times faster than fp32
    (both measured in benchmarks/RESULTS.md, whose opening section names the machines).

    Read from the CPU's instruction-set flags (`cpu_bf16_flags`), never timed: a timing
    depends on the load of the machine, the flags do not.
    """
    flags = cpu_bf16_flags()
    return None if flags is None else bool(flags)
