"""How long until a model is as good as transformers' recipe makes it: minibert against
transformers, eval loss against training time, on the same data.

Both train on WikiText-2's `valid` split and are evaluated on the whole `test` split, through
one tokenizer (WordPiece, 8,192 tokens, trained on `valid` exactly as the main job trains
it) and the same packed 128-token blocks. The evaluation batches are the same for both:
the main job's own (`MLMCollator`, 15%, seed 0), so the two losses are measured on the same
masked tokens.

* transformers: `BertForMaskedLM` (4 layers, hidden 256, 4 heads, FFN 1024, Post-LN, dropout
  0.1) with `DataCollatorForLanguageModeling` at 15%, fused AdamW (0.9, 0.98, eps 1e-6,
  weight decay 0.01 except biases and LayerNorm, as `Trainer` does), lr 5e-4 with 100 warmup
  steps then linear decay, gradients clipped at 1.0 (`Trainer`'s default), batch 32 x 128,
  1500 steps, in its faster precision on the machine at hand: fp32, or bf16 autocast
  (`--precision auto` times a few steps of each and takes the faster; both are recorded).
  Its final test loss is the target.
* minibert: `examples/pretrain_wikitext.py` with its own defaults (plus any flags given).

Training time excludes evaluation for both: transformers' loop times its steps only, and
the main job logs `train_seconds`, the same measure. The step at which a run reaches the
target is interpolated linearly between the two evaluations around the crossing.

A step's cost depends only on its batch and sequence length, so the loss curves are taken
from full runs (which may share the machine) and every contestant's steps are timed in one
quiet window, side by side, by `report`. A run with a sequence-length warmup (the main
job's default) is timed through its warmup and beyond, and the median cost of each length
is summed up to the step where it reaches the target:

    # 1. transformers' whole recipe, once, in its faster precision here (25 - 40 min on 2
    #    quiet cores): curve and target
    python benchmarks/bench_time_to_loss.py transformers
    # 2. minibert's main job (its defaults), evaluated every 100 steps; or with other flags
    python benchmarks/bench_time_to_loss.py minibert --name defaults
    python benchmarks/bench_time_to_loss.py minibert --name b16 -- --batch-size 16
    # 3. time 40 steps of each now, print the table, draw time_to_loss.png
    python benchmarks/bench_time_to_loss.py report --timed-steps 40

`report` times transformers' steps in both precisions, prints both, and compares against
the faster (and says so if that is not the precision its curve ran in). It also prints the
full transformers run's own measured time beside the extrapolation, the check that the
extrapolation holds when that run had the machine to itself. The main job keeps freed
memory for reuse on a CPU by default (glibc's allocator,
`minibert.machine.memory.keep_freed_memory`), and transformers' loop does not; so `report` then
times transformers again with the same setting, and adds the ratio against that as a last
column. Each of transformers' timings runs in a fresh process (`hf-step`), so none starts
with the caches another left warm. Everything goes under `--out` (default
`benchmarks/out/time_to_loss`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "wikitext-2"
SEQ_LEN, BATCH, VOCAB = 128, 32, 8192
HF_RECIPE = dict(steps=1500, lr=5e-4, warmup=100, betas=(0.9, 0.98), eps=1e-6,
                 weight_decay=0.01, dropout=0.1, mlm_probability=0.15, max_grad_norm=1.0)


def prepare(data_dir: Path, cache: Path):
    """(tokenizer, train blocks, eval batches): what the main job builds from `data_dir` with
    `--train-split valid --eval-split test`, the same tokenizer cache and seed 0."""
    import minibert
    from minibert.data import MLMCollator, PackedMLMDataset, load_corpus, tokenize_to_memmap
    from minibert.training.engine import TrainConfig
    from minibert.training.evaluation import eval_batches

    splits = load_corpus(data_dir).splits
    tok = minibert.Tokenizer.train_from_iterator(splits["valid"], vocab_size=VOCAB,
                                                 cache_dir=cache)
    sets = {}
    for s in ("valid", "test"):
        path = cache / "bench_tokens" / f"{tok.fingerprint[:16]}-{s}.tok"
        tokens = tokenize_to_memmap(splits[s], tok, path)
        sets[s] = PackedMLMDataset(tokens, SEQ_LEN)
    cfg = TrainConfig(batch_size=BATCH, max_steps=1, eval_batches=10**6)
    evals = list(eval_batches(sets["test"], MLMCollator(tok, mlm_probability=0.15, seed=0), cfg))
    return tok, sets["valid"], evals


# ---- transformers ---------------------------------------------------------------------------

def hf_model_and_collator(tok):
    import torch
    import transformers

    hc = transformers.BertConfig(
        vocab_size=tok.vocab_size, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, hidden_dropout_prob=HF_RECIPE["dropout"],
        attention_probs_dropout_prob=HF_RECIPE["dropout"], pad_token_id=tok.pad_id)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(hc)
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok.backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]")
    collator = transformers.DataCollatorForLanguageModeling(
        hf_tok, mlm_probability=HF_RECIPE["mlm_probability"], return_tensors="pt")
    return model, collator


def hf_optimizer(model, steps: int, warmup: int = HF_RECIPE["warmup"]):
    import torch
    import transformers

    decay = [p for n, p in model.named_parameters() if "bias" not in n and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HF_RECIPE["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=HF_RECIPE["lr"],
                            betas=HF_RECIPE["betas"], eps=HF_RECIPE["eps"], fused=True)
    sched = transformers.get_linear_schedule_with_warmup(opt, warmup, steps)
    return opt, sched


def hf_autocast(precision: str):
    """transformers' loop in `precision`: bf16 is `torch.autocast`, as `Trainer(bf16=True)`."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def hf_evaluate(model, batches, precision: str) -> float:
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), hf_autocast(precision):
        for b in batches:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                           token_type_ids=b["token_type_ids"]).logits
            pick = b["labels"] != -100
            total += float(F.cross_entropy(logits[pick].float(), b["labels"][pick],
                                           reduction="sum"))
            count += int(pick.sum())
    model.train()
    return total / count


