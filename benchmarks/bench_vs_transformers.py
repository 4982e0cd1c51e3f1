"""Is minibert faster than transformers' BERT on the same hardware, and how close to the limit?

For each configuration, both libraries get the same weights (one random transformers
checkpoint, loaded by minibert), the same batch with 15% of tokens labelled, the same
`torch.optim.AdamW` and the same precision context. One training step = forward with labels,
backward, optimizer step, in train mode (dropout on, as configured in the checkpoint).
Steps alternate between the two libraries and the median is reported. Peak memory of a step
is measured in a separate fresh process per library (see `bench_attention.py` for how).

    python benchmarks/bench_vs_transformers.py                  # mini fp32/bf16, base fp32/bf16
    python benchmarks/bench_vs_transformers.py --configs mini --steps 5
    python benchmarks/bench_vs_transformers.py --device cuda --configs base --precisions bf16
    python benchmarks/bench_vs_transformers.py --keep-freed-memory   # both, see below

On a CPU the step time of both libraries depends on the C allocator: by default glibc hands
large freed blocks back to the kernel, and each step then pays page faults to get them
again. `--keep-freed-memory` calls `minibert.machine.memory.keep_freed_memory()` (the example
scripts' `--keep-freed-memory`) before any step, for both libraries alike, since they share
the process. Peak memory is measured the same way with or without it: in processes that run
with `MALLOC_MMAP_THRESHOLD_=65536` and never keep freed memory, so that what a step frees
leaves the resident set at once and the peak is the step's own.

On a CPU without bf16 matrix instructions (no AMX, no AVX512-BF16; see
`minibert.machine.precision.cpu_bf16_native`) torch emulates bf16 matmuls, 65x slower than fp32
on an AVX2 CPU, and a base bf16 step would take minutes: the bf16 rows are skipped there, with a
note, unless `--emulated-bf16` is passed, and then they are labelled "bf16 (emulated)".

Prints the ratio table, MFU against a measured matmul ceiling, and writes JSON. Skips
cleanly (exit 0) when transformers is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {  # name: (preset, batch, seq_len)
    "mini": ("mini", 32, 128),
    "base": ("base", 8, 128),
    "base512": ("base", 4, 512),
}


# The contestants: transformers with its default (SDPA) attention, and minibert with each of
# its two attention backends for short sequences (on CPU in bf16, PyTorch's fused SDPA kernel
# is slower than the plain matmul formula at these lengths: both are reported).
VARIANTS = {"transformers": {}, "minibert-sdpa": {"attention": "sdpa"},
            "minibert-math": {"attention": "math"}}


def bf16_emulated(device: str) -> bool:
    """True on a CPU that emulates bf16 matmuls (no AMX or AVX512-BF16 instructions)."""
    import torch

    import minibert.machine.precision

    return torch.device(device).type == "cpu" and not minibert.machine.precision.cpu_bf16_native()


def kept_precisions(precisions: list[str], device: str, emulated_bf16: bool) -> list[str]:
    """The precisions to run: bf16 is left out where it is emulated, unless asked for."""
    if "bf16" in precisions and bf16_emulated(device) and not emulated_bf16:
        print("bf16 skipped: this CPU emulates bf16 matmuls (no AMX or AVX512-BF16), far "
              "slower than fp32; --emulated-bf16 runs it anyway", file=sys.stderr)
        return [p for p in precisions if p != "bf16"]
    return list(precisions)


def precision_label(precision: str, device: str) -> str:
    return f"{precision} (emulated)" if precision == "bf16" and bf16_emulated(device) \
        else precision


def build(variant: str, ckpt: Path, device: str):
    import torch
    import transformers

    import minibert

    if variant == "transformers":
        model = transformers.BertForMaskedLM.from_pretrained(ckpt, attn_implementation="sdpa")
    else:
        model = minibert.fast(minibert.BertForMaskedLM.from_pretrained(ckpt, **VARIANTS[variant]))
    model.to(device).train()
    # The same optimizer for both: torch's AdamW with its fused kernel, as minibert's engine
    # uses (the update is a fixed cost shared by both libraries).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return model, opt


def make_checkpoint(preset: str, path: Path) -> None:
    import torch
    import transformers

    import minibert

    c = minibert.BertConfig.preset(preset)  # vocab 30522, dropout 0.1: transformers' defaults
    hc = transformers.BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                                 num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                                 intermediate_size=c.intermediate_size)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(hc).save_pretrained(path)


def make_batch(B: int, T: int, vocab: int, device: str, mask_share: float = 0.15):
    """(B, T) ids with `mask_share` of the positions masked and labelled."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(B, T, generator=g) < mask_share
    labels[pick] = ids[pick]
    ids[pick] = 4  # [MASK]
    mask = torch.ones(B, T, dtype=torch.long)
    return {k: v.to(device) for k, v in
            dict(input_ids=ids, attention_mask=mask, labels=labels).items()}


def step_fn(model, opt, batch, precision: str, device: str):
    import torch

    from minibert.machine.precision import autocast_context

    dev = torch.device(device)

    def step():
        with autocast_context(precision, dev):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    return step


