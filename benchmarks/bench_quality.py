"""What a CPU-hour of pretraining buys downstream: the main job against transformers' own MLM
recipe and against random weights, judged by GLUE and BLiMP.

Every model has the same shape (the `mini` preset: 4 layers, hidden 256, 4 heads), the same
tokenizer (the one the main job trains on the corpus), the same corpus (the Wikipedia slice,
its `train` split) and the same CPU budget of pretraining:

* `minibert`: `examples/pretrain_wikitext.py --data-dir DATA --time-budget BUDGET`, with the
  main job's defaults; and the same with a fifth of the budget (`minibert-fifth`), which
  tells whether transformers' recipe needs 5x the time to reach the main job's scores;
* `transformers`: `BertForMaskedLM` trained as `bench_time_to_loss.py`'s recipe trains it
  (its MLM collator at 15%, AdamW, linear warmup and decay, clipping at 1.0, dropout 0.1), for
  as many steps as fit the budget at the step time measured here, on the main job's packed
  128-token blocks of the same split, in --hf-precision (fp32; bf16 autocast is its faster
  precision on a CPU with native bf16, as `bench_time_to_loss.py` measures);
* `random`: no pretraining: the GLUE command's `--random-weights` on the main job's folder.

Then each model gets `examples/glue.py` on every task in --glue-dir (3 seeds by default, the
one recipe) and `examples/blimp.py` on --blimp-dir. Each stage is skipped when its output is
there, so an interrupted run goes on where it stopped:

    python benchmarks/bench_quality.py run --budget 1h      # hours: pretraining, then GLUE
    python benchmarks/bench_quality.py report               # the table and quality.png

Pretraining is timed, so run it on a quiet machine; GLUE and BLiMP are not timed. Outputs
under --out (default benchmarks/out/quality): one folder per model and stage, `quality.json`,
`quality.md` and `quality.png` (GLUE and BLiMP against pretraining CPU time).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
SHARED = ROOT.parent / "shared" / "data"
MODELS = ("random", "minibert-fifth", "minibert", "transformers")


def seconds(text: str) -> float:
    """`90s`, `45m`, `1h`, `1.5h` or plain seconds, as --time-budget reads them."""
    from minibert.training.budget import parse_duration
    return parse_duration(text)


def run(cmd: list[str]) -> None:
    print("running", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def pretrain_minibert(args, name: str, budget: float) -> Path:
    """The main job with its defaults for `budget` seconds; its final/ model folder."""
    out = args.out / name
    if not (out / "eval.json").is_file():
        cmd = [sys.executable, ROOT / "examples" / "pretrain_wikitext.py", "--data-dir",
               args.data_dir, "--time-budget", f"{budget:.0f}s", "--out", out, "--no-progress",
               "--cache-dir", args.out / "cache"]
        run(cmd + (["--resume"] if (out / "checkpoints").is_dir() else []))
    return out / "final"


def pretrain_transformers(args, budget: float, tokenizer_folder: Path) -> Path:
    """transformers' recipe for as many steps as fit `budget` at the step time measured
    over 20 steps here; saved as a transformers folder with the main job's tokenizer."""
    folder = args.out / "transformers" / "final"
    if (folder / "config.json").is_file():
        return folder
    import minibert
    from minibert.data import PackedMLMDataset, load_corpus, tokenize_to_memmap
    from bench_time_to_loss import HF_RECIPE, run_transformers

    tok = minibert.Tokenizer.from_pretrained(tokenizer_folder)
    corpus = load_corpus(args.data_dir)
    tokens = tokenize_to_memmap(corpus.splits["train"], tok,
                                args.out / "cache" / f"hf-{tok.fingerprint[:16]}-train.tok")
    blocks = PackedMLMDataset(tokens, 128)
    probe = run_transformers(tok, blocks, [], 25, eval_every=0, precision=args.hf_precision)
    per_step = statistics.median(probe["step_seconds"][5:])
    steps = max(1, int(budget / per_step))
    warmup = max(1, round(steps * HF_RECIPE["warmup"] / HF_RECIPE["steps"]))  # its share
    print(f"transformers: {per_step:.3f} s/step -> {steps} steps in {budget:.0f} s, "
          f"warmup {warmup}", flush=True)
    result = run_transformers(tok, blocks, [], steps, eval_every=0, precision=args.hf_precision,
                              horizon=steps, warmup=warmup, keep_model=True)
    result["model"].save_pretrained(folder)
    tok.save(folder)
    (args.out / "transformers" / "train.json").write_text(json.dumps(
        {k: result[k] for k in ("steps", "train_seconds", "precision")} |
        {"seconds_per_step_probe": per_step}, indent=2))
    return folder


def random_folder(args, like: Path) -> Path:
    """A masked LM of `like`'s config and tokenizer with new weights (seed 0), for BLiMP; GLUE
    draws a new encoder per seed itself (`--random-weights`)."""
    import minibert
    from minibert.interop.hf import config_from_hf, read_config

    folder = args.out / "random" / "final"
    if not (folder / "config.json").is_file():
        minibert.set_seed(0)
        model = minibert.BertForMaskedLM(config_from_hf(read_config(like)))
        model.save_pretrained(folder, tokenizer=minibert.Tokenizer.from_pretrained(like))
    return folder