def run_transformers(tok, train_set, evals, steps: int, eval_every: int, precision: str,
                     horizon: int = HF_RECIPE["steps"], warmup: int = HF_RECIPE["warmup"],
                     keep_model: bool = False, checkpoint: Path | None = None,
                     save_every: int = 0) -> dict:
    """Train with transformers' recipe for `steps` steps of a `horizon`-step schedule in
    `precision` (fp32 or bf16 autocast); evaluate every `eval_every` steps (0: never).
    Returns the curve and the step times, and with `keep_model` the trained `model`.

    With `checkpoint`, the whole state (weights, AdamW, schedule, the data order, torch's
    generator that draws the masks and the dropout) is saved there every `save_every` steps
    and at the end, and a run that finds one goes on from it: its weights are those of a run
    never stopped, so a pretraining longer than one sitting can be done in several."""
    import torch

    model, collator = hf_model_and_collator(tok)
    opt, sched = hf_optimizer(model, horizon, warmup)
    g = torch.Generator().manual_seed(0)
    order: list[int] = []
    curve, step_seconds, trained = [], [], 0.0
    done = 0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        g.set_state(state["order_generator"])
        torch.set_rng_state(state["torch_rng"])
        order, curve, step_seconds = state["order"], state["curve"], state["step_seconds"]
        done, trained = state["step"], state["train_seconds"]
        print(f"transformers: going on from step {done} ({checkpoint})", flush=True)

    def save(step: int) -> None:
        tmp = checkpoint.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "schedule": sched.state_dict(), "order_generator": g.get_state(),
                    "torch_rng": torch.get_rng_state(), "order": order, "curve": curve,
                    "step_seconds": step_seconds, "step": step, "train_seconds": trained},
                   tmp)
        os.replace(tmp, checkpoint)  # a stop while saving leaves the last checkpoint whole

    model.train()
    for step in range(done + 1, steps + 1):
        t0 = time.perf_counter()
        if len(order) < BATCH:  # a fresh shuffle of the blocks each epoch
            order = torch.randperm(len(train_set), generator=g).tolist()
        idx, order = order[:BATCH], order[BATCH:]
        batch = collator([{"input_ids": train_set[i]["input_ids"].tolist()} for i in idx])
        with hf_autocast(precision):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), HF_RECIPE["max_grad_norm"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step_seconds.append(time.perf_counter() - t0)
        trained += step_seconds[-1]
        if eval_every and (step % eval_every == 0 or step == steps):
            curve.append({"step": step, "train_seconds": round(trained, 2),
                          "eval_loss": round(hf_evaluate(model, evals, precision), 4)})
            print(f"transformers step {step}: eval loss {curve[-1]['eval_loss']:.4f}, "
                  f"{trained:.0f} s of training", flush=True)
        if checkpoint is not None and (step == steps or save_every and step % save_every == 0):
            save(step)
    return {"curve": curve, "step_seconds": step_seconds, "steps": steps,
            "train_seconds": round(trained, 2), "precision": precision,
            **({"model": model} if keep_model else {})}


def hf_step_seconds(data_dir: Path, out: Path, steps: int, precision: str,
                    keep_freed: bool = False) -> float | None:
    """transformers' seconds per step in `precision` now: the median after 5 warm-up steps.

    Each timing runs in a fresh process (`hf-step`), so none inherits another's warm
    caches (oneDNN's kernels, the allocator's heap) or its allocator setting; `keep_freed`
    times it with freed memory kept for reuse, as the main job does on a CPU (None where
    the allocator cannot be told to)."""
    cmd = [sys.executable, __file__, "hf-step", "--data-dir", str(data_dir), "--out", str(out),
           "--timed-steps", str(steps), "--precision", precision]
    result = subprocess.run(cmd + (["--keep-freed-memory"] if keep_freed else []),
                            capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stderr[-2000:]}")
    last = result.stdout.split()[-1]
    return None if last == "none" else float(last)


def hf_step_child(data_dir: Path, out: Path, steps: int, precision: str,
                  keep_freed: bool) -> None:
    """`hf-step`: print transformers' median seconds per step, or "none" when freed memory
    was asked to be kept and this allocator cannot keep it."""
    from minibert.machine.memory import keep_freed_memory

    if keep_freed and not keep_freed_memory():
        print("none")
        return
    tok, train_set, evals = prepare(data_dir, out / "cache")
    timed = run_transformers(tok, train_set, evals, steps, eval_every=0, precision=precision)
    print(statistics.median(timed["step_seconds"][5:]))


def hf_faster_precision(data_dir: Path, out: Path, steps: int) -> tuple[str, dict]:
    """The precision in which transformers' steps are faster on this machine, and the
    seconds per step of each (bf16 is far slower than fp32 where a CPU emulates it)."""
    seconds = {p: hf_step_seconds(data_dir, out, steps, p) for p in ("fp32", "bf16")}
    return min(seconds, key=seconds.get), seconds


# ---- minibert ---------------------------------------------------------------------------------

def run_minibert(data_dir: Path, cache: Path, out: Path, extra: list[str],
                 eval_every: int) -> dict:
    """The main job as a user runs it, evaluated on the whole test split every `eval_every`."""
    cmd = [sys.executable, str(ROOT / "examples" / "pretrain_wikitext.py"),
           "--data-dir", str(data_dir), "--cache-dir", str(cache), "--out", str(out),
           "--train-split", "valid", "--eval-split", "test", "--eval-every", str(eval_every),
           "--eval-batches", "1000000", "--save-every", "0", "--log-every", "50",
           "--no-progress", *extra]
    print("running", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    curve = [{"step": r["step"], "train_seconds": r["train_seconds"],
              "eval_loss": round(r["eval_loss"], 4)} for r in rows if "eval_loss" in r]
    tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return {"curve": curve, "args": extra, "tokens_per_s_median": sorted(tps)[len(tps) // 2],
            "steps": curve[-1]["step"], "train_seconds": curve[-1]["train_seconds"]}


# ---- the comparison ---------------------------------------------------------------------------

def time_to(curve: list[dict], target: float, key: str = "train_seconds") -> float | None:
    """`key` at which the eval loss first reaches `target`, linear between evaluations."""
    prev = {"step": 0, "train_seconds": 0.0, "eval_loss": math.inf}
    for point in curve:
        if point["eval_loss"] <= target:
            if math.isinf(prev["eval_loss"]):
                return point[key]
            frac = (prev["eval_loss"] - target) / (prev["eval_loss"] - point["eval_loss"])
            return prev[key] + frac * (point[key] - prev[key])
        prev = point
    return None


def cpu_model() -> str:
    from minibert.machine.environment import environment_report

    import torch

    report = environment_report(torch.device("cpu"))
    return (f"{report['device_name']}, {report['cpu_capability']}, bf16 native: "
            f"{report['bf16_native']}, {report['torch_threads']} threads")


def run_schedule(run_dir: Path, steps: int) -> tuple[int, int, int]:
    """(sequence-length warmup steps, its start length, the schedule's horizon) of a finished
    run of the main job, read from its last checkpoint. A run from before the warmup existed
    has none; without its folder, its horizon is taken to be its `steps`."""
    from minibert.training.checkpoint import latest_checkpoint, load_checkpoint
    from minibert.training.optim import resolve_warmup

    last = latest_checkpoint(run_dir / "checkpoints") if run_dir.is_dir() else None
    if last is None:
        return 0, 32, steps
    saved = load_checkpoint(last)["train_config"]
    horizon = saved["decay_steps"]
    return (resolve_warmup(saved.get("seq_len_warmup", 0), horizon),
            saved.get("seq_len_start", 32), horizon)


class StepCost:
    """Seconds per step of the main job with `args`, timed now: the median of each sequence
    length its steps run at (a sequence-length warmup makes early steps shorter, and
    cheaper), so that `seconds_to(step)` sums what each step costs."""

    def __init__(self, data_dir: Path, cache: Path, run: dict, run_dir: Path,
                 timed_steps: int):
        import shutil
        import tempfile

        from minibert.data.seq_warmup import seq_len_at

        args = run["args"]
        self.warmup, start, horizon = run_schedule(run_dir, run["steps"])
        self.length = lambda step: seq_len_at(step, SEQ_LEN, start, self.warmup)
        steps = self.warmup + timed_steps
        out = Path(tempfile.mkdtemp(prefix="timed-"))
        try:
            cmd = [sys.executable, str(ROOT / "examples" / "pretrain_wikitext.py"),
                   "--data-dir", str(data_dir), "--cache-dir", str(cache), "--out",
                   str(out / "run"), "--train-split", "valid", "--eval-split", "test",
                   "--eval-batches", "1", "--save-every", "0", "--log-every", "1",
                   "--no-progress", *args, "--max-steps", str(steps),
                   # the run's own warmup, whatever the main job's default is now
                   "--seq-len-warmup", str(self.warmup), "--seq-len-start", str(start)]
            if "--decay-steps" not in args:
                cmd += ["--decay-steps", str(horizon)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            rows = [json.loads(line) for line in open(out / "run" / "metrics.jsonl")]
        finally:
            shutil.rmtree(out, ignore_errors=True)
        clock = [0.0] + [r["train_seconds"] for r in rows if "loss" in r]
        by_length: dict[int, list[float]] = {}
        for step in range(6, len(clock)):  # the first 5 steps warm the process up
            by_length.setdefault(self.length(step), []).append(clock[step] - clock[step - 1])
        self.cost = {n: statistics.median(t) for n, t in by_length.items()}
        self.peak_mb = max(r["peak_mem_mb"] for r in rows if "peak_mem_mb" in r)
        self.full = self.cost[SEQ_LEN]  # seconds per step once blocks are whole

    def seconds_to(self, step: float) -> float:
        """Training seconds to reach `step` (fractional: linear within the last step)."""
        whole = int(step)
        early = sum(self.cost.get(self.length(s), self.full) for s in range(1, whole + 1))
        return early + (step - whole) * self.cost.get(self.length(whole + 1), self.full)


def report(out: Path, data_dir: Path, timed_steps: int) -> None:
    """The table: for each minibert run, the step at which it reaches transformers' final
    loss, and the time that takes, against transformers' time for its 1500 steps. Times
    are taken now, side by side: `timed_steps` steps of each (0: the runs' own times)."""
    full = json.loads((out / "transformers.json").read_text())
    target = full["curve"][-1]["eval_loss"]
    lines = [f"target: transformers' final test loss {target:.4f} after {full['steps']} steps",
             f"CPU: {cpu_model()}"]
    hf_time = full["train_seconds"]
    hf_step = hf_time / full["steps"]  # seconds per step
    clocks = {"transformers": lambda s: s * hf_step}  # step -> training seconds, per run
    best = full.get("precision", "fp32")
    lines.append(f"transformers' curve ran in {best}")
    if timed_steps:
        best, seconds = hf_faster_precision(data_dir, out, timed_steps)
        now = seconds[best]
        hf_time = now * full["steps"]
        clocks["transformers"] = lambda s: s * now
        lines.append(f"transformers: fp32 {seconds['fp32']:.3f} s/step, bf16 autocast "
                     f"{seconds['bf16']:.3f} s/step now (medians of {timed_steps - 5} steps); "
                     f"the faster, {best}: x {full['steps']} steps = {hf_time / 60:.1f} min; its "
                     f"full run in {full.get('precision', 'fp32')} measured "
                     f"{full['train_seconds'] / 60:.1f} min")
        if best != full.get("precision", "fp32"):
            lines.append(f"note: the curve ran in {full.get('precision', 'fp32')}, but {best} "
                         "is faster now; rerun `transformers --precision auto` for its curve")
    rows, reached, peaks = [], {}, {}
    for path in sorted(out.glob("minibert-*.json")):
        run = json.loads(path.read_text())
        name, flags = path.stem.removeprefix("minibert-"), " ".join(run["args"]) or "(defaults)"
        at_step = time_to(run["curve"], target, key="step")
        if at_step is None:
            rows.append((name, f"| {name} | {flags} | not reached: "
                         f"{run['curve'][-1]['eval_loss']:.4f} at step {run['steps']} | | | | |"))
            continue
        if timed_steps:
            cost = StepCost(data_dir, out / "cache", run, out / f"run-{name}", timed_steps)
            clocks[name], step_s = cost.seconds_to, cost.full
            peaks[name] = f"{cost.peak_mb:,.0f}"
        else:  # the run's own mean time per step
            step_s = run["train_seconds"] / run["steps"]
            clocks[name] = lambda s, per=step_s: s * per
        reached[name] = clocks[name](at_step)
        rows.append((name, f"| {name} | {flags} | step {at_step:.0f} | {step_s:.3f} | "
                     f"{peaks.get(name, '')} | {reached[name] / 60:.2f} min | "
                     f"**{hf_time / reached[name]:.2f}x** |"))
    header = ("| run | main-job flags | reaches the target at | s/step now (whole blocks) | "
              "peak RSS of the timed steps (MB) | time to the target | sooner than "
              "transformers |")
    if timed_steps:
        # The main job keeps freed memory by default on a CPU (glibc mallopt), which spares
        # its steps the page faults of re-mapping large blocks; transformers' loop does not.
        kept = hf_step_seconds(data_dir, out, timed_steps, best, keep_freed=True)
        if kept is not None:
            lines.append(f"transformers in {best} keeping freed memory too: {kept:.3f} s/step "
                         "now")
            header += " the same, transformers keeping freed memory too |"
            rows = [(n, r + (f" {kept * full['steps'] / reached[n]:.2f}x |" if n in reached
                             else " |")) for n, r in rows]
    table = [header, "|" + "---|" * (header.count("|") - 1)] + [r for _, r in rows]
    print("\n".join(lines + table))
    (out / "report.md").write_text("\n".join(lines + [""] + table) + "\n")
    plot(out, full, target, clocks)


def plot(out: Path, full: dict, target: float, clocks: dict) -> None:
    """Eval loss against training time, each run's steps timed now (`clocks`)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    plt.figure(figsize=(7, 4.5))
    c = full["curve"]
    plt.plot([clocks["transformers"](p["step"]) / 60 for p in c],
             [p["eval_loss"] for p in c], "k.-",
             label=f"transformers (its recipe, {full.get('precision', 'fp32')})")
    for path in sorted(out.glob("minibert-*.json")):
        name, c = path.stem.removeprefix("minibert-"), json.loads(path.read_text())["curve"]
        if name in clocks:
            plt.plot([clocks[name](p["step"]) / 60 for p in c], [p["eval_loss"] for p in c],
                     ".-", label=f"minibert {name}")
    plt.axhline(target, color="grey", lw=0.8, ls="--")
    plt.ylim(top=min(8.0, plt.ylim()[1]))
    plt.xlabel("training time, minutes (evaluation excluded)")
    plt.ylabel("MLM loss on WikiText-2 test")
    plt.legend(fontsize=8)
    plt.tight_layout()
    plt.savefig(out / "time_to_loss.png", dpi=110)
    print(f"plot: {out / 'time_to_loss.png'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["transformers", "minibert", "report", "hf-step"],
                   help="hf-step: time transformers' steps alone (report runs it, one fresh "
                   "process per timing)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "time_to_loss")
    p.add_argument("--steps", type=int, default=HF_RECIPE["steps"], help="transformers' steps")
    p.add_argument("--eval-every", type=int, help="default 150 for transformers, 100 for "
                   "minibert")
    p.add_argument("--name", default="defaults", help="minibert: the run's name")
    p.add_argument("--timed-steps", type=int, default=40, help="report: transformers' steps "
                   "timed now, in each precision (0: use the full run's own time)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="transformers: the precision of its full run (auto: the faster of "
                   "fp32 and bf16 autocast here, timed over 20 steps of each)")
    p.add_argument("--keep-freed-memory", action="store_true", help="hf-step: keep freed "
                   "memory for reuse, as the main job does on a CPU")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if not (args.data_dir / "valid.txt").is_file():
        sys.exit(f"WikiText-2 (valid.txt, test.txt) not found in {args.data_dir}: pass --data-dir")
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / "cache"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.what == "minibert":
        run = run_minibert(args.data_dir, cache, args.out / f"run-{args.name}", extra,
                           args.eval_every or 100)
        (args.out / f"minibert-{args.name}.json").write_text(json.dumps(run, indent=1))
        return
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: pip install transformers")
        return
    if args.what == "hf-step":
        hf_step_child(args.data_dir, args.out, args.timed_steps, args.precision,
                      args.keep_freed_memory)
        return
    if args.what == "report":
        report(args.out, args.data_dir, args.timed_steps)
        return
    precision, seconds = args.precision, {}
    if precision == "auto":
        precision, seconds = hf_faster_precision(args.data_dir, args.out, 20)
        print(f"transformers s/step: fp32 {seconds['fp32']:.3f}, bf16 {seconds['bf16']:.3f}"
              f" -> {precision}", flush=True)
    tok, train_set, evals = prepare(args.data_dir, cache)
    run = run_transformers(tok, train_set, evals, args.steps, args.eval_every or 150, precision)
    run["cpu"], run["probe_seconds_per_step"] = cpu_model(), seconds
    (args.out / "transformers.json").write_text(json.dumps(run))


if __name__ == "__main__":
    main()
