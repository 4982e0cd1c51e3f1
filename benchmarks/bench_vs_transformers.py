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


def build(lib: str, preset: str, ckpt: Path, device: str, **overrides):
    import torch
    import transformers

    import minibert

    if lib == "transformers":
        model = transformers.BertForMaskedLM.from_pretrained(ckpt, attn_implementation="sdpa")
    else:
        model = minibert.BertForMaskedLM.from_pretrained(ckpt, **overrides)
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


def make_batch(B: int, T: int, vocab: int, device: str):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(B, T, generator=g) < 0.15
    labels[pick] = ids[pick]
    ids[pick] = 4  # [MASK]
    mask = torch.ones(B, T, dtype=torch.long)
    return {k: v.to(device) for k, v in
            dict(input_ids=ids, attention_mask=mask, labels=labels).items()}


def step_fn(model, opt, batch, precision: str, device: str):
    import torch

    from minibert.engine import autocast_context

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


def time_pair(name: str, precision: str, args) -> dict:
    """Interleaved steps of both libraries in this process; medians and tokens/s."""
    import torch

    from minibert.runtime import flops_per_token

    preset, B, T = CONFIGS[name]
    ckpt = Path(args.tmp) / preset
    batch = make_batch(B, T, 30522, args.device)
    steps = {}
    for lib in ("transformers", "minibert"):
        model, opt = build(lib, preset, ckpt, args.device)
        steps[lib] = (model, step_fn(model, opt, batch, precision, args.device))
        for _ in range(args.warmup):
            steps[lib][1]()
    times = {lib: [] for lib in steps}
    for _ in range(args.steps):
        for lib, (_, step) in steps.items():
            t0 = time.perf_counter()
            step()
            times[lib].append(time.perf_counter() - t0)
    config = steps["minibert"][0].config
    fraction = float((batch["labels"] != -100).float().mean())
    row = {"config": name, "precision": precision, "batch": B, "seq_len": T,
           "flops_per_token": flops_per_token(config, T, mlm_fraction=fraction)}
    for lib, ts in times.items():
        row[f"{lib}_s"] = statistics.median(ts)
        row[f"{lib}_tokens_per_s"] = B * T / statistics.median(ts)
    row["speedup"] = row["transformers_s"] / row["minibert_s"]
    del steps
    torch.set_grad_enabled(True)
    return row


def peak_memory(lib: str, name: str, precision: str, args) -> float:
    """Peak memory (MB) of one training step, in a fresh process."""
    cmd = [sys.executable, __file__, "--child-memory", lib, name, precision, "--tmp", args.tmp,
           "--device", args.device]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def child_memory(lib: str, name: str, precision: str, args) -> None:
    import torch

    from minibert.runtime import current_memory_mb, peak_memory_mb, reset_peak_memory

    preset, B, T = CONFIGS[name]
    model, opt = build(lib, preset, Path(args.tmp) / preset, args.device)
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

    import torch

    from minibert.runtime import measure_peak_flops

    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for preset in {CONFIGS[c][0] for c in args.configs}:
            make_checkpoint(preset, Path(tmp) / preset)
        ceilings = {prec: measure_peak_flops(args.device, torch.bfloat16 if prec == "bf16"
                                             else torch.float32) for prec in args.precisions}
        rows = []
        for name in args.configs:
            for prec in args.precisions:
                row = time_pair(name, prec, args)
                row["ceiling_flops"] = ceilings[prec]
                row["minibert_mfu"] = row["minibert_tokens_per_s"] * row["flops_per_token"] \
                    / ceilings[prec]
                row["transformers_mfu"] = row["transformers_tokens_per_s"] * \
                    row["flops_per_token"] / ceilings[prec]
                if not args.no_memory:
                    for lib in ("transformers", "minibert"):
                        row[f"{lib}_peak_mb"] = peak_memory(lib, name, prec, args)
                rows.append(row)
                print(f"{name} {prec}: {row['speedup']:.2f}x", file=sys.stderr)

    print(f"\none training step (forward, backward, AdamW), 15% of tokens labelled, "
          f"median of {args.steps}, on {args.device}; ceilings: "
          + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in ceilings.items()) + "\n")
    print("| config | precision | transformers tok/s | minibert tok/s | speedup | "
          "transformers MFU | minibert MFU | transformers MB | minibert MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mem = [f"{r[k]:.0f}" if k in r else "-" for k in
               ("transformers_peak_mb", "minibert_peak_mb")]
        print(f"| {r['config']} ({r['batch']}x{r['seq_len']}) | {r['precision']} | "
              f"{r['transformers_tokens_per_s']:,.0f} | {r['minibert_tokens_per_s']:,.0f} | "
              f"{r['speedup']:.2f}x | {r['transformers_mfu']:.1%} | {r['minibert_mfu']:.1%} | "
              f"{mem[0]} | {mem[1]} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vs_transformers.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