def glue(args, name: str, model: Path, random_weights: bool = False) -> dict:
    out = args.out / f"glue-{name}"
    if not (out / "results.json").is_file():
        run([sys.executable, ROOT / "examples" / "glue.py", "--init-from", model, "--glue-dir",
             args.glue_dir, "--seeds", str(args.seeds), "--out", out, "--no-progress",
             *(["--random-weights"] if random_weights else []),
             *(["--resume"] if out.is_dir() else [])])
    return json.loads((out / "results.json").read_text())


def blimp(args, name: str, model: Path) -> dict:
    out = args.out / f"blimp-{name}"
    if not (out / "results.json").is_file():
        run([sys.executable, ROOT / "examples" / "blimp.py", "--model", model, "--blimp-dir",
             args.blimp_dir, "--out", out])
    return json.loads((out / "results.json").read_text())


def main_run(args) -> None:
    budget = seconds(args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    folders = {"minibert": pretrain_minibert(args, "minibert", budget),
               "minibert-fifth": pretrain_minibert(args, "minibert-fifth", budget / 5)}
    folders["transformers"] = pretrain_transformers(args, budget, folders["minibert"])
    folders["random"] = random_folder(args, folders["minibert"])
    for name in MODELS:
        # random: a new encoder per seed, of the main job's config, with its tokenizer
        glue(args, name, folders["minibert"] if name == "random" else folders[name],
             random_weights=name == "random")
        if args.blimp_dir:
            blimp(args, name, folders[name])
    print(f"done in {(time.time() - t0) / 3600:.1f} h; now: bench_quality.py report")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["run", "report"])
    p.add_argument("--budget", default="1h", help="pretraining CPU time per model")
    p.add_argument("--data-dir", type=Path, default=SHARED / "enwiki-2015")
    p.add_argument("--glue-dir", type=Path, default=SHARED / "glue")
    p.add_argument("--blimp-dir", type=Path, default=SHARED / "blimp-sample")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--hf-precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.what == "run":
        main_run(args)
    else:
        report(args)


def report(args) -> None:
    """quality.json, quality.md and quality.png from the stages that finished."""
    rows = {}
    for name in MODELS:
        path = args.out / f"glue-{name}" / "results.json"
        if not path.is_file():
            continue
        g = json.loads(path.read_text())
        row = {"glue": g["glue"], "tasks": {t: v["score"] for t, v in g["tasks"].items()}}
        b = args.out / f"blimp-{name}" / "results.json"
        if b.is_file():
            row["blimp"] = json.loads(b.read_text())["overall"]
        row["pretraining_seconds"] = _pretraining_seconds(args.out, name)
        rows[name] = row
    if not rows:
        sys.exit(f"nothing to report in {args.out}: run `bench_quality.py run` first")
    tasks = list(next(iter(rows.values()))["tasks"])
    lines = ["| model | pretraining (CPU min) | " + " | ".join(tasks) + " | GLUE | BLiMP |",
             "|---|---|" + "---|" * (len(tasks) + 2)]
    for name, r in rows.items():
        cells = [f"{r['tasks'][t]['mean']:.1f}" for t in tasks]
        g = r["glue"]
        glue_cell = f"{g['mean']:.1f}" + (f" ± {g['std']:.1f}" if g.get("std") else "")
        blimp_cell = f"{100 * r['blimp']:.1f}" if "blimp" in r else "—"
        lines.append(f"| {name} | {r['pretraining_seconds'] / 60:.0f} | {' | '.join(cells)} | "
                     f"{glue_cell} | {blimp_cell} |")
    table = "\n".join(lines) + "\n"
    (args.out / "quality.md").write_text(table)
    (args.out / "quality.json").write_text(json.dumps(rows, indent=2))
    print(table)
    plot(args.out, rows)


def _pretraining_seconds(out: Path, name: str) -> float:
    """The pretraining's training seconds: 0 for random weights."""
    if name == "random":
        return 0.0
    if name == "transformers":
        return json.loads((out / "transformers" / "train.json").read_text())["train_seconds"]
    return json.loads((out / name / "eval.json").read_text())["train_seconds"]


def plot(out: Path, rows: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, r in rows.items():
        x = r["pretraining_seconds"] / 60
        axes[0].errorbar(x, r["glue"]["mean"], yerr=r["glue"].get("std") or 0, fmt="o",
                         label=name)
        if "blimp" in r:
            axes[1].plot(x, 100 * r["blimp"], "o", label=name)
    for ax, what in zip(axes, ("GLUE score (dev)", "BLiMP accuracy (%)")):
        ax.set_xlabel("pretraining CPU minutes")
        ax.set_ylabel(what)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "quality.png", dpi=110)


if __name__ == "__main__":
    main()
