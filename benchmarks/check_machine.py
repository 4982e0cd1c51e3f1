"""What this machine does that the library's process settings and precision choice rely on.

Each check times or counts something on the machine it runs on, so its outcome depends on
the CPU, the C library and how busy the cores are. That is why these live here and not in
tests/, whose tests must give the same answer on any machine. Each prints what it measured
and one line `PASS`, `FAIL` or `SKIP` with the reason; the exit status is 1 if any failed.

* `bf16`: `minibert.machine.precision.cpu_bf16_native()` reads the CPU's flags (amx_bf16,
  avx512_bf16, Arm's bf16) to decide whether bf16 matmuls are native, and "auto" precision
  follows it. Checked against the clock: an emulating CPU runs bf16 matmuls far slower than
  fp32 (65x on an AVX2 EPYC), a native one at least as fast; a bf16 / fp32 ratio of matmul
  FLOP/s above 0.25 counts as native, the margin absorbing noise. One thread: a small
  multi-threaded product would time the wait for its slowest thread.
* `page-faults`: `minibert.machine.memory.keep_freed_memory()` turns off glibc's mmap threshold and
  trimming so that a large block freed and allocated again is reused already mapped. A 64
  MiB tensor is allocated and freed 12 times in a fresh process (the setting is process-wide
  and permanent), with and without the setting, counting the minor page faults of each
  cycle. By default each cycle is a fresh mmap whose pages all fault in again (16,384 of 4
  KiB; 32 where transparent huge pages are always on), so every cycle must fault at least 16
  times; kept, the block is reused once the heap has settled (up to four cycles), so each of
  the last six cycles must fault fewer than 100 times. glibc only.
* `peak`: `minibert.machine.meters.measure_peak_flops` on small products (up to 256 x 256) in fp32
  and bf16 gives a rate a real CPU can have: between 0.1 GFLOP/s and 100 TFLOP/s.

    python benchmarks/check_machine.py                 # a few seconds
    python benchmarks/check_machine.py --checks bf16
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys

CHECKS = ("bf16", "page-faults", "peak")
NATIVE_RATIO = 0.25  # bf16 / fp32 matmul FLOP/s above which bf16 counts as native

# Allocates and frees a 64 MiB tensor 12 times, printing whether freed memory is kept and
# then the minor page faults of each cycle.
_FAULTS = """
import resource, sys, torch
from minibert.machine.environment import environment_report
from minibert.machine.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
assert environment_report("cpu")["freed_memory_kept"] == kept
print(kept)
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 * 2**20)  # 64 MiB, written in full
    del x
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def check_bf16(budget_s: float) -> tuple[str, str]:
    import torch

    from minibert.machine.meters import measure_peak_flops
    from minibert.machine.precision import cpu_bf16_flags, cpu_bf16_native

    native = cpu_bf16_native()
    if native is None:
        return "SKIP", "this system shows no CPU flags to check against"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bf16 = measure_peak_flops("cpu", torch.bfloat16, budget_s=budget_s)
        fp32 = measure_peak_flops("cpu", torch.float32, budget_s=budget_s)
    finally:
        torch.set_num_threads(threads)
    ratio = bf16 / fp32
    print(f"bf16: flags {', '.join(cpu_bf16_flags()) or 'none'} -> native={native}; one thread: "
          f"bf16 {bf16 / 1e9:.1f} GFLOP/s, fp32 {fp32 / 1e9:.1f} GFLOP/s, ratio {ratio:.3f}")
    measured_native = ratio > NATIVE_RATIO
    said = (f"the flags say {'native' if native else 'emulated'}, the ratio {ratio:.3f} is "
            f"{'above' if measured_native else 'below'} {NATIVE_RATIO}")
    return ("PASS" if measured_native == native else "FAIL"), said


def _faults(mode: str) -> tuple[bool, list[int]]:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", [int(n) for n in out[1:]]


def check_page_faults() -> tuple[str, str]:
    if platform.libc_ver()[0] != "glibc":
        return "SKIP", "keep_freed_memory is a glibc setting"
    kept, faults_kept = _faults("keep")
    default, faults_default = _faults("default")
    print(f"page-faults: minor faults per 64 MiB cycle, default: {faults_default}")
    print(f"page-faults: minor faults per 64 MiB cycle, freed memory kept: {faults_kept}")
    if not kept or default:
        return "FAIL", f"keep_freed_memory() returned {kept}, the default process {default}"
    problems = []
    if min(faults_default) < 16:
        problems.append(f"a default cycle faulted only {min(faults_default)} times (< 16)")
    if max(faults_kept[-6:]) >= 100:
        problems.append(f"a settled kept cycle faulted {max(faults_kept[-6:])} times (>= 100)")
    if problems:
        return "FAIL", "; ".join(problems)
    return "PASS", (f"every default cycle faults >= 16 times (min {min(faults_default)}), the "
                    f"last six kept cycles < 100 (max {max(faults_kept[-6:])})")


def check_peak() -> tuple[str, str]:
    import torch

    from minibert.machine.meters import measure_peak_flops

    rates = {str(dtype).removeprefix("torch."): measure_peak_flops("cpu", dtype, max_n=256)
             for dtype in (torch.float32, torch.bfloat16)}
    print("peak: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in rates.items()))
    outside = [k for k, v in rates.items() if not 1e8 < v < 1e14]
    if outside:
        return "FAIL", f"{', '.join(outside)} outside 0.1 GFLOP/s ... 100 TFLOP/s"
    return "PASS", "every rate lies between 0.1 GFLOP/s and 100 TFLOP/s"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    p.add_argument("--budget-s", type=float, default=0.1,
                   help="seconds each bf16 / fp32 rate is timed for (default 0.1)")
    args = p.parse_args()
    failed = False
    for name in args.checks:
        if name == "bf16":
            outcome, why = check_bf16(args.budget_s)
        elif name == "page-faults":
            outcome, why = check_page_faults()
        else:
            outcome, why = check_peak()
        print(f"{outcome} {name}: {why}", flush=True)
        failed |= outcome == "FAIL"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