def time_variants(name: str, precision: str, args) -> dict:
    """Interleaved steps of every variant in this process; medians and tokens/s."""
    from minibert.machine.meters import flops_per_token

    preset, B, T = CONFIGS[name]
    batch = make_batch(B, T, 30522, args.device)
    steps = {}
    for variant in VARIANTS:
        model, opt = build(variant, Path(args.tmp) / preset, args.device)
        steps[variant] = (model, step_fn(model, opt, batch, precision, args.device))
        for _ in range(args.warmup):
            steps[variant][1]()
    times = {v: [] for v in steps}
    for _ in range(args.steps):
        for variant, (_, step) in steps.items():
            t0 = time.perf_counter()
            step()
            times[variant].append(time.perf_counter() - t0)
    fraction = float((batch["labels"] != -100).float().mean())
    row = {"config": name, "precision": precision, "batch": B, "seq_len": T,
           "flops_per_token": flops_per_token(steps["minibert-sdpa"][0].config, T,
                                              mlm_fraction=fraction)}
    for variant, ts in times.items():
        row[f"{variant}_s"] = statistics.median(ts)
        row[f"{variant}_tokens_per_s"] = B * T / statistics.median(ts)
    return row


def peak_memory(variant: str, name: str, precision: str, args) -> float:
    """Peak memory (MB) of one training step, in a fresh process."""
    cmd = [sys.executable, __file__, "--child-memory", variant, name, precision, "--tmp", args.tmp,
           "--device", args.device]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def child_memory(variant: str, name: str, precision: str, args) -> None:
    from minibert.machine.memory import current_memory_mb, peak_memory_mb, reset_peak_memory

    preset, B, T = CONFIGS[name]
    model, opt = build(variant, Path(args.tmp) / preset, args.device)
    step = step_fn(model, opt, make_batch(B, T, 30522, args.device), precision, args.device)
    step()  # the optimizer state exists from here on, in both libraries alike
    reset_peak_memory(args.device)
    base = current_memory_mb(args.device)
    step()
    print(json.dumps({"peak_mb": peak_memory_mb(args.device) - base}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="+", default=["mini", "base"], choices=list(CONFIGS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="keep freed memory in the process for reuse (both libraries)")
    p.add_argument("--emulated-bf16", action="store_true",
                   help="run bf16 on a CPU that emulates it (very slow)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    p.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-memory", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: nothing to compare against "
              "(pip install 'minibert[test]'). Skipping.")
        return
    if args.child_memory:
        child_memory(*args.child_memory, args)
        return

    from minibert.machine.meters import measure_peak_flops
    from minibert.machine.precision import MATMUL_DTYPES
    from minibert.machine.memory import keep_freed_memory

    if args.keep_freed_memory and not keep_freed_memory():
        raise SystemExit("--keep-freed-memory needs glibc's malloc")
    args.precisions = kept_precisions(args.precisions, args.device, args.emulated_bf16)

    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for preset in {CONFIGS[c][0] for c in args.configs}:
            make_checkpoint(preset, Path(tmp) / preset)
        ceilings = {prec: measure_peak_flops(args.device, MATMUL_DTYPES[prec])
                    for prec in args.precisions}
        rows = []
        for name in args.configs:
            for prec in args.precisions:
                row = time_variants(name, prec, args)
                row["ceiling_flops"] = ceilings[prec]
                row["precision"] = precision_label(prec, args.device)
                row["keep_freed_memory"] = args.keep_freed_memory
                for v in VARIANTS:
                    row[f"{v}_mfu"] = row[f"{v}_tokens_per_s"] * row["flops_per_token"] \
                        / ceilings[prec]
                    if not args.no_memory:
                        row[f"{v}_peak_mb"] = peak_memory(v, name, prec, args)
                rows.append(row)
                print(f"{name} {row['precision']}: " + ", ".join(
                    f"{v} {row[f'{v}_tokens_per_s']:.0f} tok/s" for v in VARIANTS),
                    file=sys.stderr)

    print(f"\none training step (forward, backward, fused AdamW), 15% of tokens labelled, "
          f"median of {args.steps} interleaved steps, on {args.device}, C allocator "
          f"{'keeping freed memory' if args.keep_freed_memory else 'as it comes'}; "
          f"matmul ceilings: "
          + ", ".join(f"{precision_label(k, args.device)} {v / 1e9:.0f} GFLOP/s"
                      for k, v in ceilings.items()) + "\n")
    print("| config | precision | transformers tok/s | minibert sdpa tok/s | minibert math "
          "tok/s | speedup (sdpa / math) | MFU transformers / minibert best | peak MB "
          "transformers / sdpa / math |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["transformers_tokens_per_s"]
        sd, ma = r["minibert-sdpa_tokens_per_s"], r["minibert-math_tokens_per_s"]
        best = max(r["minibert-sdpa_mfu"], r["minibert-math_mfu"])
        mem = " / ".join(f"{r[f'{v}_peak_mb']:.0f}" if f"{v}_peak_mb" in r else "-"
                         for v in VARIANTS)
        print(f"| {r['config']} ({r['batch']}x{r['seq_len']}) | {r['precision']} | {t:,.0f} | "
              f"{sd:,.0f} | {ma:,.0f} | {sd / t:.2f}x / {ma / t:.2f}x | "
              f"{r['transformers_mfu']:.1%} / {best:.1%} | {mem} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vs_transformers.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
