"""Does Pre-LN train without warmup, and reach Post-LN's loss sooner? (Xiong et al. 2020)

Xiong et al., "On Layer Normalization in the Transformer Architecture" (ICML 2020), show
that Post-LN BERT needs a learning-rate warmup (and diverged at lr 3e-4 without one), while
Pre-LN trains without warmup and reaches the same validation loss about 40% sooner. This
script checks the claim at small scale: the mini preset pretrained with
`examples/pretrain_wikitext.py`, Post-LN against Pre-LN, with and without warmup, at two
learning rates, every run from the same seed and data.

    python benchmarks/prenorm_vs_postnorm.py                         # 8 runs, ~20 min on 2 cores
    python benchmarks/prenorm_vs_postnorm.py --steps 100 --lrs 1e-3  # a quicker look

Default data: ../shared/data/wikitext-2 with the valid split for training and the test split
for evaluation (the train split is not part of that folder); pass --data-dir and the
splits for a full WikiText download. Writes a table, curves (PNG) and JSON.

The default precision is `auto`: bf16 where the CPU multiplies bf16 natively and faster
than fp32 (the recorded runs: a CPU with AMX), fp32 where it would emulate bf16 matmuls
(65x slower on an AVX2 CPU). The table's header names the precision used.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent / "examples" / "pretrain_wikitext.py"


def run(norm: str, warmup: int, lr: float, args) -> dict:
    name = f"{norm}-warmup{warmup}-lr{lr:g}"
    out = args.out / name
    if not (out / "eval.json").is_file():  # finished runs are reused; delete --out to redo
        cmd = [sys.executable, str(SCRIPT), "--data-dir", str(args.data_dir),
               "--train-split", args.train_split, "--eval-split", args.eval_split,
               "--preset", args.preset, "--norm", norm, "--lr", str(lr),
               "--warmup-steps", str(warmup), "--max-steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--precision", args.precision,
               "--attention", args.attention,
               "--eval-every", str(args.eval_every), "--eval-batches", "10",
               "--log-every", "10", "--save-every", "0", "--seed", str(args.seed),
               "--out", str(out), "--no-progress"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: stopped after non-finite steps (diverged)
            raise RuntimeError(f"{name} failed:\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    final = evals[-1][1] if evals and evals[-1][0] == args.steps else math.nan
    return {"name": name, "norm": norm, "warmup": warmup, "lr": lr, "train": train,
            "eval": evals, "final_eval_loss": final,
            "diverged": not math.isfinite(final) or final > 7.5}


def used_precision(precision: str) -> str:
    """The precision the runs use, as pretrain_wikitext.py resolves it, said plainly."""
    import torch

    from minibert.precision import cpu_bf16_native, resolve_precision

    used = resolve_precision(precision, torch.device("cpu"))
    if used == "bf16" and not cpu_bf16_native():
        return "bf16 (emulated on this CPU: far slower than fp32)"
    if precision == "auto":
        return f"{used} (auto)"
    return used


def steps_to_reach(evals: list, target: float) -> float:
    """The first evaluated step whose loss is at or below target (nan if never)."""
    return next((s for s, loss in evals if loss <= target), math.nan)


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'minibert[examples]')")
        return
    lrs = sorted({r["lr"] for r in results})
    fig, axes = plt.subplots(1, len(lrs), figsize=(6 * len(lrs), 4), squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        for r in (r for r in results if r["lr"] == lr):
            style = "-" if r["norm"] == "pre" else "--"
            ax.plot(*zip(*r["eval"]), style, marker="o", ms=3,
                    label=f"{r['norm']}-LN, warmup {r['warmup']}")
        ax.set_title(f"lr {lr:g}")
        ax.set_xlabel("step")
        ax.set_ylabel("eval MLM loss")
        ax.set_ylim(top=8.5)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=HERE.parent.parent / "shared" / "data"
                   / "wikitext-2")
    p.add_argument("--train-split", default="valid")
    p.add_argument("--eval-split", default="test")
    p.add_argument("--preset", default="mini")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lrs", type=float, nargs="+", default=[5e-4, 2e-3])
    p.add_argument("--warmup", type=int, default=30, help="warmup steps of the warmup runs")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--attention", default="math", help="math is the fastest on a CPU in bf16 "
                   "at 128 tokens (see RESULTS.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "out" / "prenorm")
    args = p.parse_args()
    precision = used_precision(args.precision)

    results = []
    for lr, norm, warmup in itertools.product(args.lrs, ("post", "pre"), (args.warmup, 0)):
        results.append(run(norm, warmup, lr, args))
        print(f"{results[-1]['name']}: final eval loss {results[-1]['final_eval_loss']:.3f}",
              file=sys.stderr)
    # The yardstick: what Post-LN with warmup reaches at the end, at each learning rate.
    print(f"\n{args.preset}, {args.steps} steps of {args.batch_size} x 128, {precision}, "
          f"seed {args.seed}; eval loss on {args.eval_split}\n")
    print("| lr | norm | warmup | final eval loss | steps to reach Post-LN+warmup's final loss |")
    print("|---|---|---|---|---|")
    for lr in args.lrs:
        ref = next(r for r in results if r["lr"] == lr and r["norm"] == "post" and r["warmup"])
        for r in (r for r in results if r["lr"] == lr):
            reach = steps_to_reach(r["eval"], ref["final_eval_loss"])
            reach_txt = "never" if math.isnan(reach) else f"{reach:.0f}"
            loss_txt = "diverged" if r["diverged"] else f"{r['final_eval_loss']:.3f}"
            print(f"| {lr:g} | {r['norm']} | {r['warmup']} | {loss_txt} | {reach_txt} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "prenorm_vs_postnorm.png")


if __name__ == "__main__":
    main()
