"""Fine-tune a model folder on every GLUE task found, and score it as the benchmark does.

    python examples/glue.py --init-from runs/mini/final --glue-dir glue_data --out runs/glue
    python examples/glue.py --init-from runs/mini/final --glue-dir glue_data --seeds 3 \\
        --out runs/glue-3
    python examples/glue.py --init-from runs/mini/final --glue-dir glue_data --random-weights \\
        --out runs/glue-random           # the same tokenizer and shape, untrained

--glue-dir is laid out as GLUE's download_glue_data.py leaves it: CoLA/, SST-2/, MRPC/,
STS-B/, QQP/, MNLI/, QNLI/, RTE/, WNLI/, each with train.tsv and its dev file(s); a task whose
folder is missing is skipped with a word. Every task trains with one recipe
(`minibert.cli.glue.GLUE`, docs/quality.md), once per seed, and is scored on its dev set by
its own metric (`minibert.tasks.glue`). --random-weights starts from a new encoder of the same
config and tokenizer: the baseline that shows what the pretraining bought.

Outputs in --out: results.json (every task's metrics per seed, their mean and std, the GLUE
score), results.md (the table), and per task and seed a folder with its training log and
scores.json. Bad input ends with one line on stderr and exit status 2, before --out is
touched; --resume goes on from the task runs already scored.
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from minibert import cli
from minibert.atomic import write_files_atomically, writing
from minibert.cli import glue
from minibert.data.tokenizer import Tokenizer
from minibert.interop.hf import MODEL_FOLDER, config_from_hf, read_config
from minibert.interop.pretrained import check_tokenizer_fits
from minibert.machine.precision import resolve_precision
from minibert.paths import check_readable
from minibert.tasks.glue import GLUE_TASKS, find_glue_tasks, read_glue_task

log = logging.getLogger("glue")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    job = glue.GLUE
    d = p.add_argument_group("data and model")
    init_from, = cli.add_flags(d, job, ["--init-from"])
    init_from.required, init_from.help = True, ("a minibert or transformers model folder "
                                                "(config.json, weights, tokenizer)")
    d.add_argument("--glue-dir", type=cli.path_flag, required=True, help="the folder of the GLUE "
                   "task folders")
    d.add_argument("--tasks", help=f"a comma-separated subset of {', '.join(GLUE_TASKS)}; "
                   "default every task found")
    cli.add_flags(d, job, ["--random-weights"])
    d.add_argument("--max-train-examples", type=int, help="a random subset of each task's "
                   "training rows (fixed by the seed), for a quick look; not GLUE's score")
    r = p.add_argument_group("the recipe, the same for every task")
    cli.add_flags(r, job, ["--epochs"], epoch=f"passes over each task's training data "
                  f"(at most {glue.MAX_EPOCHS})")
    cli.add_flags(r, job, ["--batch-size", "--lr", "--warmup-ratio", "--weight-decay"],
                  unit="examples")
    dropout, = cli.add_flags(r, job, ["--dropout"])
    dropout.help = ("hidden and attention dropout while fine-tuning; default the model "
                    "folder's own (0 after the main job, 0.1 after BERT's pretraining)")
    r.add_argument("--seq-len", type=int, default=job.seq_len, help="longer inputs are cut, "
                   "a pair's longer text first")
    r.add_argument("--seeds", type=int, default=1, help="runs per task, seeds --seed, "
                   "--seed + 1, ...; the results give mean and std over them")
    cli.add_flags(r, job, ["--seed", "--precision", "--device"])
    cli.add_flags(p.add_argument_group("logging"), job, ["--out", "--log-every", "--resume",
                                                         "--no-progress"], out="runs/glue")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    with cli.Script(args, glue.FLAGS) as script:
        ctx = script.start()
        prepared = prepare(args, ctx)  # checks and reads every task's files; writes nothing
        # --out held by its lock; each task run is a run folder of its own inside it.
        if script.claim([], resume=False):
            run(args, ctx, prepared)
    return script.status


def prepare(args, ctx) -> SimpleNamespace:
    """Everything checked before --out is touched: the flags, the model folder and its
    tokenizer, and each task's files, read whole."""
    cli.check_numbers(args, [
        ("epochs", lambda v: 1 <= v <= glue.MAX_EPOCHS, f"between 1 and {glue.MAX_EPOCHS} "
         f"(GLUE-sane: a longer fine-tuning stands in for pretraining)"),
        ("seeds", lambda v: v >= 1, "at least 1"),
        ("max_train_examples", lambda v: v >= 1, "at least 1"),
        ("seq_len", lambda v: v >= 5, "at least 5 (the special tokens and a token of each "
         "text)"),
        ("dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
        ("warmup_ratio", lambda v: 0 <= v < 1, "a fraction of the schedule in [0, 1), e.g. "
         "0.1")])
    cli.finite_flags(args, ["lr", "weight_decay"])
    cfg = cli.in_flag_names(lambda: replace(
        glue.GLUE.train, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup_ratio,
        weight_decay=args.weight_decay, precision=args.precision, seed=args.seed,
        log_every=args.log_every, progress=not args.no_progress), glue.FLAGS)
    cli.in_flag_names(lambda: cfg.split_batch(ctx.world_size), glue.FLAGS)
    resolve_precision(args.precision, ctx.device)  # e.g. fp16 on a CPU
    check_readable(args.init_from, "--init-from", MODEL_FOLDER)
    config = config_from_hf(read_config(args.init_from))
    tok = Tokenizer.from_pretrained(args.init_from)
    check_tokenizer_fits(config, tok, source=args.init_from)
    cli.in_flag_names(lambda: config.check_fits(args.seq_len, tok.vocab_size,
                                                what=f"--init-from {args.init_from}"),
                      cli.SEQ_LEN_FLAG)
    if not args.random_weights:
        # missing, damaged or not the config's: said now, not after a task
        cli.check_init_weights(args.init_from, config)
    check_readable(args.glue_dir, "--glue-dir", "a folder of GLUE task folders")
    names = [n.strip() for n in args.tasks.split(",") if n.strip()] if args.tasks else None
    found, missing = find_glue_tasks(args.glue_dir, names)
    check_out(args.out, args.resume)
    tasks = [read_glue_task(t, args.glue_dir, args.max_train_examples, args.seed)
             for t in found]
    if args.resume:  # each task run scored already, under these settings or refused now
        for data in tasks:
            settings = glue.task_settings(data, tok, args.init_from, cfg, args.seq_len,
                                          args.dropout, args.epochs, args.random_weights)
            for i in range(args.seeds):
                glue.check_scored(args.out / data.task.name / f"seed-{args.seed + i}",
                                  settings)
    # the rates the tasks fine-tune at, for the log and results.json
    dropout = ({"hidden": config.hidden_dropout, "attention": config.attention_dropout}
               if args.dropout is None else {"hidden": args.dropout, "attention": args.dropout})
    return SimpleNamespace(cfg=cfg, tok=tok, tasks=tasks, missing=missing, dropout=dropout)


def check_out(out: Path, resume: bool) -> None:
    """A fresh start needs an --out that holds nothing; --resume, one that holds task runs."""
    held = sorted(p.name for p in out.iterdir() if p.name != ".lock") if out.is_dir() else []
    if held and not resume:
        raise FileExistsError(f"--out {out} already holds {', '.join(held[:6])}; pass --resume "
                              f"to go on from the task runs scored there, or choose another "
                              f"--out")
    if resume and not any((out / name).is_dir() for name in held):
        raise FileNotFoundError(f"--resume: --out {out} holds no GLUE task run to go on from; "
                                f"start without --resume")


def run(args, ctx, p: SimpleNamespace) -> None:
    for name in p.missing:
        log.info("%s: no %s/ folder in %s, skipped", name, name, args.glue_dir)
    seeds = [args.seed + i for i in range(args.seeds)]
    weights = "random weights" if args.random_weights else "pretrained weights"
    log.info("GLUE on %s (%s): %s; %d seed(s); %d epochs, batch %d, lr %g, dropout %g "
             "(attention %g)%s", args.init_from, weights,
             ", ".join(d.task.name for d in p.tasks), len(seeds), args.epochs, args.batch_size,
             args.lr, p.dropout["hidden"], p.dropout["attention"],
             "" if args.dropout is not None else ", the model folder's own")
    cli.apply_keep_freed_memory(False, ctx)
    per_task = {}
    for data in p.tasks:
        per_task[data.task.name] = []
        for seed in seeds:
            log.info("%s, seed %d: %d training examples", data.task.name, seed,
                     len(data.train))
            scores = glue.run_task(data, p.tok, args.init_from, replace(p.cfg, seed=seed),
                                   args.seq_len, args.dropout, args.epochs,
                                   args.out / data.task.name / f"seed-{seed}", ctx,
                                   random_weights=args.random_weights, resume=args.resume)
            log.info("%s, seed %d: %s", data.task.name, seed,
                     ", ".join(f"{k} {v:.1f}" for k, v in scores.items()))
            per_task[data.task.name].append(scores)
    if not ctx.is_main:
        return
    summary = glue.summarize(per_task, seeds)
    results = {"model": str(args.init_from), "weights": weights, "seeds": seeds,
               "recipe": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                          "warmup_ratio": args.warmup_ratio, "weight_decay": args.weight_decay,
                          "dropout": p.dropout, "seq_len": args.seq_len,
                          "max_train_examples": args.max_train_examples},
               "skipped": p.missing, **summary}
    table = glue.markdown(summary, f"GLUE dev, {args.init_from} ({weights})")
    with writing(f"results.json and results.md in {args.out}"):
        write_files_atomically(args.out, {"results.md": table,
                                          "results.json": json.dumps(results, indent=2)
                                          + "\n"})
    print(table)
    print(f"results in {args.out / 'results.json'}")


if __name__ == "__main__":
    sys.exit(main())
