"""What oneDNN's kernel cache holds for a bf16 training step, counted from its own log.

torch runs a CPU's bf16 matmuls through oneDNN, which compiles a kernel per matmul shape
and caches it (benchmarks/RESULTS.md, "A bound on oneDNN's kernel cache"). Run with
`ONEDNN_VERBOSE=profile_create,profile_exec`, oneDNN prints one line per kernel it
compiles (`create:cache_miss`) and runs (`exec`); this script counts those lines step by
step, each run in a fresh process:

* `step`: the mini model (vocabulary 8,192) trained on batches of 32 x 128 with 30% of
  positions masked, the main job's step: how many matmuls run through oneDNN in one step,
  and how many distinct kernels (shape, dtypes, layout) they need.
* `warmup`: the main job's first steps under its sequence-length warmup (16 -> 128
  positions over 500 steps), once with the cache bounded at 128 kernels (the scripts'
  `memory.KERNEL_CACHE_CAPACITY`) and once at oneDNN's own 1,024: the kernels compiled at
  each step, and whether the two bounds compiled the same ones.
* `every`: a sequence classifier trained on batches whose length is drawn anew each step
  from 8 ... 128 (dynamic padding of varied texts, as in fine-tuning), under each bound:
  the share of a step's kernels each bound had to compile again.

The data are random token ids: only the shapes matter here. Use a CPU whose oneDNN runs
bf16 matmuls (any x86 CPU with AVX2 or later; bf16 is emulated on AVX2, so slow there).

    python benchmarks/bench_kernel_cache.py     # about three minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter

from minibert.machine.memory import KERNEL_CACHE_CAPACITY, KERNEL_CACHE_ENV

MARK = "@@step "  # printed, flushed, before each step; oneDNN flushes each line it prints
BOUNDS = (KERNEL_CACHE_CAPACITY, 1024)  # the scripts' bound, and oneDNN's own


def child(kind: str, steps: int) -> None:
    import random

    import torch

    from minibert import BertConfig, BertForMaskedLM, BertForSequenceClassification, fast
    from minibert.data.seq_warmup import seq_len_at, truncate
    from minibert.cli.pretrain import MAIN_JOB

    torch.manual_seed(0)
    rng = random.Random(0)
    config = BertConfig.preset("mini", vocab_size=8192)
    batch, full = 32, 128
    model = fast(BertForSequenceClassification(config, 2) if kind == "every"
                 else BertForMaskedLM(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(1, steps + 1):
        if kind == "warmup":
            length = seq_len_at(step, full, MAIN_JOB.train.seq_len_start, 500)
        elif kind == "every":
            length = rng.randint(8, full)
        else:
            length = full
        ids = torch.randint(5, config.vocab_size, (batch, full))
        if kind == "every":
            inputs = {"input_ids": ids[:, :length], "labels": torch.randint(0, 2, (batch,))}
        else:
            masked = torch.rand(batch, full) < 0.3
            labels = torch.where(masked, ids, torch.full_like(ids, -100))
            inputs = truncate({"input_ids": ids.masked_fill(masked, 4), "labels": labels},
                              length)
        print(f"{MARK}{step} {length}", flush=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"{MARK}end", flush=True)


def run(kind: str, steps: int, bound: int) -> list[dict]:
    """Per step: its length, and the kernels oneDNN compiled and ran."""
    env = {**os.environ, "ONEDNN_VERBOSE": "profile_create,profile_exec",
           KERNEL_CACHE_ENV: str(bound)}
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(steps)], env=env,
                         capture_output=True, text=True, check=True).stdout
    rows: list[dict] = []
    for line in out.splitlines():
        if line.startswith(MARK):
            fields = line[len(MARK):].split()
            if fields[0] == "end":
                break
            rows.append({"length": int(fields[1]), "compiled": [], "ran": []})
        elif rows and line.startswith("onednn_verbose,") and ",primitive," in line:
            fields = line.split(",")
            event, key = fields[3], ",".join(fields[4:-1])  # the last field is a time
            if event == "create:cache_miss":
                rows[-1]["compiled"].append(key)
            elif event == "exec":
                rows[-1]["ran"].append(key)
    if len(rows) != steps:
        raise RuntimeError(f"counted {len(rows)} of {steps} steps; is ONEDNN_VERBOSE honoured "
                           f"by this torch?")
    return rows


def report_step(steps: int) -> None:
    rows = run("step", steps, 1024)
    last = rows[-1]
    ran = Counter(k.split(",")[1] for k in last["ran"])  # primitive kind -> times run
    distinct = Counter(k.split(",")[1] for k in set(last["ran"]))
    print(f"## One bf16 step of the mini model at 32 x 128 (step {steps} of {steps})\n")
    print("| primitive | run per step | distinct kernels |\n|---|---|---|")
    for kind, n in ran.most_common():
        print(f"| {kind} | {n} | {distinct[kind]} |")
    print(f"| all | {sum(ran.values())} | {sum(distinct.values())} |\n")
    print(f"Kernels compiled at steps 1 ... {steps}: "
          f"{', '.join(str(len(r['compiled'])) for r in rows)}\n")


def report_warmup(steps: int) -> None:
    runs = {b: run("warmup", steps, b) for b in BOUNDS}
    print(f"## The main job's first {steps} steps, sequence-length warmup 16 -> 128 over 500\n")
    print("| step | length | " + " | ".join(f"compiled, bound {b}" for b in BOUNDS) + " |")
    print("|---|---|" + "---|" * len(BOUNDS))
    for i, row in enumerate(runs[BOUNDS[0]]):
        counts = [len(runs[b][i]["compiled"]) for b in BOUNDS]
        if i == 0 or row["length"] != runs[BOUNDS[0]][i - 1]["length"] or any(counts):
            print(f"| {i + 1} | {row['length']} | " + " | ".join(map(str, counts)) + " |")
    same = all(Counter(runs[BOUNDS[0]][i]["compiled"]) == Counter(runs[b][i]["compiled"])
               for b in BOUNDS[1:] for i in range(steps))
    totals = ", ".join(f"{sum(len(r['compiled']) for r in runs[b]):,} with {b}" for b in BOUNDS)
    print(f"\nSteps not listed compiled nothing under either bound. Kernels compiled in all: "
          f"{totals}; the same kernels at the same steps: {'yes' if same else 'NO'}\n")


def report_every(steps: int) -> None:
    print(f"## A classifier, batch length drawn from 8 ... 128 each step, {steps} steps\n")
    print("| bound | kernels compiled | kernels run | compiled / run, after step 20 |")
    print("|---|---|---|---|")
    for b in BOUNDS:
        rows = run("every", steps, b)
        compiled = sum(len(r["compiled"]) for r in rows)
        ran = sum(len(r["ran"]) for r in rows)
        late = rows[20:]
        share = sum(len(r["compiled"]) for r in late) / max(1, sum(len(r["ran"]) for r in late))
        print(f"| {b} | {compiled:,} | {ran:,} | {share:.0%} |")
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warmup-steps", type=int, default=60, help="steps of the `warmup` run")
    p.add_argument("--every-steps", type=int, default=200, help="steps of the `every` run")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    report_step(3)
    report_warmup(args.warmup_steps)
    report_every(args.every_steps)


if __name__ == "__main__":
    main()
