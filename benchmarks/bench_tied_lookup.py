"""The tied word embedding's gradient on a CPU: three ways to build it, timed on base steps.

The word-embedding matrix is both the lookup's table and the MLM decoder's weight, so a
step gives it two gradients that must be summed:

* dense: plain autograd; the lookup's gradient is a zero-filled vocabulary-sized tensor,
  added to the decoder's;
* sparse: the lookup's gradient is sparse (`F.embedding(..., sparse=True)`), and autograd
  adds it to the decoder's out of place, into a fresh vocabulary-sized tensor;
* hand-off: `minibert.machine.kernels.TiedWordGradient`, what a `minibert.fast` model does on
  a CPU; the decoder's backward hands its gradient to the lookup's, which adds its rows in
  place.

Base training steps (fp32, 8 x 128, vocabulary 30,522, 15% labelled, fused AdamW), the ways
alternated step by step in one process, the first round dropped as warm-up. The C
allocator is left as it comes, unless `--keep-freed-memory`: the vocabulary-sized
temporaries cost mostly the page faults of fresh memory, which that setting avoids.

    python benchmarks/bench_tied_lookup.py --steps 10
    python benchmarks/bench_tied_lookup.py --steps 1 --profile   # where each way's step goes
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import minibert
import minibert.model.heads
from minibert.machine.kernels import TiedWordGradient
from minibert.machine.memory import keep_freed_memory


class SparseLookup:
    """The sparse way, in TiedWordGradient's shape: autograd sums the two gradients."""

    def lookup(self, ids, weight, padding_idx):
        return F.embedding(ids, weight, padding_idx, sparse=True)

    def decoder(self, h, weight, bias):
        return F.linear(h, weight, bias)


WAYS = {"dense": lambda: None, "sparse": SparseLookup, "hand-off": TiedWordGradient}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed steps of each way")
    p.add_argument("--keep-freed-memory", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="then profile one step of each way: the top operators by self time")
    args = p.parse_args()
    if args.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(0)
    model = minibert.fast(minibert.BertForMaskedLM(minibert.BertConfig.preset(
        args.preset, attention="math")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    ids = torch.randint(5, V, (args.batch_size, args.seq_len), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)

    def step(way: str) -> float:
        # what BertForMaskedLM builds per forward
        minibert.machine.kernels.TiedWordGradient = WAYS[way]
        start = time.perf_counter()
        model(ids, labels=labels).loss.backward()
        assert not model.bert.embeddings.word.weight.grad.is_sparse
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for i in range(args.steps + 1):
        for way in WAYS:
            t = step(way)
            if i:  # the first round warms up
                times[way].append(t)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        for way in WAYS:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(way)
            print(f"--- {way}: one step, by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    minibert.machine.kernels.TiedWordGradient = TiedWordGradient
    dense = statistics.median(times["dense"])
    print(f"{args.preset}, {args.batch_size} x {args.seq_len}, fp32, allocator "
          f"{'keeping freed memory' if args.keep_freed_memory else 'as it comes'}, "
          f"median of {args.steps} steps:")
    for way, ts in times.items():
        m = statistics.median(ts)
        print(f"  {way:9s} {m:.3f} s/step (best {min(ts):.3f}), {1 - m / dense:+.0%} less "
              f"than dense")


if __name__ == "__main__":
    main()
