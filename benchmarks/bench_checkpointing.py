"""What gradient checkpointing buys and costs: peak memory and step time of one training step
of a masked LM at T = 512, with `model.gradient_checkpointing_enable()` and without.

Each (preset, mode) runs in a fresh process, with `MALLOC_MMAP_THRESHOLD_=65536` so that what
a step frees leaves the resident set at once and the peak is the step's own (as in
`bench_vs_transformers.py`). A step is forward with 15% of tokens labelled, backward and an
AdamW step, in fp32, dropout on; one step warms up, then the peak is reset and `--steps`
steps are timed (the median is reported). The gradients of the two modes are equal bit for
bit (tests/test_traced.py); this measures only their price.

    python benchmarks/bench_checkpointing.py                      # mini and base, B=4, T=512
    python benchmarks/bench_checkpointing.py --presets mini --steps 5 --batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(preset: str, batch: int, seq_len: int, steps: int, checkpointing: bool) -> dict:
    import torch

    import minibert
    from minibert.machine.memory import peak_memory_mb, reset_peak_memory

    torch.manual_seed(0)
    config = minibert.BertConfig.preset(preset, vocab_size=30522, max_position_embeddings=512)
    model = minibert.fast(minibert.BertForMaskedLM(config)).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, config.vocab_size, (batch, seq_len))
    labels = torch.where(torch.rand(batch, seq_len) < 0.15, ids, -100)

    def step() -> None:
        model(ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's state and every buffer exist after the first
    reset_peak_memory("cpu")
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return {"preset": preset, "batch": batch, "seq_len": seq_len, "checkpointing": checkpointing,
            "step_s": statistics.median(times), "peak_mb": peak_memory_mb("cpu")}


def in_subprocess(preset: str, args: argparse.Namespace, checkpointing: bool) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, __file__, "--one", preset, "--batch", str(args.batch),
           "--seq-len", str(args.seq_len), "--steps", str(args.steps)]
    if checkpointing:
        cmd.append("--on")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["mini", "base"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a single measurement, in this process
    p.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.batch, args.seq_len, args.steps, args.on)))
        return
    rows = []
    print("| preset | B x T | checkpointing | step (s) | peak RSS (MiB) |")
    print("|---|---|---|---|---|")
    for preset in args.presets:
        pair = [in_subprocess(preset, args, on) for on in (False, True)]
        for r in pair:
            print(f"| {preset} | {r['batch']} x {r['seq_len']} | "
                  f"{'on' if r['checkpointing'] else 'off'} | {r['step_s']:.2f} | "
                  f"{r['peak_mb']:.0f} |")
        off, on = pair
        print(f"| {preset} | | on / off | {on['step_s'] / off['step_s']:.2f}x | "
              f"{on['peak_mb'] / off['peak_mb']:.2f}x ({off['peak_mb'] - on['peak_mb']:.0f} "
              f"less) |")
        rows += pair
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
