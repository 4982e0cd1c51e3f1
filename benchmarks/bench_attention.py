"""How do the three attention backends scale with sequence length, in memory and time?

For each T and backend, one training step of attention alone (forward + backward, hidden 256
= 4 heads x 64, batch 1, no padding) runs in a fresh subprocess, so one measurement's
allocations never hide another's. After one warm-up step, memory is the next step's peak above
what was allocated before it: `torch.cuda.max_memory_allocated` on CUDA, the growth of the
process's peak resident size (VmHWM, reset through /proc/self/clear_refs) on CPU. Time is the
median of a few more steps.

    python benchmarks/bench_attention.py                 # T = 512 ... 8192, ~5 min on 2 cores
    python benchmarks/bench_attention.py --lengths 512 1024 --repeats 2
    python benchmarks/bench_attention.py --lengths 4096 --chunk-size auto   # tile measured here
    python benchmarks/bench_attention.py --window 64     # a local layer: keys within +-64

With `--window W` every backend computes a sliding-window (local) layer, as ModernBERT's:
math and sdpa still build the T x T scores and mask them, while chunked skips the tiles
outside the window, so its time and memory should grow as T · W, linearly in T.

Prints a markdown table, writes JSON (and a PNG plot when matplotlib is installed).
Targets: at T=4096 chunked peak memory <= 25% of math's; from T=2048 to 8192 chunked memory
grows <= 5x (math ~16x); chunked time within 2x of math.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from minibert.model.config import BertConfig

BACKENDS = ("math", "sdpa", "chunked")


def measure(backend: str, T: int, mode: str, device: str, dtype: str, chunk: int,
            repeats: int, window: int | None = None) -> dict:
    """One backend at one length, in this process: peak MB (mode "memory") or median seconds."""
    import torch

    from minibert.model.attention import attention
    from minibert.machine.memory import current_memory_mb, peak_memory_mb, reset_peak_memory

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 4, T, 64, device=device, dtype=dt, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(1, 4, T, 64, device=device, dtype=dt)

    def step():
        out = attention(q, k, v, None, backend, chunk_size=chunk, window=window)
        out.backward(grad)
        q.grad = k.grad = v.grad = None
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: torch's one-time allocations (thread pools, workspaces) are not the step's
    if mode == "memory":
        reset_peak_memory(device)
        base = current_memory_mb(device)
        step()
        return {"peak_mb": round(peak_memory_mb(device) - base, 1)}
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"seconds": round(statistics.median(times), 4)}


def run_in_subprocess(backend: str, T: int, chunk: int, args: argparse.Namespace) -> dict:
    """Memory and time, each from a fresh process.

    The memory process fixes glibc's mmap threshold, so every large buffer goes back to the
    OS when freed and the resident size follows the live tensors; that makes the many small
    temporaries slow, so time is measured in a second process with the default allocator.
    """
    row = {"backend": backend, "T": T, "chunk": chunk}
    for mode in ("memory", "time"):
        cmd = [sys.executable, __file__, "--child", backend, str(T), mode,
               "--device", args.device, "--dtype", args.dtype,
               "--chunk-size", str(chunk), "--repeats", str(args.repeats),
               *(["--window", str(args.window)] if args.window else [])]
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536") if mode == "memory" else None
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            row.update(peak_mb=row.get("peak_mb"), seconds=None, error=tail[0])
            return row
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return row


def chunk_for(T: int, args: argparse.Namespace) -> int:
    """The tile at length T: the one given, or ('auto') the fastest measured on this device,
    in a process of its own like every measurement (this one then never holds a GPU context
    of its own, which a GPU in exclusive-process mode would refuse to the measuring ones)."""
    if args.chunk_size != "auto":
        return int(args.chunk_size)
    cmd = [sys.executable, __file__, "--pick", str(T), "--device", args.device, "--dtype",
           args.dtype, "--repeats", str(args.repeats)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # its log lines pass through
    if done.returncode != 0:
        sys.exit(f"picking the tile at T={T} failed (exit {done.returncode})")
    return int(done.stdout.strip().splitlines()[-1])


def pick(T: int, device: str, dtype: str, repeats: int) -> int:
    import torch

    from minibert.machine.autotune import pick_chunk_size

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # it logs every tile's time
    t0 = time.perf_counter()
    tile = pick_chunk_size(4, 64, T, device, getattr(torch, dtype), repeats=repeats)
    print(f"T={T}: picking the tile took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return tile


def table(rows: list[dict], lengths: list[int]) -> str:
    head = "| T | chunk | " + " | ".join(f"{b} MB" for b in BACKENDS) + " | " + \
        " | ".join(f"{b} s" for b in BACKENDS) + " | chunked / math memory |"
    lines = [head, "|" + "---|" * (2 * len(BACKENDS) + 3)]
    by = {(r["backend"], r["T"]): r for r in rows}
    for T in lengths:
        mem = [by[(b, T)]["peak_mb"] for b in BACKENDS]
        sec = [by[(b, T)]["seconds"] for b in BACKENDS]
        ratio = f"{mem[2] / mem[0]:.1%}" if mem[0] and mem[2] is not None else "n/a"
        cells = [str(T), str(by[("chunked", T)]["chunk"])] + \
            [f"{m:.0f}" if m is not None else "failed" for m in mem] + \
            [f"{s:.3f}" if s is not None else "failed" for s in sec] + [ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], lengths: list[int], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'minibert[examples]')")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for b in BACKENDS:
        pts = [(r["T"], r["peak_mb"], r["seconds"]) for r in rows
               if r["backend"] == b and r["peak_mb"] is not None]
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=b)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=b)
    for ax, label in zip(axes, ("peak memory (MB)", "forward + backward (s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    # The tile a user gets without choosing one, so that a bare run measures the default.
    p.add_argument("--chunk-size", default=str(BertConfig.attention_chunk_size),
                   help="the chunked backend's tile (default: BertConfig's), or 'auto': "
                   "minibert.machine.autotune.pick_chunk_size measures the fastest at each length "
                   "on this machine")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--window", type=int, help="a local layer: each query sees the keys within "
                   "this many positions (default: global attention)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    p.add_argument("--child", nargs=3, metavar=("BACKEND", "T", "MODE"), help=argparse.SUPPRESS)
    p.add_argument("--pick", type=int, metavar="T", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.pick:
        print(pick(args.pick, args.device, args.dtype, args.repeats))
        return
    if args.child:
        backend, T, mode = args.child
        print(json.dumps(measure(backend, int(T), mode, args.device, args.dtype,
                                 int(args.chunk_size), args.repeats, args.window)))
        return

    if args.chunk_size != "auto" and not (args.chunk_size.isdigit() and int(args.chunk_size)):
        p.error(f"--chunk-size {args.chunk_size!r} must be a whole number >= 1 or 'auto'")
    rows = []
    for T in args.lengths:
        chunk = chunk_for(T, args)
        for b in BACKENDS:
            rows.append(run_in_subprocess(b, T, chunk, args))
            print(f"T={T:5d} {b:8s} {rows[-1]}", file=sys.stderr)
    reach = f", local window +-{args.window}" if args.window else ""
    print(f"\nattention forward+backward, batch 1, 4 heads x 64, {args.dtype} on {args.device}, "
          f"chunk {args.chunk_size}{reach}\n")
    print(table(rows, args.lengths))
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"attention_window{args.window}" if args.window else "attention"
    (args.out / f"{name}.json").write_text(json.dumps(
        {"device": args.device, "dtype": args.dtype, "chunk_size": args.chunk_size,
         "window": args.window, "rows": rows}, indent=1))
    plot(rows, args.lengths, args.out / f"{name}.png")


if __name__ == "__main__":
    main()
