"""What a CPU-hour of pretraining buys downstream: the main job against transformers' own MLM
recipe and against random weights, judged by GLUE and BLiMP.

Every model has the same size (4 layers, hidden 256, about 5.4M parameters), the same
tokenizer (the one the main job trains on the corpus), the same corpus (the Wikipedia slice,
its `train` split) and the same CPU budget of pretraining:

* each candidate of the main job (`--candidate NAME="FLAGS"`, default `minibert`: its
  defaults): `examples/pretrain_wikitext.py --data-dir DATA --time-budget BUDGET FLAGS`;
  and the same with a fifth of the budget (`NAME-fifth`), which tells whether transformers'
  recipe needs 5x the time to reach the main job's scores;
* `NAME-random`: no pretraining: the GLUE command's `--random-weights` on the candidate's
  folder (a new encoder of its config per seed, with its tokenizer);
* `transformers`: `BertForMaskedLM` of the `mini` shape trained as `bench_time_to_loss.py`'s
  recipe trains it (its MLM collator at 15%, AdamW, linear warmup and decay, clipping at 1.0,
  dropout 0.1), for as many steps as fit the budget at the step time measured here, less
  the share the main job holds back for checkpoints and its log (`budget.RESERVE`), on the
  main job's packed 128-token blocks of the same split, in --hf-precision (fp32; bf16
  autocast is its faster precision on a CPU with native bf16, as `bench_time_to_loss.py`
  measures);
* with --hf-five-times, `transformers-5x`: the same recipe at five times the budget, the
  direct measure of whether it needs 5x the time to reach the main job's scores: five times
  the steps of `transformers`' stage. Its plan is fixed when it first starts (`plan.json`),
  and it saves its whole state about every 10 minutes, so that a run stopped part way goes
  on where it stopped, to the weights of a run never stopped.

Then each model gets `examples/glue.py` on every task in --glue-dir (3 seeds by default, the
one recipe) and `examples/blimp.py` on --blimp-dir: the full-budget candidates and
transformers' recipe first, which pick the main job's model, then each candidate's random
weights and fifth of the budget. The stages run `--jobs` at a time, each
on its share of the cores (`--jobs 2` on 2 cores: one core each, so that the budget is the
time of one core); a stage whose output is there is skipped, so an interrupted run goes on
where it stopped:

    python benchmarks/bench_quality.py run --budget 1h      # hours: pretraining, then GLUE
    python benchmarks/bench_quality.py report               # the table and quality.png

Each pretraining measures its step time when it starts and fixes its step count from it, so
keep the machine quiet at those moments; after that, a busier machine makes a stage slower,
not different. GLUE and BLiMP are not timed. Outputs under --out (default
benchmarks/out/quality): one folder per model and stage, `quality.json`, `quality.md` (the
table, and whether each candidate meets the aims: `aims`) and `quality.png` (GLUE and BLiMP
against the pretraining budget).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
SHARED = ROOT.parent / "shared" / "data"
HF = "transformers"
HF5 = f"{HF}-5x"  # transformers' recipe at five times the budget (--hf-five-times)


def seconds(text: str) -> float:
    """`90s`, `45m`, `1h`, `1.5h` or plain seconds, as --time-budget reads them."""
    from minibert.training.budget import parse_duration
    return parse_duration(text)


def candidates(args) -> dict[str, list[str]]:
    """--candidate NAME="FLAGS", in order; none given: `minibert`, the main job's defaults."""
    found = {}
    for text in args.candidate or ["minibert="]:
        name, sep, flags = text.partition("=")
        if not sep or not name or name.startswith(HF) or name.endswith(("-fifth", "-random")):
            sys.exit(f"--candidate {text!r}: give NAME=\"FLAGS\", a NAME that does not "
                     f"start with {HF!r} or end in -fifth or -random")
        found[name] = shlex.split(flags)
    return found


def model_names(args) -> list[str]:
    """Every model the run judges, in the order it judges them: each candidate at the full
    budget and transformers' recipe first (the comparison that picks the main job's model),
    then each candidate's random weights and its fifth of the budget."""
    return ([*candidates(args), HF] +
            [f"{c}{end}" for end in ("-random", "-fifth") for c in candidates(args)] +
            ([HF5] if args.hf_five_times else []))


