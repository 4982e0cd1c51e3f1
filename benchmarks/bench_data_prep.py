"""Does preparing a folder of text need memory that grows with the corpus? Peak resident
memory and time of the main job's data preparation at 20 MB, 200 MB and 1 GB.

A continued-pretraining user points the main job at a folder of `.txt` files. Before the
first step it reads the folder (`load_corpus`), trains a WordPiece tokenizer on the train
split and tokenizes both splits into memory-mapped token files. Each size runs the main
job itself, in a fresh process, with a tiny model and one training step, so what is
measured is the preparation (and a constant: torch, a tiny model, one step):

    python benchmarks/bench_data_prep.py                      # 20 MB, 200 MB, 1 GB
    python benchmarks/bench_data_prep.py --sizes-mb 20 200    # quicker
    # against another checkout (e.g. `git worktree add /tmp/old <commit>`), alternating
    python benchmarks/bench_data_prep.py --sizes-mb 200 --baseline /tmp/old --rounds 2

The corpus is made from WikiText-2 (`valid` and `test`): paragraphs as documents, shuffled
differently in each copy, each ending in its own number, so the folder grows in documents
and in distinct words (one per document) as a real one would, written as 8 files. Peak RSS
comes from `/usr/bin/time -v` (the process's maximum resident set); MB/s is the corpus's
bytes over the time from start to the first training step, both cores in use (the
tokenizer library encodes in parallel). Goal: at 1 GB, peak RSS at most 1.3x that at 200 MB
and under 1.5 GB, at >= 4 MB/s. Prints a table for RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "wikitext-2"


def make_folder(folder: Path, source: Path, megabytes: int, n_files: int = 8) -> int:
    """Write `megabytes` of documents into `n_files` files of `folder`; returns bytes."""
    paragraphs = [line.strip() for name in ("valid.txt", "test.txt")
                  for line in (source / name).read_text(encoding="utf-8").splitlines()
                  if len(line.strip()) > 80]
    rng, target, doc = random.Random(0), megabytes * 10**6, 0
    folder.mkdir(parents=True)
    files = [open(folder / f"part{i:02d}.txt", "w", encoding="utf-8") for i in range(n_files)]
    written = 0
    try:
        while written < target:
            rng.shuffle(paragraphs)
            for p in paragraphs:
                text = f"{p} {doc}\n\n"
                files[doc % n_files].write(text)
                written += len(text.encode("utf-8"))
                doc += 1
                if written >= target:
                    break
    finally:
        for f in files:
            f.close()
    return written


def prepare(folder: Path, work: Path, root: Path = ROOT) -> dict:
    """Run the main job of checkout `root` on `folder` under /usr/bin/time -v: seconds to
    the first step, RSS."""
    cmd = ["/usr/bin/time", "-v", sys.executable, str(root / "examples" / "pretrain_wikitext.py"),
           "--data-dir", str(folder), "--out", str(work / "run"), "--cache-dir",
           str(work / "cache"), "--preset", "tiny", "--max-steps", "1", "--eval-batches", "1",
           "--log-every", "1", "--no-progress", "--precision", "fp32"]
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(root)}  # that checkout's minibert
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    stamps = {}
    for line in proc.stdout:  # the job's log, timed as it arrives
        now = time.perf_counter() - start
        if "training blocks" in line:
            stamps["model built"] = now
        elif line.startswith("tokenizing the train split"):
            stamps["tokenizer trained"] = now
        elif line.startswith("split train:"):
            stamps["train tokenized"] = now
    err = proc.stderr.read()
    if proc.wait() != 0:
        raise RuntimeError(f"the main job failed:\n{err[-3000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    return {"seconds_to_first_step": stamps.get("model built", time.perf_counter() - start),
            "stamps": stamps, "peak_rss_mb": rss_kb / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[20, 200, 1000])
    p.add_argument("--work", type=Path, help="where the folders go (default: a temporary one)")
    p.add_argument("--baseline", type=Path, help="another checkout to time alternately with "
                   "this one on the same folders: a ratio that holds on a machine whose "
                   "speed drifts")
    p.add_argument("--rounds", type=int, default=1, help="runs per checkout and size")
    args = p.parse_args()
    if not (args.data_dir / "valid.txt").is_file():
        sys.exit(f"WikiText-2 (valid.txt, test.txt) not found in {args.data_dir}: pass --data-dir")
    work = Path(tempfile.mkdtemp(prefix="prep-", dir=args.work))
    rows, ratios = [], []
    try:
        for mb in args.sizes_mb:
            n_bytes = make_folder(work / f"corpus{mb}", args.data_dir, mb)
            runs: dict[str, list[dict]] = {"this": [], "baseline": []}
            for r in range(args.rounds):
                for name, root in [("baseline", args.baseline), ("this", ROOT)]:
                    if root is None:
                        continue
                    out = prepare(work / f"corpus{mb}", work / f"job{mb}", root.resolve())
                    runs[name].append(out)
                    print(f"{mb} MB, {name}: {out['seconds_to_first_step']:.1f} s to the first "
                          f"step ({n_bytes / 1e6 / out['seconds_to_first_step']:.2f} MB/s), peak "
                          f"RSS {out['peak_rss_mb']:.0f} MB; "
                          + ", ".join(f"{k} at {v:.1f} s" for k, v in out["stamps"].items()),
                          flush=True)
                    shutil.rmtree(work / f"job{mb}")
            r = min(runs["this"], key=lambda o: o["seconds_to_first_step"])
            rows.append((mb, n_bytes, r, n_bytes / 1e6 / r["seconds_to_first_step"]))
            if runs["baseline"]:
                b = min(o["seconds_to_first_step"] for o in runs["baseline"])
                ratios.append((mb, b, r["seconds_to_first_step"]))
            shutil.rmtree(work / f"corpus{mb}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| corpus | time to the first step | MB/s | peak RSS |")
    print("|---|---|---|---|")
    for mb, n_bytes, r, mbps in rows:
        print(f"| {n_bytes / 1e6:,.0f} MB | {r['seconds_to_first_step']:.0f} s | {mbps:.2f} | "
              f"{r['peak_rss_mb']:,.0f} MB |")
    for mb, b, t in ratios:
        print(f"\n{mb} MB, best of {args.rounds}: baseline {b:.1f} s, this checkout {t:.1f} s: "
              f"{b / t:.2f}x sooner")
    if len(rows) >= 2:
        a, b = rows[-2], rows[-1]
        print(f"\npeak RSS at {b[0]} MB / at {a[0]} MB: "
              f"{b[2]['peak_rss_mb'] / a[2]['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
