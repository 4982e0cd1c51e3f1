"""Does whole-word masking change what pretraining reaches in the same number of steps?

Runs `examples/pretrain_wikitext.py` twice with the same settings, once masking single
tokens and once masking whole words (`--whole-word-mask`), and prints the final evaluation of
each. Evaluation always masks single tokens (the script's rule), so the two eval losses are
measured on the same task and compare directly.

    python benchmarks/whole_word_mask.py --data-dir ../shared/data/wikitext-2 \\
        --train-split valid --eval-split test --max-steps 300

Extra arguments after `--` go to both runs unchanged (e.g. `-- --precision fp32`).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "pretrain_wikitext.py"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--train-split", default="valid")
    p.add_argument("--eval-split", default="test")
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path("benchmarks/out/whole_word_mask"))
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    rows = {}
    for name, flags in (("tokens", []), ("whole words", ["--whole-word-mask"])):
        out = args.out / name.replace(" ", "_")
        if not (out / "eval.json").is_file():
            cmd = [sys.executable, str(SCRIPT), "--data-dir", str(args.data_dir),
                   "--train-split", args.train_split, "--eval-split", args.eval_split,
                   "--max-steps", str(args.max_steps), "--eval-batches", str(args.eval_batches),
                   "--out", str(out), "--no-progress", *flags, *extra]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        rows[name] = json.loads((out / "eval.json").read_text())
    print(f"\nCPU: {platform.processor() or platform.machine()}; {args.max_steps} steps")
    print("| masking | steps | precision | eval loss | masked-token accuracy |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['steps']} | {r['precision']} | {r['eval_loss']:.4f} | "
              f"{r['eval_accuracy']:.4f} |")


if __name__ == "__main__":
    main()