def tokenizer_folder(args) -> Path:
    """The main job's tokenizer for the corpus, trained once (cached under --out/cache, where
    every candidate's run finds it again) and saved where transformers' stage reads it."""
    folder = args.out / "corpus"
    if not (folder / "tokenizer" / "tokenizer.json").is_file():
        from minibert.data.prepare import prepare_corpus, save_prepared
        from minibert.cli.pretrain import MAIN_JOB
        data = prepare_corpus(folder, ("train", "valid"), MAIN_JOB.seq_len,
                              data_dir=args.data_dir, cache_dir=args.out / "cache",
                              vocab_size=MAIN_JOB.vocab_size)
        save_prepared(folder, data)
    return folder / "tokenizer"


def stages(args, budget: float) -> list[tuple[str, list, Path, list[str]]]:
    """(name, command, the file it leaves when done, the stages it waits for), in order."""
    me = [sys.executable, Path(__file__).resolve()]
    common = ["--out", args.out, "--data-dir", args.data_dir, "--hf-precision",
              args.hf_precision]
    out = []
    for name, flags in candidates(args).items():
        for run, share in ((name, 1.0), (f"{name}-fifth", 0.2)):
            folder = args.out / run
            cmd = [sys.executable, ROOT / "examples" / "pretrain_wikitext.py", "--data-dir",
                   args.data_dir, "--time-budget", f"{budget * share:.0f}s", "--out", folder,
                   "--no-progress", "--cache-dir", args.out / "cache", *flags,
                   *(["--resume"] if (folder / "checkpoints").is_dir() else [])]
            out.append((f"pretrain {run}", cmd, folder / "eval.json", []))
        out.append((f"pretrain {name}-random", me + ["random", "--like", args.out / name / "final",
                                                      *common],
                    args.out / f"{name}-random" / "final" / "config.json", [f"pretrain {name}"]))
    out.append((f"pretrain {HF}", me + [HF, *common, "--budget", args.budget],
                args.out / HF / "train.json", []))
    if args.hf_five_times:
        out.append((f"pretrain {HF5}", me + [HF, *common, "--budget", f"{5 * budget:.0f}s",
                                             "--name", HF5], args.out / HF5 / "train.json",
                    [f"pretrain {HF}"]))  # it reads that stage's step time
    for model in model_names(args):
        random = model.endswith("-random")
        init = args.out / (model[:-len("-random")] if random else model) / "final"
        after = [f"pretrain {model}"]
        glue_out = args.out / f"glue-{model}"
        out.append((f"glue {model}", [
            sys.executable, ROOT / "examples" / "glue.py", "--init-from", init, "--glue-dir",
            args.glue_dir, "--seeds", str(args.seeds), "--out", glue_out, "--no-progress",
            *(["--random-weights"] if random else []),
            *(["--resume"] if _started(glue_out) else [])], glue_out / "results.json", after))
        if args.blimp_dir:
            out.append((f"blimp {model}", [
                sys.executable, ROOT / "examples" / "blimp.py", "--model",
                args.out / model / "final", "--blimp-dir", args.blimp_dir, "--out",
                args.out / f"blimp-{model}"], args.out / f"blimp-{model}" / "results.json",
                after))
    return out


def _started(glue_out: Path) -> bool:
    """Whether a GLUE stage stopped after it began a task, which `--resume` goes on from
    (glue.py refuses `--resume` of a folder that holds no task yet)."""
    return glue_out.is_dir() and any(p.is_dir() for p in glue_out.iterdir())


