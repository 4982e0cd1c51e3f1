"""The tied word embedding's gradient on a CPU: sparse lookup gradient against dense.

`BertForMaskedLM` asks its word-embedding lookup for a sparse gradient on a CPU, which
autograd adds into the tied decoder's dense one; the dense way builds a zero-filled
vocabulary-sized gradient and adds two vocabulary-sized tensors every step. This script
times base training steps (fp32, 8 x 128, vocabulary 30,522, 15% labelled, fused AdamW)
both ways, alternating step by step in one process:

    python benchmarks/bench_tied_lookup.py --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import minibert


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed steps of each way")
    args = p.parse_args()
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(minibert.BertConfig.preset(args.preset, attention="math"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    ids = torch.randint(5, V, (args.batch_size, args.seq_len), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
    sparse_forward = model.bert.forward

    def dense_forward(*a, sparse_word_grad=False, **k):
        return sparse_forward(*a, sparse_word_grad=False, **k)

    def step(way: str) -> float:
        model.bert.forward = sparse_forward if way == "sparse" else dense_forward
        start = time.perf_counter()
        model(ids, labels=labels).loss.backward()
        assert not model.bert.embeddings.word.weight.grad.is_sparse
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"dense": [], "sparse": []}
    for i in range(args.steps + 1):
        for way in ("dense", "sparse"):
            t = step(way)
            if i:  # the first round warms up
                times[way].append(t)
    d, s = statistics.median(times["dense"]), statistics.median(times["sparse"])
    print(f"{args.preset}, {args.batch_size} x {args.seq_len}, fp32, median of {args.steps}: "
          f"dense {d:.3f} s/step (best {min(times['dense']):.3f}), sparse {s:.3f} s/step "
          f"(best {min(times['sparse']):.3f}): {1 - s / d:.0%} less per step")


if __name__ == "__main__":
    main()
