"""What a new batch length costs in memory that stays: the resident set after many steps of
fixed, varying and rounded lengths, in bf16 and fp32.

Each row runs in a fresh process: 1,500 steps of a transformer block's feed-forward pair
(256 -> 1024 -> 256, GELU, forward and backward) on a batch of 32 sequences of T
positions, where T is 128 every step ("fixed"), drawn uniformly from 8 ... 128 every step
("every length", what dynamic padding of varied texts gives), or that draw rounded up to a
multiple of 8 or 16. The columns are the resident set after the last step and the mean
time of the last 500 steps (time it on a quiet machine). The rows that set
`ONEDNN_PRIMITIVE_CACHE_CAPACITY` bound oneDNN's cache of compiled kernels, which torch's
CPU bf16 matmuls go through and which keeps one kernel per matmul shape (1,024 by
default): at 0, what remains above "fixed" is the C allocator's heap, fragmented by blocks
of ever new sizes, and every matmul compiles its kernel again (the cost of a miss, which
the "fixed at 128" rows show).

    python benchmarks/bench_shapes.py          # about a minute on 2 cores

The sparse MLM head rounds its rows up to `minibert.machine.kernels.PREDICTION_ROWS` for this reason
(benchmarks/RESULTS.md, "Memory over a long run", which also has what oneDNN's cache cost a
fine-tuning job).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROWS = [  # (label, lengths, precision, extra environment)
    ("fixed at 128", "fixed", "bf16", {}),
    ("every length 8 ... 128", "every", "bf16", {}),
    ("every length, rounded up to 8", "8", "bf16", {}),
    ("every length, rounded up to 16", "16", "bf16", {}),
    ("every length, oneDNN's kernel cache off", "every", "bf16",
     {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}),
    ("every length, oneDNN's kernel cache of 64", "every", "bf16",
     {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}),
    ("every length, oneDNN's kernel cache of 256", "every", "bf16",
     {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}),
    ("fixed at 128, oneDNN's kernel cache off", "fixed", "bf16",
     {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}),
    ("fixed at 128", "fixed", "fp32", {}),
    ("every length 8 ... 128", "every", "fp32", {}),
]


def child(lengths: str, precision: str, steps: int) -> None:
    import random
    import time

    import torch

    def rss_mb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))

    torch.manual_seed(0)
    rng = random.Random(0)
    up, down = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)
    timed_from = max(0, steps - 500)
    for step in range(steps):
        if step == timed_from:
            t0 = time.perf_counter()
        T = 128 if lengths == "fixed" else rng.randint(8, 128)
        if lengths.isdigit():
            T = -(-T // int(lengths)) * int(lengths)
        x = torch.randn(32 * T, 256)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            y = down(torch.nn.functional.gelu(up(x)))
        y.float().sum().backward()
    print(rss_mb(), (time.perf_counter() - t0) / (steps - timed_from) * 1e3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child, args.steps)
        return
    print("| lengths | precision | resident set after the last step (MB) | ms per step |")
    print("|---|---|---|---|")
    for label, lengths, precision, env in ROWS:
        out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child",
                              lengths, precision], env={**os.environ, **env},
                             capture_output=True, text=True, check=True).stdout
        name = label + "".join(f" ({k}={v})" for k, v in env.items())
        rss, ms = out.split()[-2:]
        print(f"| {name} | {precision} | {int(rss):,} | {float(ms):.2f} |", flush=True)


if __name__ == "__main__":
    main()
