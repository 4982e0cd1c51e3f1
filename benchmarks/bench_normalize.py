"""What running BERT's normalizer in Python (`minibert.data.normalize`) buys, side by side.

Three measurements on WikiText-2 text (valid and test, repeated `--copies` times), each
alternating the two ways in one process so that a drifting machine affects both alike:

1. the Rust normalizer's share of the Rust pipeline, one document at a time (one thread):
   `normalizer.normalize_str` against `encode` of the same documents;
2. `tokenize_to_memmap` with the normalizer in Python (the default) and in Rust;
3. WordPiece training (vocabulary 8,192) on text normalized in Python, the trainer's own
   normalizer off, and on raw text through the Rust normalizer.

    python benchmarks/bench_normalize.py --copies 8 --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tokenizers import trainers

import minibert
from minibert.data import tokens
from minibert.data.normalize import FastEncoder
from minibert.data.special_tokens import SPECIAL_TOKENS
from minibert.data.tokenizer_train import normalized

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2"


def documents(data: Path, copies: int) -> list[str]:
    text = "".join((data / f"{s}.txt").read_text(encoding="utf-8") for s in ("valid", "test"))
    return [d for d in text.split("\n \n") if d.strip()] * copies


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def train(docs: list[str], in_python: bool) -> None:
    backend = minibert.Tokenizer._bert_pipeline(None, True, None)
    # The Rust trainer alone, both ways: what is compared is where the text is normalized.
    trainer = trainers.WordPieceTrainer(vocab_size=8192, min_frequency=2, limit_alphabet=1000,
                                        special_tokens=list(SPECIAL_TOKENS),
                                        continuing_subword_prefix="##", show_progress=False)
    if in_python:
        words_like = minibert.Tokenizer._bert_pipeline(None, True, None)
        backend.normalizer = None
        backend.train_from_iterator(normalized(iter(docs), words_like), trainer)
    else:
        backend.train_from_iterator(iter(docs), trainer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=DATA)
    p.add_argument("--copies", type=int, default=8, help="times WikiText-2 is repeated")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if not (args.data_dir / "valid.txt").is_file():
        sys.exit(f"WikiText-2 (valid.txt, test.txt) not found in {args.data_dir}")
    docs = documents(args.data_dir, args.copies)
    mb = sum(map(len, docs)) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        tok = minibert.Tokenizer.train_from_iterator(docs[: len(docs) // args.copies],
                                                     vocab_size=8192, cache_dir=tmp)
        backend = tok.backend
        one = docs[: len(docs) // args.copies]  # one copy: single-threaded calls are slow
        norm_s = min(timed(lambda: [backend.normalizer.normalize_str(d) for d in one])
                     for _ in range(args.rounds))
        enc_s = min(timed(lambda: [backend.encode(d, add_special_tokens=False) for d in one])
                    for _ in range(args.rounds))
        one_mb = sum(map(len, one)) / 1e6
        print(f"one thread, {one_mb:.1f} MB: Rust normalizer {one_mb / norm_s:.2f} MB/s, whole "
              f"pipeline {one_mb / enc_s:.2f} MB/s: the normalizer is {norm_s / enc_s:.0%} of it")

        real_of = FastEncoder.of
        runs: dict[str, list[float]] = {"python": [], "rust": []}
        for r in range(args.rounds):
            for way in ("rust", "python"):
                tokens.FastEncoder.of = real_of if way == "python" else (lambda backend: None)
                try:
                    runs[way].append(timed(lambda: tokens.tokenize_to_memmap(
                        docs, tok, Path(tmp) / f"{way}{r}.tok")))
                finally:
                    tokens.FastEncoder.of = real_of
        same = (Path(tmp) / "rust0.tok").read_bytes() == (Path(tmp) / "python0.tok").read_bytes()
        r_s, p_s = min(runs["rust"]), min(runs["python"])
        print(f"tokenize_to_memmap, {mb:.1f} MB, best of {args.rounds}: normalizer in Rust "
              f"{mb / r_s:.2f} MB/s, in Python {mb / p_s:.2f} MB/s: {r_s / p_s:.2f}x; "
              f"token files identical: {same}")

        half = docs[: len(docs) // 2]
        train_runs: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for in_python in (False, True):
                train_runs[in_python].append(timed(lambda: train(half, in_python)))
        r_s, p_s = min(train_runs[False]), min(train_runs[True])
        print(f"WordPiece training, {mb / 2:.1f} MB, best of {args.rounds}: raw text "
              f"{r_s:.1f} s, normalized in Python {p_s:.1f} s: {r_s / p_s:.2f}x")
        print("(all times:", {k: [round(t, 2) for t in v] for k, v in runs.items()},
              {("python" if k else "rust"): [round(t, 2) for t in v]
               for k, v in train_runs.items()}, ")")


if __name__ == "__main__":
    main()