def schedule(todo: list[tuple[str, list, Path, list[str]]], jobs: int, logs: Path) -> None:
    """Run the stages `jobs` at a time, each once the stages it waits for are done, each with
    the cores shared out (OMP_NUM_THREADS) and its output in `logs`; stop at the first
    that fails."""
    logs.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    done = {name for name, _, made, _ in todo if made.is_file()}
    waiting = [s for s in todo if s[0] not in done]
    running: dict[str, subprocess.Popen] = {}
    while waiting or running:
        for stage in [s for s in waiting if all(a in done for a in s[3])]:
            if len(running) == jobs:
                break
            name, cmd, _, _ = stage
            waiting.remove(stage)
            log = open(logs / f"{name.replace(' ', '-')}.log", "a")
            print(f"{time.strftime('%H:%M:%S')} start {name}: {' '.join(map(str, cmd))}",
                  flush=True)
            running[name] = subprocess.Popen([str(c) for c in cmd], env=env, stdout=log,
                                             stderr=subprocess.STDOUT)
        time.sleep(2)
        for name, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            print(f"{time.strftime('%H:%M:%S')} {name}: exit {proc.returncode}", flush=True)
            if proc.returncode:
                for other in running.values():
                    other.wait()
                sys.exit(f"{name} failed: see {logs}")
            done.add(name)
        if waiting and not running and not any(all(a in done for a in s[3]) for s in waiting):
            sys.exit(f"stages that cannot start: {[s[0] for s in waiting]}")


def pretrain_transformers(args) -> None:
    """transformers' recipe for as many steps as fit the budget at the step time measured
    over 20 steps here, less the share of the budget the main job holds back for its
    checkpoints and log (`budget.RESERVE`); saved as a transformers folder with the main
    job's tokenizer, then `train.json`, the stage's mark of done. `transformers-5x` takes
    five times the steps of `transformers`' stage, where that has run. The plan (`plan.json`)
    is fixed at the first start, and the state saved about every 10 minutes (`state.pt`),
    which a stage run again goes on from."""
    import minibert
    from minibert.data import PackedMLMDataset, load_corpus, tokenize_to_memmap
    from bench_time_to_loss import HF_RECIPE, run_transformers
    from minibert.training.budget import RESERVE

    budget = seconds(args.budget)
    stage = args.out / args.name
    folder = stage / "final"
    tok = minibert.Tokenizer.from_pretrained(tokenizer_folder(args))
    corpus = load_corpus(args.data_dir)
    tokens = tokenize_to_memmap(corpus.splits["train"], tok,
                                args.out / "cache" / f"hf-{tok.fingerprint[:16]}-train.tok")
    blocks = PackedMLMDataset(tokens, 128)
    plan_file = stage / "plan.json"
    one = args.out / HF / "train.json"
    if plan_file.is_file():  # a stage stopped part way: its plan, not a new probe's
        plan = json.loads(plan_file.read_text())
    else:
        if args.name == HF5 and one.is_file():  # five times the steps of the budget's stage
            done = json.loads(one.read_text())
            per_step, steps = done["seconds_per_step_probe"], 5 * done["steps"]
        else:
            probe = run_transformers(tok, blocks, [], 25, eval_every=0,
                                     precision=args.hf_precision)
            per_step = statistics.median(probe["step_seconds"][5:])
            steps = max(1, int(budget * (1 - RESERVE) / per_step))
        plan = {"steps": steps, "seconds_per_step_probe": per_step, "budget_seconds": budget,
                "warmup": max(1, round(steps * HF_RECIPE["warmup"] / HF_RECIPE["steps"]))}
        stage.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(json.dumps(plan, indent=2))
    steps, per_step = plan["steps"], plan["seconds_per_step_probe"]
    print(f"{args.name}: {per_step:.3f} s/step -> {steps} steps in {plan['budget_seconds']:.0f}"
          f" s, warmup {plan['warmup']}", flush=True)
    state = stage / "state.pt"
    result = run_transformers(tok, blocks, [], steps, eval_every=0, precision=args.hf_precision,
                              horizon=steps, warmup=plan["warmup"], keep_model=True,
                              checkpoint=state, save_every=max(1, round(600 / per_step)))
    result["model"].save_pretrained(folder)
    tok.save(folder)
    (stage / "train.json").write_text(json.dumps(  # last: the stage is done
        {k: result[k] for k in ("steps", "train_seconds", "precision")} |
        {"seconds_per_step_probe": per_step, "budget_seconds": plan["budget_seconds"]},
        indent=2))
    state.unlink()  # the weights are in final/


