"""Does a training job's memory stay flat over a long run, and at what speed?

Runs `examples/pretrain_wikitext.py` (`--job pretrain`, the default) or
`examples/finetune_classification.py` (`--job finetune`) with its own defaults for `--steps`
steps, once per setting, one setting after the other, and samples the job's resident set
(VmRSS) from outside the process every `--every` seconds. The job's own `metrics.jsonl`
maps each sample to the step being trained, so the table gives, per window of steps, the
largest resident set seen and the median tokens/s the job logged.

    python benchmarks/bench_soak.py --data-dir ../shared/data/wikitext-2 --steps 3000
    python benchmarks/bench_soak.py --data-dir ../shared/data/wikitext-2 --steps 2000 \\
        --setting default= --setting no-keep=--no-keep-freed-memory \\
        --setting mmap-1M=--no-keep-freed-memory,MALLOC_MMAP_THRESHOLD_=1048576
    python benchmarks/bench_soak.py --data-dir ../shared/data/wikitext-2 --job finetune

The fine-tuning job classifies sentences, where lengths vary most: each WikiText sentence
of 5 words or more is kept as written ("original") or, for half of them at random, has a
span of its words shuffled ("shuffled"); the training file comes from the valid split and
the evaluation file from the first 2,000 sentences of the test split, so the batches take
every length from a few tokens to --seq-len, and the model starts from random weights
(the memory does not depend on them).

A setting is `name=flag,flag,VAR=value,module.NAME=value`: flags go to the job, VAR=value
into its environment, and module.NAME=value sets a library constant in the job's process
before it starts (to measure what a constant buys, e.g. `minibert.machine.kernels.PREDICTION_ROWS=1`
runs the sparse MLM head on the masked rows alone, as before they were rounded up).

The summary line is the target of the memory issue: the largest resident set over steps
1,600 - 2,000 divided by the one over steps 200 - 400 (at most 1.3 to pass), and each
setting's median tokens/s over the run against the first setting's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a row being written
            pass
    return rows


def sentences(path: Path) -> list[str]:
    """WikiText's sentences of at least 5 words: paragraphs split after " . "."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("="):  # blank lines and section headings
            continue
        for sentence in line.split(" . "):
            if len(sentence.split()) >= 5:
                found.append(sentence.rstrip(" .") + " .")
    return found


