"""What each kept speed lever buys on a CPU: BERT-base, 8 x 128 tokens, bf16 autocast.

Four measurements, each printed as a markdown table:

1. the step: five variants of the same training step (forward with 15% labels, backward,
   AdamW step), each adding one lever to the previous one, built side by side and timed
   interleaved so that machine noise falls on all of them alike (dropout 0.1, as in a
   transformers checkpoint, until the last variant turns it off as pretraining does);
2. the single calls behind three levers: dropout (`F.dropout` against minibert's CPU
   mask), attention (`sdpa` against `math`) and the Q/K/V projection (three matmuls
   against one fused one), forward + backward, best of 30;
3. where the `math` variant with dropout spends its step: `torch.profiler`'s self time;
4. bf16 autocast and fp32 statistics: how far softmax and LayerNorm on bf16 inputs are
   from the same op computed in fp32 and rounded to bf16, and what computing them in fp32
   explicitly would cost.

    python benchmarks/bench_levers.py                       # about 3 minutes on 2 cores
    python benchmarks/bench_levers.py --keep-freed-memory   # see bench_process.py

`--keep-freed-memory` first calls `minibert.machine.memory.keep_freed_memory()`, so that freed
buffers are reused instead of faulted in again on every step (`bench_process.py`).

The numbers in benchmarks/RESULTS.md come from a CPU that multiplies bf16 matrices natively
(its bf16 matmul ceiling was 4.3x its fp32 one). On a CPU without (no AMX, no AVX512-BF16; see
`minibert.machine.precision.cpu_bf16_native`) torch emulates bf16 matmuls, 65x slower than fp32
on an AVX2 CPU: there the bf16 step, its profile and the bf16 matmul rows (attention, Q/K/V) are
skipped with a note, unless `--emulated-bf16` is passed; the fp32 rows and the dropout and
statistics rows, which do no bf16 matmul, still run.

Every variant is a `minibert.fast` model, as the scripts train. The "before" of the dropout
lever puts torch's `nn.Dropout` and the textbook's attention layer back into it (the layer
whose dropout, in the `math` form, is `F.dropout`, and whose `sdpa` is torch's kernel as it
is); nothing else differs between the variants. The "after" keeps the fast model's dropout,
which also trains `sdpa` with dropout through the `math` formula (machine/swap.py).
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import minibert
import minibert.model.attention as A
import minibert.machine.precision
from minibert.machine import environment, kernels, swap
from minibert.model.model import SelfAttention
from minibert.machine.precision import autocast_context
from minibert.machine.memory import keep_freed_memory

OURS = kernels.dropout
CPU = torch.device("cpu")


def runs_bf16(emulated_bf16: bool) -> bool:
    """Whether to time bf16 matmuls: where they are native, or where asked for anyway."""
    return minibert.machine.precision.cpu_bf16_native() or emulated_bf16


def torch_sdpa(q, k, v, bias, p=0.0):
    """torch's kernel as it is, also for CPU training with dropout (its unfused fallback)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 30522, (8, 128), generator=g)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(8, 128, generator=g) < 0.15
    labels[pick] = ids[pick]
    return ids, labels


def ours_math(q, k, v, bias, p=0.0):
    """The fast layer's attention with dropout: the formula, with minibert's CPU mask."""
    return OURS(A.attention_probs(q, k, bias), p) @ v


def build(attention: str, fused: bool, dropout: float = 0.1, ours: bool = True):
    torch.manual_seed(0)
    model = minibert.fast(minibert.BertForMaskedLM(minibert.BertConfig.preset(
        "base", attention=attention, hidden_dropout=dropout, attention_dropout=dropout)))
    model.train()
    if not ours:  # torch's dropout, and its own sdpa, put back
        for m in model.modules():
            if type(m) is swap.Dropout:
                m.__class__ = torch.nn.Dropout
            elif type(m) is swap.FastSelfAttention:
                m.__class__ = SelfAttention
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused,
                            foreach=None if fused else True)
    return model, opt


