"""The seeds' table, rebuilt: what each optimization does to memory and time of a BERT step.

The articles minibert grew from claim, for BERT-base on a GPU, that gradient accumulation,
mixed precision and an optimized attention cut memory by 52% and time by 34%. This script
measures the same cumulative rows on whatever device runs it, with the same effective
batch in every row, and adds the optimizations the seeds did not have:

    baseline                      fp32, `math` attention, whole batch at once, dense MLM head,
                                  sentences padded to the fixed length (padding='max_length')
    + gradient accumulation (4)   4 micro-batches of batch/4, exact global-batch loss
    + mixed precision             bf16 autocast (the CPU's choice; fp16 needs a GPU here too)
    + optimized attention         PyTorch's fused `sdpa`
    + sparse MLM prediction       the vocabulary projection only where a token is predicted
    + packing                     full [CLS] ... [SEP] blocks instead of padded sentences
    + torch.compile               (skipped with --no-compile)

A step is forward, backward and a fused AdamW update. Each row runs in fresh processes:
one measures the step's peak memory above the memory in use before it (CUDA allocator, or
the process's resident set on CPU), another the median time of a few steps. tokens/s counts
real (non-padding) tokens, the useful work.

    python benchmarks/bench_train.py --quick       # mini preset, < 5 minutes on 2 CPU cores
    python benchmarks/bench_train.py --device cuda --preset base --batch-size 32

On a CPU without bf16 matrix instructions (no AMX, no AVX512-BF16; see
`minibert.machine.precision.cpu_bf16_native`) torch emulates bf16 matmuls, 65x slower than fp32 on
an AVX2 CPU: there the mixed-precision row is skipped and every row stays fp32, as the
table's header says; `--emulated-bf16` runs it anyway, labelled as emulated.

Prints a markdown table and writes JSON to benchmarks/out/train.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROWS = [  # (label, settings changed from the previous row)
    ("baseline", dict(precision="fp32", attention="math", accumulation=1, sparse=False,
                      packed=False, compile=False)),
    ("+ gradient accumulation (4 steps)", dict(accumulation=4)),
    ("+ mixed precision", dict(precision="bf16")),
    ("+ optimized attention (sdpa)", dict(attention="sdpa")),
    ("+ sparse MLM prediction", dict(sparse=True)),
    ("+ packing instead of padding", dict(packed=True)),
    ("+ torch.compile", dict(compile=True)),
]
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2"


def cumulative_rows(no_compile: bool, skip_bf16: bool = False) -> list[tuple[str, dict]]:
    """(label, settings) of each row; without bf16 the later rows stay fp32."""
    settings, out = {}, []
    for label, change in ROWS:
        if (no_compile and change.get("compile")) or \
                (skip_bf16 and change.get("precision") == "bf16"):
            continue
        settings = {**settings, **change}
        out.append((label, dict(settings)))
    return out


def sentence_lengths(data_dir: Path, seq_len: int, n: int) -> list[int]:
    """Token counts of real text lines, truncated to seq_len: what fixed padding wastes.

    Uses WikiText-2's lines (tokenized with a small WordPiece vocabulary) when the data is
    there; otherwise a fixed spread of lengths, so the script runs anywhere.
    """
    path = data_dir / "valid.txt"
    if path.is_file():
        import minibert

        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()
                 if ln.strip() and not ln.strip().startswith("=")]
        tok = minibert.Tokenizer.train_from_iterator(lines, vocab_size=8192)
        lengths = [min(len(ids), seq_len) for ids in tok.encode_batch(lines[:n])]
    else:
        lengths = [16 + (i * 37) % (seq_len - 16) for i in range(n)]
    return (lengths * (n // len(lengths) + 1))[:n]


def bf16_emulated(device: str) -> bool:
    """True on a CPU that emulates bf16 matmuls (no AMX or AVX512-BF16 instructions)."""
    import torch

    from minibert.machine.precision import cpu_bf16_native

    return torch.device(device).type == "cpu" and not cpu_bf16_native()


def skips_bf16(args) -> bool:
    return bf16_emulated(args.device) and not args.emulated_bf16


def make_batch(batch: int, seq_len: int, vocab: int, lengths: list[int], packed: bool):
    """input_ids, attention_mask, labels of one global batch (15% of real tokens labelled)."""
    import torch

    g = torch.Generator().manual_seed(0)
    real = [seq_len] * batch if packed else lengths[:batch]
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    mask = torch.zeros(batch, seq_len, dtype=torch.long)
    for b, n in enumerate(real):
        ids[b, :n] = torch.randint(5, vocab, (n,), generator=g)
        mask[b, :n] = 1
    labels = torch.full_like(ids, -100)
    pick = (torch.rand(batch, seq_len, generator=g) < 0.15) & mask.bool()
    labels[pick] = ids[pick]
    ids[pick] = 4  # [MASK]
    return ids, mask, labels


def build_step(settings: dict, args):
    """The model and a closure running one optimizer step on the row's global batch."""
    import torch
    import torch.nn.functional as F

    import minibert
    from minibert.machine.precision import autocast_context

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = minibert.BertConfig.preset(args.preset, attention=settings["attention"])
    model = minibert.fast(minibert.BertForMaskedLM(config)).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    runner = torch.compile(model) if settings["compile"] else model
    lengths = sentence_lengths(Path(args.data_dir), args.seq_len, args.batch_size)
    ids, mask, labels = (t.to(device) for t in make_batch(
        args.batch_size, args.seq_len, config.vocab_size, lengths, settings["packed"]))
    n_total = int((labels != -100).sum())
    micro = args.batch_size // settings["accumulation"]

    def step() -> int:
        for b0 in range(0, args.batch_size, micro):
            i, m, y = ids[b0:b0 + micro], mask[b0:b0 + micro], labels[b0:b0 + micro]
            n = int((y != -100).sum())
            with autocast_context(settings["precision"], device):
                if settings["sparse"]:
                    loss = runner(i, m, labels=y).loss
                else:  # dense: logits for every position, as transformers computes them
                    logits = runner(i, m).logits  # (b, T, V)
                    loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(),
                                           y.view(-1), ignore_index=-100)
            (loss * n / n_total).backward()  # exact global-batch mean over predicted tokens
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return int(mask.sum())

    return step


