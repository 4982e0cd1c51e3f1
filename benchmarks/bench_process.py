"""Settings of the process a CPU run lives in: the C allocator and the threads.

Neither is part of the model, yet on a CPU each can move a training step by tens of percent,
so each is measured here on the same steps:

* the allocator: glibc's malloc as it comes, `minibert.machine.memory.keep_freed_memory()` (the
  example scripts' `--keep-freed-memory`), and jemalloc / tcmalloc loaded with LD_PRELOAD, when
  they are installed (Debian: `apt install libjemalloc2 libtcmalloc-minimal4`);
* the threads: torch's default (one per core), one thread, and threads pinned to cores
  (`OMP_PROC_BIND=close OMP_PLACES=cores`).

Workloads, one training step each (forward with 15% of tokens labelled unless said,
backward, fused AdamW):
* minibert BERT-base, bf16 autocast, 8 x 128, `math` attention, dropout 0.1 (the preset's,
  as in a transformers checkpoint), vocabulary 30,522;
* transformers' BERT-base, the same but with its own (sdpa) attention, when installed;
* minibert mini, fp32, 32 x 128, vocabulary 30,522;
* minibert mini, fp32, 32 x 128, vocabulary 8,192, dropout 0.1, 15% masked: the default
  pretraining job's model before its masking rate rose, whose largest blocks (about 20 MB)
  stay below glibc's 32 MiB mmap ceiling;
* the same with 30% masked and no dropout: the default pretraining job's step now, whose
  sparse head's logits (about 40 MB) no longer stay below it;
* transformers' mini, fp32, 32 x 128, vocabulary 8,192, 15% masked, dropout 0.1: the recipe
  the main job is raced against in bench_time_to_loss.py.

Allocator and OpenMP settings are fixed when a process starts, so every (workload, setting)
pair runs in a fresh process; the pairs are run in rounds, so that slow spells of a shared
machine fall on all settings alike. Reported per pair: median seconds per step over all
rounds, minor page faults per step and the process's peak resident memory.

    python benchmarks/bench_process.py                 # about 8 minutes on 2 cores
    python benchmarks/bench_process.py --rounds 1 --workloads mini-fp32

The bf16 workloads are skipped, with a note, on a CPU that emulates bf16 matmuls (no AMX or
AVX512-BF16; `minibert.machine.precision.cpu_bf16_native`), unless `--emulated-bf16` is passed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_vs_transformers import make_batch  # the same labelled batch as that comparison

LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
PRELOADS = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}

# name: (keep_freed_memory, torch threads or None for the default, extra environment)
SETTINGS = {
    "glibc default": (False, None, {}),
    "keep_freed_memory": (True, None, {}),
    "keep_freed_memory, 1 thread": (True, 1, {}),
    "keep_freed_memory, threads pinned": (True, None, {"OMP_PROC_BIND": "close",
                                                       "OMP_PLACES": "cores"}),
}
# name: (library, preset, batch of 128-token sequences, precision, vocabulary, masked share,
#        dropout)
WORKLOADS = {
    "minibert-base-bf16": ("minibert", "base", 8, "bf16", 30522, 0.15, 0.1),
    "transformers-base-bf16": ("transformers", "base", 8, "bf16", 30522, 0.15, 0.1),
    "mini-fp32": ("minibert", "mini", 32, "fp32", 30522, 0.15, 0.1),
    "mini-v8192-fp32": ("minibert", "mini", 32, "fp32", 8192, 0.15, 0.1),
    # The main job's own step (30% masked, no dropout), and transformers' step in the recipe
    # the main job is raced against in bench_time_to_loss.py (15%, dropout 0.1).
    "mini-v8192-m30-fp32": ("minibert", "mini", 32, "fp32", 8192, 0.3, 0.0),
    "transformers-mini-v8192-fp32": ("transformers", "mini", 32, "fp32", 8192, 0.15, 0.1),
}


def kept_workloads(workloads: list[str], emulated_bf16: bool) -> list[str]:
    """The workloads to run: bf16 ones are left out on a CPU that emulates bf16, unless
    asked for (a base step would take minutes)."""
    import minibert.machine.precision

    bf16 = [w for w in workloads if WORKLOADS[w][3] == "bf16"]
    if bf16 and not minibert.machine.precision.cpu_bf16_native() and not emulated_bf16:
        print(f"skipped {', '.join(bf16)}: this CPU emulates bf16 matmuls (no AMX or "
              f"AVX512-BF16), far slower than fp32; --emulated-bf16 runs them anyway",
              file=sys.stderr)
        return [w for w in workloads if w not in bf16]
    return list(workloads)


def find_library(name: str) -> str | None:
    for folder in LIBDIRS:
        path = Path(folder) / name
        if path.exists():
            return str(path)
    return None


def settings() -> dict:
    found = dict(SETTINGS)
    for name, lib in PRELOADS.items():
        path = find_library(lib)
        if path:
            found[f"{name} (LD_PRELOAD)"] = (False, None, {"LD_PRELOAD": path})
    return found


# ---- the child: one workload under one setting -----------------------------------------------

def build(workload: str):
    import torch

    import minibert

    library, preset, batch, precision, vocab, mask_share, dropout = WORKLOADS[workload]
    torch.manual_seed(0)
    config = minibert.BertConfig.preset(preset, vocab_size=vocab,
                                        attention="math" if precision == "bf16" else "sdpa",
                                        hidden_dropout=dropout, attention_dropout=dropout)
    if library == "transformers":
        import transformers

        model = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size,
            num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
            intermediate_size=config.intermediate_size, hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout, attn_implementation="sdpa"))
    else:
        model = minibert.fast(minibert.BertForMaskedLM(config))
    model.train()
    return model, make_batch(batch, 128, config.vocab_size, "cpu", mask_share)


def child(workload: str, keep: bool, threads: int | None, steps: int, warmup: int) -> dict:
    import resource
    import time

    import torch

    from minibert.machine.precision import autocast_context
    from minibert.machine.memory import keep_freed_memory, peak_memory_mb

    if keep:
        assert keep_freed_memory(), "keep_freed_memory() needs glibc"
    if threads:
        torch.set_num_threads(threads)
    model, batch = build(workload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    precision = WORKLOADS[workload][3]
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        with autocast_context(precision, torch.device("cpu")):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    return {"times": times[warmup:], "faults": faults, "peak_mb": peak_memory_mb("cpu"),
            "tokens": batch["input_ids"].numel(), "threads": torch.get_num_threads()}


# ---- the parent ------------------------------------------------------------------------------

def run_child(workload: str, setting: tuple, args) -> dict:
    keep, threads, extra_env = setting
    env = {**os.environ, **extra_env}
    cmd = [sys.executable, __file__, "--child", workload, str(int(keep)), str(threads or 0),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{workload} under {setting} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--emulated-bf16", action="store_true",
                   help="run the bf16 workloads on a CPU that emulates bf16 (very slow)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 1 or args.rounds < 1:
        p.error("--steps and --rounds must be at least 1")
    if args.child:
        workload, keep, threads = args.child
        print(json.dumps(child(workload, keep == "1", int(threads) or None, args.steps,
                               args.warmup)))
        return

    workloads = kept_workloads(args.workloads, args.emulated_bf16)
    theirs = [w for w in workloads if WORKLOADS[w][0] == "transformers"]
    if theirs:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print(f"transformers is not installed: skipping {', '.join(theirs)}")
            workloads = [w for w in workloads if w not in theirs]
    table = settings()
    results: dict = {(w, s): [] for w in workloads for s in table}
    for r in range(args.rounds):
        for w in workloads:
            for s, setting in table.items():
                results[w, s].append(run_child(w, setting, args))
                print(f"round {r + 1}/{args.rounds}: {w}, {s}: "
                      f"{statistics.median(results[w, s][-1]['times']):.3f} s/step",
                      file=sys.stderr)

    rows = []
    print("| workload | process setting | s/step | tokens/s | vs glibc default | "
          "page faults / step | peak RSS (MB) |")
    print("|---|---|---|---|---|---|---|")
    for w in workloads:
        runs = results[w, "glibc default"]
        base = statistics.median([x for run in runs for x in run["times"]])
        for s in table:
            runs = results[w, s]
            t = statistics.median([x for run in runs for x in run["times"]])
            faults = statistics.median(run["faults"] for run in runs)
            peak = max(run["peak_mb"] for run in runs)
            tokens = runs[0]["tokens"]
            rows.append({"workload": w, "setting": s, "s_per_step": t, "faults": faults,
                         "peak_mb": peak, "threads": runs[0]["threads"]})
            print(f"| {w} | {s} | {t:.3f} | {tokens / t:,.0f} | {base / t:.2f}x | "
                  f"{faults:,.0f} | {peak:.0f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "process.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
