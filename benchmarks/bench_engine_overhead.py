"""What does the training engine cost on top of the bare model step?

The engine adds collation and masking, the global target count, the loss all-reduce,
gradient clipping, the learning-rate schedule, logging and the progress bar. This script
trains the same model on the same batches twice, in one process, alternating:

* bare: a loop of forward (with labels), backward, fused AdamW step on pre-collated batches;
* engine: `minibert.training.engine.train` on the packed dataset, its tokens/s read from
  metrics.jsonl (the number the engine logs), first logging window dropped as warm-up.

    python benchmarks/bench_engine_overhead.py                 # mini, 32 x 128, fp32
    python benchmarks/bench_engine_overhead.py --precision bf16 --steps 60
    python benchmarks/bench_engine_overhead.py --device cuda --preset base --precision bf16 \
        --batch-size 128 --peak-flops 989e12     # MFU against a datasheet peak (H200, dense)

`--profile` then runs the engine once more under cProfile and prints its own functions by
cumulative time, per step: where the host's time goes around the model (cutting a batch,
the step's syncs). `--compile` compiles both, the bare model with `torch.compile` and the
engine through `TrainConfig.compile` (the scripts' `--compile`); the compiling steps fall in
the warm-up.

bf16 on a CPU that emulates bf16 matmuls (no AMX or AVX512-BF16) runs, as asked, but far
slower than fp32; the table's header then says "bf16 (emulated)".

Target: the engine costs < 5% of the bare step's throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import minibert
from minibert.data import MLMCollator, PackedMLMDataset, load_wikitext, tokenize_to_memmap
from minibert.training.distributed import DistContext
from minibert.machine.precision import autocast_context
from minibert.training.engine import TrainConfig, train
from minibert.machine.meters import flops_per_token as minibert_flops
from minibert.machine.meters import measure_peak_flops
from minibert.machine.precision import MATMUL_DTYPES

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2"


def corpus(tmp: Path, seq_len: int):
    if (DATA / "valid.txt").is_file():
        texts = load_wikitext(DATA)["valid"]
    else:  # anywhere else: random words, the step costs the same
        g = torch.Generator().manual_seed(0)
        words = [f"w{i}" for i in range(3000)]
        texts = [" ".join(words[int(i)] for i in torch.randint(0, 3000, (400,), generator=g))
                 for _ in range(400)]
    tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=8192)
    return tok, PackedMLMDataset(tokenize_to_memmap(texts, tok, tmp / "c.tok"), seq_len)


def model_for(tok, preset: str) -> minibert.BertForMaskedLM:
    torch.manual_seed(0)
    return minibert.BertForMaskedLM(minibert.BertConfig.preset(
        preset, vocab_size=tok.vocab_size, hidden_dropout=0.0, attention_dropout=0.0))


def bare_tokens_per_s(model, batches, precision: str, steps: int, device: torch.device,
                      compile: bool) -> float:
    minibert.fast(model.to(device))  # the kernels the scripts swap in, in both loops
    step_model = torch.compile(model) if compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6,
                            fused=True)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    times = []
    warm = 4 if compile else 2  # the first compiled steps compile
    for i in range(steps + warm):
        batch = batches[i % len(batches)]
        t0 = time.perf_counter()
        with autocast_context(precision, device):
            loss = step_model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the kernels are queued; time their running
        times.append(time.perf_counter() - t0)
    tokens = batches[0]["input_ids"].numel()
    return tokens / statistics.median(times[warm:])


def engine_tokens_per_s(model, tok, ds, args, out: Path, peak: float,
                        device: torch.device) -> tuple[float, float]:
    """(tokens/s, MFU), each the median of what the engine logs, the first row dropped."""
    cfg = TrainConfig(batch_size=args.batch_size, max_steps=args.steps, lr=1e-4, warmup=0,
                      precision=args.precision, log_every=args.log_every, progress=False,
                      peak_flops=peak, save_every=0, keep_checkpoints=1,
                      compile=args.compile)
    minibert.fast(model)
    train(model, ds, MLMCollator(tok, seed=0), cfg, out, ctx=DistContext(device=device))
    rows = [json.loads(line) for line in open(out / "metrics.jsonl") if '"loss"' in line]
    return (statistics.median(r["tokens_per_s"] for r in rows[1:]),
            statistics.median(r["mfu"] for r in rows[1:]))


def profile_engine(model, tok, ds, args, out: Path, peak: float, device) -> None:
    """cProfile over one engine run: the engine's own functions, ms per step, cumulative."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    engine_tokens_per_s(model, tok, ds, args, out, peak, device)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = sorted(((cum, f"{Path(file).name}:{name}") for (file, _, name), (_, _, _, cum, _)
                   in stats.items() if "/minibert/" in file), reverse=True)
    print(f"\nengine functions, cumulative ms per step over {args.steps} steps:")
    for cum, name in rows[:15]:
        print(f"  {cum / args.steps * 1000:8.2f}  {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--rounds", type=int, default=2, help="alternations of bare and engine")
    p.add_argument("--log-every", type=int, default=10, help="the engine's logging window")
    p.add_argument("--device", default="cpu")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="the MFU ceiling in FLOP/s (a datasheet number); default: measured")
    p.add_argument("--compile", action="store_true", help="torch.compile the model, both ways")
    p.add_argument("--profile", action="store_true",
                   help="then profile one more engine run: its functions' time per step")
    args = p.parse_args()
    device = torch.device(args.device)
    # One ceiling for both, measured here and handed to the engine (its peak_flops).
    measured = measure_peak_flops(device, MATMUL_DTYPES[args.precision])
    peak = args.peak_flops or measured
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok, ds = corpus(tmp, args.seq_len)
        collate = MLMCollator(tok, seed=0)
        # Eight batches, wrapping round a corpus too small for eight (WikiText's valid
        # split holds 1,273 blocks of 128).
        batches = [collate([ds[(i * args.batch_size + j) % len(ds)]
                            for j in range(args.batch_size)], epoch=0) for i in range(8)]
        bare, engine, engine_mfu = [], [], []
        # The engine's own count: the sparse head on the 15% of tokens it predicts.
        flops_per_token = minibert_flops(model_for(tok, args.preset).config, args.seq_len,
                                         mlm_fraction=0.15)
        for r in range(args.rounds):
            bare.append(bare_tokens_per_s(model_for(tok, args.preset), batches,
                                          args.precision, args.steps, device, args.compile))
            tps, m = engine_tokens_per_s(model_for(tok, args.preset), tok, ds, args,
                                         tmp / f"run{r}", peak, device)
            engine.append(tps)
            engine_mfu.append(m)
            print(f"round {r}: bare {bare[-1]:,.0f} tok/s, engine {engine[-1]:,.0f} tok/s",
                  file=sys.stderr)
        if args.profile:
            profile_engine(model_for(tok, args.preset), tok, ds, args, tmp / "profiled",
                           peak, device)
    b, e = statistics.median(bare), statistics.median(engine)
    from minibert.machine.precision import cpu_bf16_native

    emulated = " (emulated)" if args.precision == "bf16" and device.type == "cpu" and \
        not cpu_bf16_native() else ""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\n{args.preset}, batch {args.batch_size} x {args.seq_len}, {args.precision}"
          f"{emulated}{', compiled' if args.compile else ''}, {where}\n")
    print(f"matmul ceiling measured: {measured / 1e9:,.0f} GFLOP/s" +
          (f"; MFU below is against --peak-flops {peak / 1e9:,.0f} GFLOP/s"
           if args.peak_flops else "") + "\n")
    print("| bare model step tok/s | engine (logged) tok/s | engine overhead | MFU bare / "
          "engine (logged) |")
    print("|---|---|---|---|")
    print(f"| {b:,.0f} | {e:,.0f} | {1 - e / b:.1%} | "
          f"{b * flops_per_token / peak:.1%} / {statistics.median(engine_mfu):.1%} |")


if __name__ == "__main__":
    main()
