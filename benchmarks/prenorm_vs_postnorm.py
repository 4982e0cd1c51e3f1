"""Does Pre-LN train without warmup, and reach Post-LN's loss sooner? (Xiong et al. 2020)

Xiong et al., "On Layer Normalization in the Transformer Architecture" (ICML 2020), show
that Post-LN BERT needs a learning-rate warmup (and diverged at lr 3e-4 without one), while
Pre-LN trains without warmup and reaches the same validation loss about 40% sooner. This
script checks the claim at small scale: Post-LN against Pre-LN, with and without warmup, at
each learning rate, every run from the same seed and data.

Two ways to choose the model:

* `--preset NAME` (default mini): each run is `examples/pretrain_wikitext.py` in a
  subprocess, exactly what a user would run.
* `--layers N --hidden H` (and `--heads`, `--ffn`): any depth and width, trained in this
  process through the library (the same tokenizer, packing, masking and `engine.train`
  the example wires together). Depth is what makes Post-LN fragile (Xiong et al.'s
  gradient bound at the last layers; Liu et al. 2020, "Understanding the Difficulty of
  Training Transformers"), and a narrow model makes depth cheap. This mode also prints and
  plots each block's gradient norm at step 1 of the freshly initialised model, the
  mechanism both papers describe.

    python benchmarks/prenorm_vs_postnorm.py                         # 8 runs, ~20 min on 2 cores
    python benchmarks/prenorm_vs_postnorm.py --steps 100 --lrs 1e-3  # a quicker look
    python benchmarks/prenorm_vs_postnorm.py --layers 24 --hidden 128 --heads 2 \
        --batch-size 16 --steps 100 --eval-every 25 --precision fp32 \
        --out benchmarks/out/prenorm_deep --figure benchmarks/figures/prenorm_deep.png

Default data: ../shared/data/wikitext-2 with the valid split for training and the test split
for evaluation (the train split is not part of that folder); pass --data-dir and the
splits for a full WikiText download. Writes a table, curves (PNG) and JSON. A run whose
results are already in --out is reused, not redone.

A run that diverges ends with the engine's TrainingError (5 non-finite steps in a row); the
table then says at which step its loss first stopped being finite. The default warmup of
the warmup runs is 10% of --steps.

The default precision is `auto`: bf16 where the CPU multiplies bf16 natively and faster
than fp32 (the recorded runs: a CPU with AMX), fp32 where it would emulate bf16 matmuls
(65x slower on an AVX2 CPU). The table's header names the precision used.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent / "examples" / "pretrain_wikitext.py"
NORMS = ("post", "pre")


# ---- a preset: one subprocess of examples/pretrain_wikitext.py per run -------------------------

def run_preset(norm: str, warmup: int, lr: float, args) -> dict:
    name = f"{norm}-warmup{warmup}-lr{lr:g}"
    out = args.out / name
    if not (out / "eval.json").is_file():  # finished runs are reused; delete --out to redo
        cmd = [sys.executable, str(SCRIPT), "--data-dir", str(args.data_dir),
               "--train-split", args.train_split, "--eval-split", args.eval_split,
               "--preset", args.preset, "--norm", norm, "--lr", str(lr),
               "--warmup-steps", str(warmup), "--max-steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--precision", args.precision,
               "--attention", args.attention,
               "--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches),
               "--log-every", "10", "--save-every", "0", "--seed", str(args.seed),
               "--out", str(out), "--no-progress"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: stopped after non-finite steps (diverged)
            raise RuntimeError(f"{name} failed:\n{done.stderr[-2000:]}")
    return read_run(out / "metrics.jsonl", name, norm, warmup, lr, args.steps)


def read_run(metrics: Path, name: str, norm: str, warmup: int, lr: float, steps: int) -> dict:
    """A run's curves from its metrics.jsonl, and whether (and where) it diverged."""
    rows = [json.loads(line) for line in open(metrics)]  # json reads NaN and Infinity
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    final = evals[-1][1] if evals and evals[-1][0] == steps else math.nan
    # The first logged step whose loss was not finite (exact when every step is logged).
    diverged_at = next((s for s, loss in train if not math.isfinite(loss)), None)
    return {"name": name, "norm": norm, "warmup": warmup, "lr": lr, "train": train,
            "eval": evals, "final_eval_loss": final, "diverged_at": diverged_at,
            "diverged": not math.isfinite(final) or final > 7.5}


# ---- any depth and width: the library in this process ----------------------------------------

def prepare_data(args):
    """(tokenizer, train blocks, eval blocks): the pipeline of pretrain_wikitext.py, cached."""
    import minibert
    from minibert.data import (PackedMLMDataset, TokenFile, TokenFileError, load_corpus,
                               tokenize_to_memmap)

    splits = load_corpus(args.data_dir).splits
    # Cached by the library, keyed by the texts and settings: trained once.
    tok = minibert.Tokenizer.train_from_iterator(splits[args.train_split],
                                                 vocab_size=args.vocab_size)
    sets = []
    for split in (args.train_split, args.eval_split):
        path = args.out / "tokens" / f"{tok.fingerprint[:16]}-{split}.tok"
        try:
            tokens = TokenFile.open(path, tok)
        except (OSError, TokenFileError):  # absent or damaged: tokenize (again)
            path.parent.mkdir(parents=True, exist_ok=True)
            tokens = tokenize_to_memmap(splits[split], tok, path)
        sets.append(PackedMLMDataset(tokens, args.seq_len))
    return tok, sets[0], sets[1]


