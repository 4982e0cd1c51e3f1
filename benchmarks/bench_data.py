"""Is the data pipeline ever the bottleneck? Time its three stages on WikiText-2.

1. training a WordPiece tokenizer on the corpus (cache disabled, so it really trains);
2. pre-tokenizing the corpus into a token file, in MB of UTF-8 text per second
   (target: >= 2 MB/s on 2 CPU cores);
3. producing one 32 x 128 MLM batch: 32 packed examples read from the memmap,
   padded and masked (target: < 5 ms, under 2% of a mini-preset training step).

Run from the repository root::

    python benchmarks/bench_data.py [--data-dir ../shared/data/wikitext-2]

The numbers go into the "## Data pipeline" section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402

from minibert.data import MLMCollator, PackedMLMDataset, load_wikitext, tokenize_to_memmap  # noqa: E402
from minibert.data.tokenizer import Tokenizer  # noqa: E402

SECTION = "## Data pipeline"


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} CPU cores visible; Python {platform.python_version()}, "
            f"torch {torch.__version__}, tokenizers {tokenizers.__version__}, numpy "
            f"{np.__version__}, {platform.system()} {platform.release()}; load average "
            f"{os.getloadavg()[0]:.1f} at start (other work on the cores slows every number)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=str(REPO / ".." / "shared" / "data" / "wikitext-2"),
                        help="folder with WikiText-2 splits (default: ../shared/data/wikitext-2)")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=200, help="batches timed")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "RESULTS.md"))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    host = machine()  # before the work starts, so the load average is the background load
    data_dir = Path(args.data_dir)
    splits = load_wikitext(data_dir)
    n_articles = sum(len(v) for v in splits.values())
    files = sorted(p for p in data_dir.iterdir() if p.suffix in (".txt", ".raw", ".tokens"))
    n_bytes = sum(p.stat().st_size for p in files)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        tok = Tokenizer.train(files, vocab_size=args.vocab_size, use_cache=False)
        t_train = time.perf_counter() - t0

        # From the files, so reading and decoding count too. Best of three: the
        # first pass also warms the page cache and the thread pool.
        t_tok = []
        for _ in range(3):
            t0 = time.perf_counter()
            tf = tokenize_to_memmap(files, tok, Path(tmp) / "corpus.tok")
            t_tok.append(time.perf_counter() - t0)
        mb_s = n_bytes / 1e6 / min(t_tok)

        ds = PackedMLMDataset(tf, args.seq_len)
        collate = MLMCollator(tok)
        B = args.batch_size
        rng = np.random.default_rng(0)
        times = []
        for _ in range(args.repeats):
            idx = rng.choice(len(ds), size=B, replace=False)
            t0 = time.perf_counter()
            batch = collate([ds[int(i)] for i in idx])
            times.append(time.perf_counter() - t0)
        assert batch["input_ids"].shape == (B, args.seq_len)
        ms = 1e3 * float(np.median(times))

    rows = [
        ("corpus", f"{', '.join(p.name for p in files)} of {data_dir.name}: {n_articles} "
                   f"articles, {n_bytes / 1e6:.2f} MB, {tf.n_tokens:,} tokens"),
        (f"tokenizer training (vocab {tok.vocab_size})", f"{t_train:.2f} s"),
        ("pre-tokenization", f"{mb_s:.1f} MB/s (target >= 2 MB/s)"),
        (f"one {B}x{args.seq_len} MLM batch (read + pad + mask)",
         f"{ms:.2f} ms median of {args.repeats} (target < 5 ms)"),
    ]
    cmd = "python benchmarks/bench_data.py " + " ".join(sys.argv[1:])
    text = "\n".join([
        SECTION, "",
        f"Machine: {host}.", "",
        f"Command: `{cmd.strip()}`", "",
        "| measure | result |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows], "",
    ])
    print(text)
    if not args.no_write:
        write_section(Path(args.results), text)


def write_section(path: Path, section: str) -> None:
    """Replace (or append) the data-pipeline section, leaving the others alone."""
    old = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _: section + "\n", old)
    else:
        new = old.rstrip("\n") + "\n\n" + section
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
