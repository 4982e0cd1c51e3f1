"""Training a WordPiece vocabulary: how long it takes, and whether it comes out the same.

Trains `Tokenizer.train(FILES, vocab_size, use_cache=False)` once in this process and prints
the seconds and a hash of the trained pipeline. Run it several times, each a fresh process:
the Rust trainer's hash maps are seeded per process, so equal hashes across processes are
what "the same vocabulary in every process" means. To compare two trees, alternate them:

    for i in 1 2 3; do for tree in ../old ../new; do
        PYTHONPATH=$tree python benchmarks/bench_tokenizer_train.py \
            ../shared/data/wikitext-2/valid.txt ../shared/data/wikitext-2/test.txt
    done; done
"""

from __future__ import annotations

import argparse
import hashlib
import time

from minibert.data.tokenizer import Tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="text files to train on")
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    start = time.perf_counter()
    tok = Tokenizer.train(args.files, args.vocab_size, use_cache=False)
    seconds = time.perf_counter() - start
    digest = hashlib.sha256(tok.backend.to_str().encode("utf-8")).hexdigest()[:12]
    print(f"{seconds:.2f} s, vocabulary {tok.vocab_size}, pipeline hash {digest}")


if __name__ == "__main__":
    main()