def write_task(sents: list[str], path: Path, seed: int) -> None:
    """A two-class TSV: each sentence as written, or with a span of its words shuffled."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:  # TSV: no quoting, and texts hold no tab
        f.write("sentence\tlabel\n")
        for s in sents:
            words, label = s.split(), "original"
            if rng.random() < 0.5:
                lo = rng.randrange(len(words) - 3)
                hi = rng.randrange(lo + 3, len(words) + 1)
                span = words[lo:hi]
                while len(set(span)) > 1 and span == words[lo:hi]:
                    rng.shuffle(span)
                if span != words[lo:hi]:
                    words[lo:hi], label = span, "shuffled"
            f.write(f"{' '.join(words)}\t{label}\n")


def job_command(args: argparse.Namespace, out: Path, run_dir: Path) -> list[str]:
    common = ["--max-steps", str(args.steps), "--out", str(run_dir), "--no-progress",
              "--log-every", "10"]
    if args.job == "pretrain":
        return [sys.executable, str(ROOT / "examples" / "pretrain_wikitext.py"), "--data-dir",
                str(args.data_dir), "--train-split", "valid", "--eval-split", "test", *common]
    train, dev = out / "task-train.tsv", out / "task-dev.tsv"
    if not train.is_file():
        write_task(sentences(args.data_dir / "valid.txt"), train, seed=0)
        write_task(sentences(args.data_dir / "test.txt")[:2000], dev, seed=1)
    return [sys.executable, str(ROOT / "examples" / "finetune_classification.py"), "--train",
            str(train), "--eval", str(dev), "--text-column", "sentence", "--label-column",
            "label", "--cache-dir", str(out / "cache"), *common]


def run(name: str, spec: str, args: argparse.Namespace, out: Path) -> dict:
    """One setting: the job to the end, RSS samples [(step, MB)] and its log rows."""
    flags, env, constants = [], dict(os.environ), []
    for item in filter(None, spec.split(",")):
        if "=" in item and not item.startswith("-"):
            key, value = item.split("=", 1)
            if "." in key:
                constants.append((*key.rsplit(".", 1), value))
            else:
                env[key] = value
        else:
            flags.append(item)
    run_dir = out / name
    cmd = [*job_command(args, out, run_dir), *flags]
    if constants:  # the same script, run by a prelude that sets the constants first
        prelude = "; ".join(f"import {m}; {m}.{n} = {v}" for m, n, v in constants)
        cmd = [cmd[0], "-c", f"import runpy, sys; {prelude}; sys.argv = sys.argv[1:]; "
               f"runpy.run_path(sys.argv[0], run_name='__main__')", *cmd[1:]]
    print(f"[{name}] {' '.join(cmd[1:])}", file=sys.stderr)
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    samples, metrics = [], run_dir / "metrics.jsonl"
    last_step, seen = 0, 0
    while job.poll() is None:
        time.sleep(args.every)
        mb = rss_mb(job.pid)
        rows = read_rows(metrics)
        if len(rows) > seen:
            steps = [r["step"] for r in rows if "loss" in r]
            last_step = steps[-1] if steps else last_step
            seen = len(rows)
        if mb is not None:
            samples.append((last_step, mb))
    if job.returncode != 0:
        sys.exit(f"[{name}] failed (exit {job.returncode}): {job.stderr.read()[-2000:]}")
    return {"samples": samples, "rows": [r for r in read_rows(metrics) if "loss" in r]}


def window_peak(samples: list[tuple[int, float]], lo: int, hi: int) -> float | None:
    """The largest RSS sampled while the job trained steps lo+1 ... hi (by the last
    logged step at each sample)."""
    inside = [mb for step, mb in samples if lo <= step < hi]
    return max(inside) if inside else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--job", choices=["pretrain", "finetune"], default="pretrain")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--window", type=int, default=200, help="steps per table row")
    p.add_argument("--every", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--setting", action="append", metavar="NAME=SPEC",
                   help="repeatable; default: the job's defaults, and the other "
                   "--keep-freed-memory choice")
    p.add_argument("--out", type=Path, help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    settings = args.setting or (["default=", "no-keep=--no-keep-freed-memory"]
                                if args.job == "pretrain" else
                                ["default=", "keep=--keep-freed-memory"])
    out = args.out or Path(tempfile.mkdtemp(prefix="minibert-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for item in settings:
        name, _, spec = item.partition("=")
        results[name] = run(name, spec, args, out)

    edges = list(range(0, args.steps, args.window))
    print(f"\nresident set (MB, largest sampled) per window of {args.window} steps; "
          f"{args.job} job defaults, {args.steps} steps\n")
    print("| setting | " + " | ".join(f"{a}-{a + args.window}" for a in edges) +
          " | median tokens/s |")
    print("|---" * (len(edges) + 2) + "|")
    base_tps = None
    for name, r in results.items():
        peaks = [window_peak(r["samples"], a, a + args.window) for a in edges]
        tps = statistics.median(row["tokens_per_s"] for row in r["rows"])
        base_tps = base_tps or tps
        print(f"| {name} | " + " | ".join(f"{x:,.0f}" if x else "-" for x in peaks) +
              f" | {tps:,.0f} |")
    print()
    for name, r in results.items():
        early, late = window_peak(r["samples"], 200, 400), window_peak(r["samples"], 1600, 2000)
        tps = statistics.median(row["tokens_per_s"] for row in r["rows"])
        ratio = f"{late / early:.2f}" if early and late else "n/a"
        print(f"{name}: RSS steps 1600-2000 / 200-400 = {ratio}; tokens/s {tps / base_tps:.2f}x "
              f"the first setting's")
    (out / "soak.json").write_text(json.dumps(results))
    print(f"\nsamples and rows: {out / 'soak.json'}")


if __name__ == "__main__":
    main()