def child(label: str, mode: str, args) -> dict:
    from minibert.machine.memory import current_memory_mb, peak_memory_mb, reset_peak_memory

    settings = dict(cumulative_rows(False, skips_bf16(args)))[label]
    step = build_step(settings, args)
    step()  # warm-up: compilation, optimizer state, torch's one-time allocations
    if mode == "memory":
        reset_peak_memory(args.device)
        base = current_memory_mb(args.device)
        step()
        return {"peak_mb": peak_memory_mb(args.device) - base}
    times, tokens = [], 0
    for _ in range(args.steps):
        t0 = time.perf_counter()
        tokens = step()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {"seconds": seconds, "tokens_per_s": tokens / seconds}


def run_row(label: str, args) -> dict:
    row = {"row": label}
    for mode in ("memory", "time"):
        cmd = [sys.executable, __file__, "--child", label, mode] + args.passthrough
        # memory: a fixed mmap threshold makes freed buffers leave the resident set at once
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536") if mode == "memory" else None
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
            return row
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="mini preset, batch 32, 3 steps")
    p.add_argument("--preset", default="base")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--data-dir", default=str(DEFAULT_DATA))
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--emulated-bf16", action="store_true",
                   help="run the bf16 row on a CPU that emulates bf16 (very slow)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.preset, args.steps = "mini", 3
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args)))
        return
    args.passthrough = ["--preset", args.preset, "--batch-size", str(args.batch_size),
                        "--seq-len", str(args.seq_len), "--steps", str(args.steps),
                        "--device", args.device, "--data-dir", args.data_dir]
    args.passthrough += ["--emulated-bf16"] if args.emulated_bf16 else []
    emulated, skip = bf16_emulated(args.device), skips_bf16(args)
    bf16 = ("native" if not emulated else
            "emulated on this CPU: the bf16 row is skipped and every row is fp32 "
            "(--emulated-bf16 runs it)" if skip else "emulated on this CPU (--emulated-bf16)")
    rows = []
    for label, _ in cumulative_rows(args.no_compile, skip):
        rows.append(run_row(label, args))
        if emulated and label == "+ mixed precision":
            rows[-1]["row"] = f"{label} (bf16 emulated on this CPU)"
        print(f"{label}: {rows[-1]}", file=sys.stderr)
    base = rows[0]
    print(f"\n{args.preset}, global batch {args.batch_size} x {args.seq_len}, {args.device}, "
          f"median of {args.steps} steps; bf16 {bf16}\n")
    print("| step | memory (MB) | vs baseline | time per step (s) | tokens/s | vs baseline |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['row']} | failed: {r['error']} | | | | |")
            continue
        print(f"| {r['row']} | {r['peak_mb']:.0f} | {r['peak_mb'] / base['peak_mb']:.0%} | "
              f"{r['seconds']:.3f} | {r['tokens_per_s']:,.0f} | "
              f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train.json").write_text(json.dumps(
        {"preset": args.preset, "batch_size": args.batch_size, "seq_len": args.seq_len,
         "device": args.device, "bf16": "emulated" if emulated else "native",
         "bf16_skipped": skip, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