def model_config(args, tok, norm: str):
    import minibert

    return minibert.BertConfig(
        vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, num_layers=args.layers,
        hidden_size=args.hidden, num_heads=args.heads,
        intermediate_size=args.ffn or 4 * args.hidden, hidden_dropout=args.dropout,
        attention_dropout=args.dropout, norm_position=norm, attention=args.attention)


def run_in_process(norm: str, warmup: int, lr: float, args, data) -> dict:
    """One run through `minibert.training.engine.train`, with the example's optimizer defaults."""
    import minibert
    from minibert.data import MLMCollator
    from minibert.training.engine import TrainConfig, TrainingError, train

    name = f"{norm}-warmup{warmup}-lr{lr:g}"
    out = args.out / name
    if not (out / "done").is_file():  # finished runs are reused; delete --out to redo
        tok, train_set, eval_set = data
        minibert.set_seed(args.seed)
        model = minibert.BertForMaskedLM(model_config(args, tok, norm))
        cfg = TrainConfig(batch_size=args.batch_size, max_steps=args.steps, lr=lr, min_lr=1e-5,
                          warmup=warmup, precision=args.precision, seed=args.seed,
                          log_every=1,  # every step, so a divergence is dated exactly
                          eval_every=args.eval_every, eval_batches=args.eval_batches,
                          progress=False, peak_flops=1e11)  # MFU is not the question here
        minibert.fast(model)  # the CPU kernels, as the scripts train
        try:
            train(model, train_set, MLMCollator(tok, mlm_probability=0.15, seed=args.seed),
                  cfg, out, eval_set=eval_set, overwrite=True)
        except TrainingError as e:  # diverged: the curves up to that point are the result
            print(f"{name}: {e}", file=sys.stderr)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # not needed, and large
        (out / "done").touch()
    return read_run(out / "metrics.jsonl", name, norm, warmup, lr, args.steps)


def step1_grad_norms(norm: str, args, data) -> dict[str, list[float]]:
    """Per block, the gradient norm of the freshly initialised model on the first batch.

    Xiong et al. (their Fig. 3) show that at initialisation Post-LN's gradients are large
    near the output and shrink towards the input, while Pre-LN's are about the same at every
    layer; a large update at the last layers before Adam's statistics settle is what warmup
    protects against. "block" is the norm over all of a block's parameters; "ffn_down" that
    of its second feed-forward weight, the W2 of their figure.
    """
    import minibert
    from minibert.data import MLMCollator
    from minibert.data.sampler import GlobalBatches

    tok, train_set, _ = data
    minibert.set_seed(args.seed)  # the same initial weights as the run
    model = minibert.fast(minibert.BertForMaskedLM(model_config(args, tok, norm))).train()
    _, indices = GlobalBatches(len(train_set), args.batch_size, seed=args.seed).next()
    batch = MLMCollator(tok, mlm_probability=0.15, seed=args.seed)(
        [train_set[i] for i in indices], epoch=0)  # the engine's first batch
    model(**batch).loss.backward()

    def norm_of(params) -> float:
        return math.sqrt(sum(float(p.grad.norm()) ** 2 for p in params if p.grad is not None))

    blocks = model.bert.blocks
    return {"block": [norm_of(b.parameters()) for b in blocks],
            "ffn_down": [norm_of([b.ffn.down.weight]) for b in blocks]}


# ---- reporting --------------------------------------------------------------------------------

def used_precision(precision: str) -> str:
    """The precision the runs use, as pretrain_wikitext.py resolves it, said plainly."""
    import torch

    from minibert.machine.precision import cpu_bf16_native, resolve_precision

    used = resolve_precision(precision, torch.device("cpu"))
    if used == "bf16" and not cpu_bf16_native():
        return "bf16 (emulated on this CPU: far slower than fp32)"
    if precision == "auto":
        return f"{used} (auto)"
    return used


def steps_to_reach(evals: list, target: float) -> float:
    """The first evaluated step whose loss is at or below target (nan if never)."""
    return next((s for s, loss in evals if loss <= target), math.nan)


def print_table(results: list[dict], args) -> None:
    print("| lr | norm | warmup | final eval loss | steps to reach Post-LN+warmup's final loss |")
    print("|---|---|---|---|---|")
    for lr in args.lrs:
        # The yardstick: what Post-LN with warmup reaches at the end, at this learning rate.
        ref = next(r for r in results if r["lr"] == lr and r["norm"] == "post" and r["warmup"])
        for r in (r for r in results if r["lr"] == lr):
            reach = steps_to_reach(r["eval"], ref["final_eval_loss"])
            reach_txt = "never" if math.isnan(reach) else f"{reach:.0f}"
            if r["diverged_at"] is not None:
                loss_txt = f"diverged at step {r['diverged_at']}"
            elif r["diverged"]:
                loss_txt = "diverged" if math.isnan(r["final_eval_loss"]) else \
                    f"{r['final_eval_loss']:.3f} (stalled)"
            else:
                loss_txt = f"{r['final_eval_loss']:.3f}"
            print(f"| {lr:g} | {r['norm']} | {r['warmup']} | {loss_txt} | {reach_txt} |")


