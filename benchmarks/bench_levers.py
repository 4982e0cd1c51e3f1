"""What each kept speed lever buys on a CPU: BERT-base, 8 x 128 tokens, bf16 autocast.

Four variants of the same training step (forward with 15% labels, backward, AdamW step),
each adding one lever to the previous one, built side by side and timed interleaved, so that
machine noise falls on all of them alike. Dropout is 0.1 as in a transformers checkpoint.

    python benchmarks/bench_levers.py          # about 2 minutes on 2 cores

The "before" of the dropout lever swaps minibert's CPU mask for `F.dropout` by patching the
module attribute the model calls; nothing else differs between the variants.
"""

import statistics
import time

import torch
import torch.nn.functional as F

import minibert
import minibert.attention as A
import minibert.model as M
from minibert.engine import autocast_context

ours = A.dropout


def plain(x, p, training=True):
    return F.dropout(x, p, True) if training and p > 0 else x

variants = [  # label, attention, fused, dropout function
    ("foreach AdamW, F.dropout, sdpa", "sdpa", False, plain),
    ("+ fused AdamW", "sdpa", True, plain),
    ("+ cheaper CPU dropout mask", "sdpa", True, ours),
    ("+ math attention instead of sdpa", "math", True, ours),
]
g = torch.Generator().manual_seed(0)
ids = torch.randint(5, 30522, (8, 128), generator=g)
labels = torch.full_like(ids, -100)
pick = torch.rand(8, 128, generator=g) < 0.15
labels[pick] = ids[pick]
runs = []
for label, attention, fused, drop in variants:
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(minibert.BertConfig.preset("base", attention=attention))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused,
                            foreach=None if fused else True)
    runs.append((label, model, opt, drop, []))


def step(model, opt, drop):
    A.dropout = M.dropout = drop
    with autocast_context("bf16", torch.device("cpu")):
        loss = model(ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for r in range(8):  # the first round is warm-up
    for label, model, opt, drop, ts in runs:
        t0 = time.perf_counter()
        step(model, opt, drop)
        ts.append(time.perf_counter() - t0)
A.dropout = M.dropout = ours
print("| variant (base, 8x128, bf16 autocast, dropout 0.1) | s/step (median of 7) | tokens/s |")
print("|---|---|---|")
for label, _, _, _, ts in runs:
    m = statistics.median(ts[1:])
    print(f"| {label} | {m:.3f} | {1024 / m:,.0f} |")
