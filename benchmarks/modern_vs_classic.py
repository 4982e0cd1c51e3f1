"""Classic BERT against ModernBERT's switches, side by side on WikiText-2: same data, same
recipe, about the same number of parameters, the eval loss against training time.

Runs the main job (`examples/pretrain_wikitext.py`, its defaults) once per preset, one after
the other, evaluating every `--eval-every` steps, and prints each run's parameters, tokens/s
and test loss against `train_seconds` (time in training steps only), then the loss each
reaches within the time the faster run took, read off its curve by linear interpolation.

    python benchmarks/modern_vs_classic.py --data-dir ../shared/data/wikitext-2
    python benchmarks/modern_vs_classic.py --data-dir DIR --presets mini modernbert-mini \\
        --max-steps 600 --eval-every 100

`modernbert-mini` keeps mini's 4 layers, 256 hidden and 4 heads; its GeGLU width (704, 8/3 of
the hidden size) and the missing position table and biases leave it with 1.4% fewer
parameters than mini at a vocabulary of 8,192.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(preset: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "examples" / "pretrain_wikitext.py"), "--data-dir",
           str(args.data_dir), "--train-split", "valid", "--eval-split", "test",
           "--preset", preset, "--max-steps", str(args.max_steps), "--eval-every",
           str(args.eval_every), "--eval-batches", str(args.eval_batches), "--out",
           str(out / preset), "--no-progress", *args.extra]
    print(" ".join(cmd[1:]), file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{preset} failed: {done.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(out / preset / "metrics.jsonl")]
    config = json.loads((out / preset / "final" / "config.json").read_text())
    import minibert  # after the run: the parent does no torch work while it trains

    model = minibert.BertForMaskedLM.from_pretrained(out / preset / "final")
    return {"preset": preset, "params": sum(p.numel() for p in model.parameters()),
            "model_type": config["model_type"],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows if "loss" in r),
            "curve": [(r["train_seconds"], r["eval_loss"]) for r in rows if "eval_loss" in r]}


def loss_at(curve: list[tuple[float, float]], seconds: float) -> float:
    """The eval loss at `seconds` of training, interpolated between evaluations."""
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if t0 <= seconds <= t1:
            return l0 + (l1 - l0) * (seconds - t0) / (t1 - t0)
    return curve[-1][1] if seconds >= curve[-1][0] else curve[0][1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--presets", nargs="+", default=["mini", "modernbert-mini"])
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--out", type=Path)
    p.add_argument("extra", nargs="*", help="more flags for the main job, after --")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="minibert-modern-"))
    results = [run(preset, args, out) for preset in args.presets]
    print(f"\n{args.max_steps} steps each, eval every {args.eval_every}\n")
    print("| preset | model_type | parameters | tokens/s | eval loss by train_seconds |")
    print("|---|---|---|---|---|")
    for r in results:
        curve = ", ".join(f"{loss:.3f} @ {t:.0f} s" for t, loss in r["curve"])
        print(f"| {r['preset']} | {r['model_type']} | {r['params'] / 1e6:.2f}M | "
              f"{r['tokens_per_s']:,.0f} | {curve} |")
    budget = min(r["curve"][-1][0] for r in results)
    print(f"\nat {budget:.0f} s of training (the shorter run's end): " + ", ".join(
        f"{r['preset']} {loss_at(r['curve'], budget):.3f}" for r in results))
    (out / "modern_vs_classic.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