def random_folder(args) -> None:
    """A masked LM of --like's config and tokenizer with new weights (seed 0), for BLiMP; GLUE
    draws a new encoder per seed itself (`--random-weights`)."""
    import minibert
    from minibert.interop.hf import config_from_hf, read_config

    minibert.set_seed(0)
    model = minibert.BertForMaskedLM(config_from_hf(read_config(args.like)))
    model.save_pretrained(args.like.parent.parent / f"{args.like.parent.name}-random" / "final",
                          tokenizer=minibert.Tokenizer.from_pretrained(args.like))


def main_run(args) -> None:
    budget = seconds(args.budget)
    t0 = time.time()
    tokenizer_folder(args)  # once, before the stages that read its cache run side by side
    schedule(stages(args, budget), args.jobs, args.out / "logs")
    print(f"done in {(time.time() - t0) / 3600:.1f} h; now: bench_quality.py report")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["run", "report", HF, "random"],
                   help="run: every stage; report: the table and the aims; transformers, random: "
                   "one stage")
    p.add_argument("--budget", default="1h", help="pretraining time per model, on its share "
                   "of the cores (default 1h)")
    p.add_argument("--candidate", action="append", metavar='NAME="FLAGS"',
                   help="a main-job variant to judge, with the flags it adds to the main job's "
                   "defaults; repeat for several (default: minibert=, the defaults alone)")
    p.add_argument("--jobs", type=int, default=2, help="stages at a time (default 2)")
    p.add_argument("--data-dir", type=Path, default=SHARED / "enwiki-2015")
    p.add_argument("--glue-dir", type=Path, default=SHARED / "glue")
    p.add_argument("--blimp-dir", type=Path, default=SHARED / "blimp-sample")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--hf-precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--hf-five-times", action="store_true", help=f"also {HF5}: transformers' "
                   "recipe at five times --budget, resumable (5 hours of one core at 1h)")
    p.add_argument("--name", default=HF, help=argparse.SUPPRESS)
    p.add_argument("--like", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    {"run": main_run, "report": report, HF: pretrain_transformers,
     "random": random_folder}[args.what](args)


def report(args) -> None:
    """quality.json, quality.md and quality.png from the stages that finished, and whether
    each candidate meets the aims (`aims`): transformers-5x counts wherever its GLUE ran."""
    rows = {}
    names = model_names(args)
    if HF5 not in names and (args.out / f"glue-{HF5}" / "results.json").is_file():
        names.append(HF5)
    for name in names:
        path = args.out / f"glue-{name}" / "results.json"
        if not path.is_file():
            continue
        g = json.loads(path.read_text())
        row = {"glue": g["glue"], "tasks": {t: v["score"] for t, v in g["tasks"].items()}}
        b = args.out / f"blimp-{name}" / "results.json"
        if b.is_file():
            row["blimp"] = json.loads(b.read_text())["overall"]
        row["budget_seconds"], row["train_seconds"] = _pretraining_seconds(args.out, name)
        rows[name] = row
    if not rows:
        sys.exit(f"nothing to report in {args.out}: run `bench_quality.py run` first")
    tasks = list(dict.fromkeys(t for r in rows.values() for t in r["tasks"]))  # every one
    lines = ["| model | budget (min) | " + " | ".join(tasks) + " | GLUE | BLiMP |",
             "|---|---|" + "---|" * (len(tasks) + 2)]
    for name, r in rows.items():
        cells = [f"{r['tasks'][t]['mean']:.1f}" if t in r["tasks"] else "—" for t in tasks]
        g = r["glue"]
        glue_cell = f"{g['mean']:.1f}" + (f" ± {g['std']:.1f}" if g.get("std") else "")
        blimp_cell = f"{100 * r['blimp']:.1f}" if "blimp" in r else "—"
        lines.append(f"| {name} | {r['budget_seconds'] / 60:.0f} | {' | '.join(cells)} | "
                     f"{glue_cell} | {blimp_cell} |")
    table = "\n".join(lines) + "\n"
    verdicts = {c: aims(rows, c) for c in candidates(args)}
    for c, found in verdicts.items():
        table += f"\n{c}'s aims, on the means of the seeds:\n\n" + "\n".join(
            aim_lines(found)) + "\n"
    (args.out / "quality.md").write_text(table)
    (args.out / "quality.json").write_text(json.dumps(
        {"models": rows, "aims": {c: [a._asdict() for a in v] for c, v in verdicts.items()}},
        indent=2))
    print(table)
    plot(args.out, rows)


# The aims bench_quality measures, for each candidate (issue text in docs/quality.md).
AHEAD = "ahead of transformers' recipe at the budget, on the GLUE average and on BLiMP"
FIVE_TIMES = "transformers' recipe at five times the budget still below both scores"
FIFTH = "at a fifth of the budget, level with or above transformers' recipe at the budget"


class Aim(NamedTuple):
    """One aim for one candidate: `met` is None where a score it needs was not measured."""

    claim: str
    evidence: str
    met: Optional[bool]


def aims(rows: dict, candidate: str) -> list[Aim]:
    """The aims for `candidate`, each read from the means of the seeds (GLUE's average) and
    BLiMP's overall accuracy in `rows` (report's, by model name). "Ahead" and "below" are
    strict: a tie reaches the other score. The fifth reads the 5x ratio from the main job's
    side (its fifth of the budget against transformers' whole); the five times, from
    transformers' side, is the direct measure. Two models compare only where both have both
    scores, their GLUE averages over the same tasks; else the aim is not measured (None)."""

    def missing(name: str) -> Optional[str]:
        r = rows.get(name)
        return ("not run" if r is None else "no BLiMP" if "blimp" not in r else None)

    def said(name: str) -> str:
        if missing(name):
            return f"{name}: {missing(name)}"
        r = rows[name]
        return (f"{name} ({r['budget_seconds'] / 60:.0f} min) GLUE {r['glue']['mean']:.2f}, "
                f"BLiMP {100 * r['blimp']:.2f}")

    def compare(a: str, b: str, strict: bool) -> tuple[str, Optional[bool]]:
        """The evidence, and whether `a` is above `b` (strict) or level or above on both."""
        evidence = f"{said(a)} against {said(b)}"
        if missing(a) or missing(b):
            return evidence, None
        if set(rows[a]["tasks"]) != set(rows[b]["tasks"]):
            return evidence + "; GLUE averages over other tasks", None
        pairs = [(rows[a]["glue"]["mean"], rows[b]["glue"]["mean"]),
                 (rows[a]["blimp"], rows[b]["blimp"])]
        return evidence, all(x > y if strict else x >= y for x, y in pairs)

    fifth = f"{candidate}-fifth"
    return [Aim(AHEAD, *compare(candidate, HF, strict=True)),
            Aim(FIVE_TIMES, *compare(candidate, HF5, strict=True)),
            Aim(FIFTH, *compare(fifth, HF, strict=False))]


def aim_lines(found: list[Aim]) -> list[str]:
    """The aims as quality.md lists them: each claim, its verdict and its numbers."""
    word = {True: "met", False: "not met", None: "not measured"}
    return [f"- {a.claim}: **{word[a.met]}** ({a.evidence})" for a in found]


def _pretraining_seconds(out: Path, name: str) -> tuple[float, float]:
    """The pretraining's budget (the time its step count was fitted to) and the seconds its
    steps took, which a busier machine makes longer: 0 and 0 for random weights."""
    if name.endswith("-random"):
        return 0.0, 0.0
    if name.startswith(HF):
        record = json.loads((out / name / "train.json").read_text())
        return record["budget_seconds"], record["train_seconds"]
    from minibert.cli.pretrain import recorded_budget
    return (recorded_budget(out / name)["seconds"],
            json.loads((out / name / "eval.json").read_text())["train_seconds"])


def plot(out: Path, rows: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, r in rows.items():
        x = r["budget_seconds"] / 60
        axes[0].errorbar(x, r["glue"]["mean"], yerr=r["glue"].get("std") or 0, fmt="o",
                         label=name)
        if "blimp" in r:
            axes[1].plot(x, 100 * r["blimp"], "o", label=name)
    for ax, what in zip(axes, ("GLUE score (dev)", "BLiMP accuracy (%)")):
        ax.set_xlabel("pretraining budget (minutes of one share of the cores)")
        ax.set_ylabel(what)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "quality.png", dpi=110)


if __name__ == "__main__":
    main()