def step(model, opt, ids, labels) -> None:
    with autocast_context("bf16", CPU):
        loss = model(ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def step_table() -> None:
    variants = [  # label, attention, fused AdamW, minibert's dropout, dropout probability
        ("foreach AdamW, F.dropout, sdpa", "sdpa", False, False, 0.1),
        ("+ fused AdamW", "sdpa", True, False, 0.1),
        ("+ math attention instead of sdpa", "math", True, False, 0.1),
        ("+ cheaper CPU dropout mask", "math", True, True, 0.1),
        ("+ no dropout (the pretraining default)", "math", True, True, 0.0),
    ]
    ids, labels = batch()
    runs = [(label, *build(attention, fused, p, ours), []) for label, attention, fused, ours, p
            in variants]
    for _ in range(8):  # the first round is warm-up
        for _, model, opt, times in runs:
            t0 = time.perf_counter()
            step(model, opt, ids, labels)
            times.append(time.perf_counter() - t0)
    print("| variant (base, 8x128, bf16 autocast, dropout 0.1) | s/step (median of 7) | "
          "tokens/s |")
    print("|---|---|---|")
    for label, _, _, times in runs:
        m = statistics.median(times[1:])
        print(f"| {label} | {m:.3f} | {1024 / m:,.0f} |")


def best_ms(fn, n: int = 30) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


def call_table(bf16_matmuls: bool = True) -> None:
    print("\n| call (forward + backward) | shape, dtype | before (ms) | after (ms) |")
    print("|---|---|---|---|")
    for shape, dtype in (((8, 128, 768), torch.float32), ((8, 12, 128, 128), torch.bfloat16)):
        x = torch.randn(*shape, dtype=dtype, requires_grad=True)
        before = best_ms(lambda: F.dropout(x, 0.1).sum().backward())
        after = best_ms(lambda: OURS(x, 0.1).sum().backward())
        print(f"| dropout: F.dropout → minibert's CPU mask | {shape}, {dtype} | {before:.2f} | "
              f"{after:.2f} |")
    for dtype in (torch.float32, torch.bfloat16) if bf16_matmuls else (torch.float32,):
        q, k, v = (torch.randn(8, 12, 128, 64, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        for p in (0.0, 0.1):
            before = best_ms(lambda: torch_sdpa(q, k, v, None, p).sum().backward())
            after = best_ms(lambda: ours_math(q, k, v, None, p).sum().backward())
            print(f"| attention, dropout {p}: sdpa → math | (8, 12, 128, 64), {dtype} | "
                  f"{before:.2f} | {after:.2f} |")
    x = torch.randn(8, 128, 768, requires_grad=True)
    torch.manual_seed(0)
    fused = torch.nn.Linear(768, 3 * 768)
    split = [torch.nn.Linear(768, 768) for _ in range(3)]

    def projections(layers, precision):
        with autocast_context(precision, CPU):
            outputs = [layer(x) for layer in layers]  # q, k, v: used apart from here on
        sum(y.float().sum() for y in outputs).backward()

    for precision in ("fp32", "bf16") if bf16_matmuls else ("fp32",):
        before = best_ms(lambda: projections(split, precision))
        after = best_ms(lambda: projections([fused], precision))
        print(f"| Q/K/V projection: three matmuls → one fused | (8, 128, 768), {precision} | "
              f"{before:.2f} | {after:.2f} |")


def profile_table() -> None:
    from torch.profiler import ProfilerActivity, profile

    model, opt = build("math", fused=True)
    ids, labels = batch()
    step(model, opt, ids, labels)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(model, opt, ids, labels)
    self_ms = {e.key: e.self_cpu_time_total / 1000 for e in prof.key_averages()}
    total = sum(self_ms.values())
    groups = {
        "matmuls (aten::mm, addmm, bmm)": ("aten::mm", "aten::addmm", "aten::bmm"),
        "autocast casts (aten::copy_)": ("aten::copy_",),
        "dropout (random_, where, bitwise_and, ge)": ("aten::random_", "aten::where",
                                                      "aten::bitwise_and", "aten::ge"),
        "fused AdamW": ("aten::_fused_adamw_",),
        "zero-filled gradients (aten::fill_)": ("aten::fill_",),
    }
    print("\n| where the math variant with dropout spends its step (torch.profiler self "
          "time) | share |")
    print("|---|---|")
    for name, ops in groups.items():
        print(f"| {name} | {sum(self_ms.get(o, 0.0) for o in ops) / total:.0%} |")


def statistics_table() -> None:
    """Softmax and LayerNorm on bf16 inputs against fp32 computation rounded to bf16."""
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(8, 12, 128, 128, generator=g) * 4).to(torch.bfloat16)
    hidden = (torch.randn(8, 128, 768, generator=g) * 3 + 1).to(torch.bfloat16)
    ops = {
        "softmax over keys": (scores, lambda t: torch.softmax(t, dim=-1)),
        "LayerNorm": (hidden, lambda t: F.layer_norm(t, (768,))),
    }
    print("\n| op on a bf16 input | elements differing from fp32-then-rounded | max difference | "
          "bf16 op fwd+bwd (ms) | explicit fp32 op fwd+bwd (ms) |")
    print("|---|---|---|---|---|")
    for name, (t, op) in ops.items():
        ours, reference = op(t), op(t.float()).to(torch.bfloat16)
        differ = (ours != reference).float().mean().item()
        max_diff = (ours.float() - reference.float()).abs().max().item()
        x = t.clone().requires_grad_()
        in_bf16 = best_ms(lambda: op(x).float().sum().backward())
        in_fp32 = best_ms(lambda: op(x.float()).to(torch.bfloat16).float().sum().backward())
        print(f"| {name} {tuple(t.shape)} | {differ:.4%} | {max_diff:.4f} | {in_bf16:.2f} | "
              f"{in_fp32:.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="reuse freed memory instead of returning it to the kernel")
    p.add_argument("--emulated-bf16", action="store_true",
                   help="time bf16 matmuls on a CPU that emulates them (very slow)")
    args = p.parse_args()
    if args.keep_freed_memory and not keep_freed_memory():
        sys.exit("--keep-freed-memory needs glibc's malloc")
    bf16 = runs_bf16(args.emulated_bf16)
    native = minibert.machine.precision.cpu_bf16_native()
    emulated = "" if native else " (bf16 matmuls emulated on this CPU)"
    print(f"CPU: {environment.environment_report('cpu')['device_name']}{emulated}\n")
    if bf16:
        step_table()
    else:
        print("bf16 step, its profile and the bf16 matmul rows skipped: this CPU emulates "
              "bf16 matmuls (no AMX or AVX512-BF16); --emulated-bf16 runs them anyway")
    call_table(bf16_matmuls=bf16)
    if bf16:
        profile_table()
    statistics_table()
