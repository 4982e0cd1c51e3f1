"""When does `torch.compile` pay on this machine? The compile time, and the step time of a
training step compiled against eager, on packed batches and on padded ones.

One step is the main job's: a masked LM forward with 15% of tokens labelled, backward and
an AdamW step, in train mode. `torch.compile(model)` is called as the scripts' `--compile`
calls it (the engine's `_wrap`), with its default backend (inductor).
- packed: every row full, T = `--seq-len`, as the main job's packed batches are;
- padded: rows of random lengths up to `--seq-len`, each batch padded to its longest, as
  fine-tuning's dynamically padded batches are. Eager minibert unpads them; the compiled
  graph keeps the padded layout (minibert.model.model.BertModel.forward says why).
The compile time is the first compiled steps' time (those that compile: the first shape,
and on padded batches the recompile torch makes when it turns the length dynamic) less
the same number of steady compiled steps. The steady step time is the median over
`--steps` steps after them. Eager and compiled run in one process, eager first.

    python benchmarks/bench_compile.py                         # mini, B = 32, T = 128, fp32
    python benchmarks/bench_compile.py --preset base --batch 8 --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def make_batches(n: int, batch: int, seq_len: int, vocab: int, padded: bool) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        lengths = (torch.randint(8, seq_len + 1, (batch,), generator=g) if padded
                   else torch.full((batch,), seq_len))
        T = int(lengths.max())
        ids = torch.randint(5, vocab, (batch, T), generator=g)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        ids = ids * mask
        labels = torch.where((torch.rand(batch, T, generator=g) < 0.15) & mask.bool(), ids,
                             -100)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def step_times(model, opt, data: list[dict]) -> list[float]:
    times = []
    for b in data:
        t = time.perf_counter()
        model(**b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return times


def measure(preset: str, batch: int, seq_len: int, steps: int, padded: bool,
            precision: str) -> dict:
    import minibert

    torch.manual_seed(0)
    config = minibert.BertConfig.preset(preset, vocab_size=30522)
    model = minibert.fast(minibert.BertForMaskedLM(config)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cold = 2 if padded else 1  # the steps that compile
    data = make_batches(cold + steps, batch, seq_len, config.vocab_size, padded)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.autocast("cpu", dtype=dtype, enabled=precision == "bf16"):
        step_times(model, opt, data[:cold])  # eager warm-up
        eager = statistics.median(step_times(model, opt, data[cold:]))
        torch._dynamo.reset()
        compiled = torch.compile(model)
        first = step_times(compiled, opt, data[:cold])
        steady = step_times(compiled, opt, data[cold:])
    med = statistics.median(steady)
    return {"preset": preset, "batches": "padded" if padded else "packed", "eager_s": eager,
            "compiled_s": med, "compile_s": sum(first) - cold * med}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.preset}, "
          f"B = {args.batch}, T <= {args.seq_len}, {args.precision}")
    print("| batches | compile (s) | eager step (s) | compiled step (s) | eager / compiled | "
          "steps to repay the compile |")
    print("|---|---|---|---|---|---|")
    for padded in (False, True):
        r = measure(args.preset, args.batch, args.seq_len, args.steps, padded, args.precision)
        gain = r["eager_s"] - r["compiled_s"]
        repay = f"{r['compile_s'] / gain:.0f}" if gain > 0 else "never"
        print(f"| {r['batches']} | {r['compile_s']:.1f} | {r['eager_s']:.3f} | "
              f"{r['compiled_s']:.3f} | {r['eager_s'] / r['compiled_s']:.2f}x | {repay} |",
              flush=True)


if __name__ == "__main__":
    main()