def print_grad_norms(grads: dict[str, dict[str, list[float]]]) -> None:
    print("\nGradient norms at step 1 (fresh model, first batch), per block, input to output:\n")
    print("| block | Post-LN, block | Pre-LN, block | Post-LN, FFN W2 | Pre-LN, FFN W2 |")
    print("|---|---|---|---|---|")
    for i in range(len(grads["post"]["block"])):
        print(f"| {i + 1} | {grads['post']['block'][i]:.3g} | {grads['pre']['block'][i]:.3g} "
              f"| {grads['post']['ffn_down'][i]:.3g} | {grads['pre']['ffn_down'][i]:.3g} |")


def plot(results: list[dict], grads: dict | None, path: Path) -> None:
    """One panel of eval-loss curves per learning rate, and the step-1 gradient norms."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'minibert[examples]')")
        return
    lrs = sorted({r["lr"] for r in results})
    panels = len(lrs) + (grads is not None)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        for r in (r for r in results if r["lr"] == lr):
            style = "-" if r["norm"] == "pre" else "--"
            label = f"{r['norm']}-LN, warmup {r['warmup']}"
            if r["diverged_at"] is not None:
                label += f" (diverged at {r['diverged_at']})"
            if r["eval"]:
                ax.plot(*zip(*r["eval"]), style, marker="o", ms=3, label=label)
            else:
                ax.plot([], [], style, label=label)
        ax.set_title(f"lr {lr:g}")
        ax.set_xlabel("step")
        ax.set_ylabel("eval MLM loss")
        ax.set_ylim(top=8.5)
        ax.legend(fontsize=8)
    if grads is not None:
        ax = axes[0][-1]
        for norm in NORMS:
            layers = range(1, len(grads[norm]["block"]) + 1)
            ax.plot(layers, grads[norm]["block"], "-" if norm == "pre" else "--", marker="o",
                    ms=3, label=f"{norm}-LN")
        ax.set_yscale("log")
        ax.set_title("gradient norm per block at step 1")
        ax.set_xlabel("block (1 = next to the embeddings)")
        ax.set_ylabel("norm of the block's parameter gradients")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=HERE.parent.parent / "shared" / "data"
                   / "wikitext-2")
    p.add_argument("--train-split", default="valid")
    p.add_argument("--eval-split", default="test")
    p.add_argument("--preset", default="mini", help="the model, unless --layers/--hidden")
    p.add_argument("--layers", type=int, help="depth; with --hidden, trains in this process")
    p.add_argument("--hidden", type=int, help="width; with --layers, trains in this process")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--ffn", type=int, help="feed-forward width; default 4 * --hidden")
    p.add_argument("--dropout", type=float, default=0.0, help="as pretrain_wikitext.py's "
                   "default from scratch")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lrs", type=float, nargs="+", default=[5e-4, 2e-3])
    p.add_argument("--warmup", type=int, help="warmup steps of the warmup runs; default 10%% "
                   "of --steps")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=10)
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--attention", default="math", help="math is the fastest on a CPU in bf16 "
                   "at 128 tokens (see RESULTS.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "out" / "prenorm")
    p.add_argument("--figure", type=Path, help="default --out/prenorm_vs_postnorm.png")
    args = p.parse_args()
    warmup = args.warmup if args.warmup is not None else round(0.1 * args.steps)
    precision = used_precision(args.precision)
    in_process = args.layers is not None or args.hidden is not None
    if in_process and (args.layers is None or args.hidden is None):
        p.error("--layers and --hidden go together")

    grads, data = None, None
    if in_process:
        data = prepare_data(args)
        grads = {norm: step1_grad_norms(norm, args, data) for norm in NORMS}
    results = []
    for lr, norm, w in itertools.product(args.lrs, NORMS, (warmup, 0)):
        results.append(run_in_process(norm, w, lr, args, data) if in_process
                       else run_preset(norm, w, lr, args))
        print(f"{results[-1]['name']}: final eval loss {results[-1]['final_eval_loss']:.3f}",
              file=sys.stderr)
    model = (f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads, FFN "
             f"{args.ffn or 4 * args.hidden}, dropout {args.dropout:g}" if in_process
             else args.preset)
    print(f"\n{model}; {args.steps} steps of {args.batch_size} x {args.seq_len}, {precision}, "
          f"seed {args.seed}; eval loss on {args.eval_split}\n")
    print_table(results, args)
    if grads is not None:
        print_grad_norms(grads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"runs": results, "step1_grad_norms":
                                                       grads}, indent=1))
    plot(results, grads, args.figure or args.out / "prenorm_vs_postnorm.png")


if __name__ == "__main__":
    main()
