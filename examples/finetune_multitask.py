"""Fine-tune one BERT encoder on several classification tasks at once.

    python examples/finetune_multitask.py --init-from runs/mini/final --out runs/multi \\
        --task sst2:sequence:sst2/train.tsv:sst2/dev.tsv \\
        --task ner:token:conll/train.txt:conll/dev.txt \\
        --text-column sentence --label-column label

Each --task is name:kind:train:eval. Kind `sequence` reads TSV/CSV files with --text-column
(--text-pair-column) and --label-column, the same columns for every sequence task; kind
`token` reads CoNLL-style `word label` files whose tags follow --scheme. One encoder
(minibert.BertMultiTask) is shared by a head per task; every step trains one task, drawn
with probability proportional to the square root of its number of training examples
(minibert.data.sampler.TaskMixtureBatches; docs/multitask.md says why).

Wiring only: the task readers and TaskCollator of minibert.data, engine.train with the
mixture as its batch order, minibert.tasks.predict, and minibert.cli.finetune.task_scores
(classification_scores: accuracy, macro-F1; span_f1 with word accuracy) for the metrics;
minibert.cli.finetune and minibert.cli hold what the fine-tuning scripts share. --epochs counts
epoch-equivalents: (all tasks' training examples) / --batch-size steps, after each of which
every task is evaluated. Outputs in --out: metrics.jsonl (keys "task/metric"), eval.json
({"tasks": {name: scores}}, run totals), checkpoints/ and final/ with one exported
single-task folder per task (final/<name>/, loadable by minibert, and by transformers where
the encoder is classic BERT or ModernBERT). Bad
input ends with one line on stderr and exit status 2, before --out is touched.
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import minibert
from minibert import cli
from minibert.cli import finetune
from minibert.training.checkpoint import sha256_file
from minibert.data import TaskCollator, read_conll_task, read_table_task
from minibert.data.sampler import TaskMixtureBatches, batches_per_epoch
from minibert.model.config import PRESETS
from minibert.training.engine import train
from minibert.interop.hf import config_from_hf, read_config
from minibert.tasks.metrics import SCHEMES, canonical_scheme, numbers
from minibert.tasks.multitask import KINDS, check_task_name
from minibert.paths import check_readable
from minibert.tasks.predict import predict
from minibert.training.resume import RunPlan
from minibert.atomic import writing

log = logging.getLogger("finetune_multitask")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    d = p.add_argument_group("data")
    d.add_argument("--task", action="append", required=True, metavar="NAME:KIND:TRAIN:EVAL",
                   help=f"once per task; KIND is one of {', '.join(KINDS)}")
    d.add_argument("--text-column", help="sequence tasks: the text column")
    d.add_argument("--text-pair-column", help="sequence tasks: a second text, for pairs")
    d.add_argument("--label-column", help="sequence tasks: the label column")
    d.add_argument("--scheme", choices=list(SCHEMES), default="IOB2", help="token tasks' tags")
    d.add_argument("--seq-len", type=int, default=finetune.FINETUNE.seq_len,
                   help="longer inputs are truncated "
                   "(sequence) or cut into windows of whole words (token)")
    finetune.add_args(p, out="runs/finetune_multitask", epoch="epoch-equivalents: "
                      "all training examples / --batch-size steps each")
    args = p.parse_args(argv)
    args.scheme = canonical_scheme(args.scheme)  # BIO is IOB2: one name in the run's identity
    return args


def parse_tasks(specs: list[str]) -> list[dict]:
    """--task values as {name, kind, train_file, eval_file}; each mistake is one clear error."""
    tasks, names = [], set()
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 4 or not all(parts):
            raise ValueError(f"--task {spec!r} does not parse; expected name:kind:train:eval, "
                             f"e.g. sst2:sequence:train.tsv:dev.tsv (paths without ':')")
        name, kind, train_file, eval_file = parts
        try:
            check_task_name(name)  # it names a head and the folder final/<name>
        except ValueError as e:
            raise ValueError(f"--task {spec!r}: {e}") from None
        if kind not in KINDS:
            raise ValueError(f"--task {spec!r}: unknown kind {kind!r}; choose one of "
                             f"{', '.join(KINDS)}")
        if name in names:
            raise ValueError(f"--task {spec!r}: the task name {name!r} is used twice")
        names.add(name)
        # `~` expanded as every path flag's is (cli.path_flag): the shell leaves it inside a value
        train_file, eval_file = Path(train_file).expanduser(), Path(eval_file).expanduser()
        for part, path in (("TRAIN", train_file), ("EVAL", eval_file)):
            check_readable(path, f"--task {name}'s {part}")  # there to read, or said why not
        tasks.append({"name": name, "kind": kind, "train_file": train_file,
                      "eval_file": eval_file})
    return tasks


def check_bert_heads(args) -> None:
    """BertMultiTask puts BERT's heads (a tanh pooler, linear classifiers) on its shared
    encoder; a model with ModernBERT's (a dense-GELU-LayerNorm before every classifier) is
    refused in the flag that chose it, before any work."""
    config = config_from_hf(read_config(args.init_from)) if args.init_from else \
        minibert.BertConfig.preset(args.preset)
    if config.task_head == "bert":
        return
    what = (f"--init-from {args.init_from} is a ModernBERT model" if args.init_from else
            f"--preset {args.preset} is a ModernBERT preset")
    raise ValueError(f"{what}, whose task heads put a dense-GELU-LayerNorm before each "
                     f"classifier, and {Path(__file__).name} builds BERT's (a pooler and linear "
                     f"classifiers) on the shared encoder: start from a BERT preset "
                     f"({', '.join(PRESETS)}, e.g. --preset mini) or checkpoint, or train "
                     f"each task on its own with finetune_classification.py or "
                     f"finetune_token_classification.py")


def main(argv=None) -> int:
    args = parse_args(argv)
    # the signals, --out's lock and the exit status (minibert/cli/__init__.py)
    with cli.Script(args, finetune.flag_names(args)) as script:
        ctx = script.start()
        prepared = prepare(args, ctx)  # checks and reads; writes nothing
        if script.claim(prepared.runs):  # --out held: a fresh start, or the run to resume
            run(args, ctx, prepared)
    return script.status


def prepare(args, ctx) -> SimpleNamespace:
    """Everything that can be checked, before --out is touched: the tasks and flags, every
    task's files (its `TaskData`), the tokenizer against the model, the encoded examples,
    and what --resume compares (the run's `RunPlan`)."""
    tasks = parse_tasks(args.task)
    finetune.check_args(args, ctx)
    check_bert_heads(args)
    if args.seq_len < 5:
        raise ValueError("--seq-len must be at least 5 (the special tokens and some text)")
    for t in tasks:
        if t["kind"] == "token":
            t["data"] = read_conll_task(t["train_file"], t["eval_file"], args.scheme)
        elif not (args.text_column and args.label_column):
            raise ValueError(f"--task {t['name']} is a sequence task: pass --text-column "
                             f"and --label-column")
        else:
            t["data"] = read_table_task(t["train_file"], t["eval_file"], args.text_column,
                                        args.text_pair_column, args.label_column)
    tok = finetune.prepare_tokenizer(args, ctx, [
        x for kind in ("sequence", "token") for t in tasks if t["kind"] == kind
        for x in t["data"].train.tokenizer_texts()])
    minibert.set_seed(args.seed)
    # The encoder of --init-from, a fresh head per task.
    model = finetune.build_model(minibert.BertMultiTask, args, tok, tasks={
        t["name"]: (t["kind"], t["data"].names) for t in tasks})
    for t in tasks:  # each example knows its task: the collator puts it in the batch
        t["train"], t["eval"] = ([{**f, "task": t["name"]} for f in
                                  getattr(t["data"], s).encode(tok, args.seq_len)]
                                 for s in ("train", "eval"))
    n_train = sum(len(t["train"]) for t in tasks)
    # --epochs counts epoch-equivalents: all tasks' training examples once, on average.
    cfg = finetune.train_config(args, max(1, batches_per_epoch(n_train, args.batch_size,
                                                               ctx.world_size)))
    # What --resume compares: the same tasks in the same order (the dataset's layout), each
    # with its training file's content and labels, read and encoded the same way, and its
    # evaluation file's content, so that every epoch's scores compare (minibert/training/state.py).
    identity = {"tasks": [f"{t['name']}:{t['kind']}" for t in tasks],
                **{f"{t['name']} train file": sha256_file(t["train_file"]) for t in tasks},
                **{f"{t['name']} eval file": sha256_file(t["eval_file"]) for t in tasks},
                **{f"{t['name']} labels": t["data"].names for t in tasks},
                "--text-column": args.text_column, "--text-pair-column": args.text_pair_column,
                "--label-column": args.label_column, "--scheme": args.scheme,
                "--seq-len": args.seq_len, "tokenizer": tok.fingerprint}
    return SimpleNamespace(tasks=tasks, tok=tok, model=model, cfg=cfg, identity=identity,
                           runs=[RunPlan(model, cfg, identity, args.out, args.resume)])


def run(args, ctx, p: SimpleNamespace) -> None:
    tasks, tok, model, cfg = p.tasks, p.tok, p.model, p.cfg
    finetune.save_tokenizer(args, ctx, tok)
    train_set = [f for t in tasks for f in t["train"]]  # task t at offset sum(sizes[:t])
    batches = TaskMixtureBatches([len(t["train"]) for t in tasks], args.batch_size,
                                 seed=args.seed, rank=ctx.rank, world_size=ctx.world_size,
                                 task_names=[f"task {t['name']}" for t in tasks])
    log.info("%s; %d steps, P(task) %s", ", ".join(
        f"{t['name']} ({t['kind']}, {len(t['train'])} training examples)" for t in tasks),
        cfg.max_steps, np.round(batches.probabilities, 3).tolist())
    # A batch's `task` names the head it trains.
    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)

    def eval_fn(raw_model, precision: str) -> dict:  # every epoch-equivalent, and at the end
        scores = {}
        for t in tasks:
            pred = predict(raw_model, t["eval"], collate, finetune.eval_batch_size(args, ctx),
                           precision, ctx.device)
            scores[t["name"]] = finetune.task_scores(t["data"], pred, t["eval"], args.scheme)
        return {**{f"{n}/{k}": v for n, s in scores.items() for k, v in numbers(s).items()},
                "tasks": scores}

    cli.apply_keep_freed_memory(args.keep_freed_memory, ctx)
    minibert.fast(model)  # the CPU kernels, swapped in (docs/machine-room.md)
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   eval_fn=eval_fn, data_identity=p.identity, batches=batches)
    if not cli.finished(result, ctx, cfg.lr, model, args.out):
        return
    for t in tasks:
        with writing(args.out / "final" / t["name"]):
            model.export(t["name"], args.out / "final" / t["name"], tokenizer=tok)
    scores = result["scores"]["tasks"]
    finetune.write_eval(args.out, **finetune.summary(result, tasks={
        t["name"]: {"kind": t["kind"], **{k: v for k, v in scores[t["name"]].items()
                                          if k != "predictions"},
                    "labels": t["data"].names, "train_examples": len(t["train"]),
                    "eval_examples": len(t["eval"])} for t in tasks}))
    log.info("%s; models in %s", ", ".join(f"{n} F1 {s['f1']:.4f}" for n, s in scores.items()),
             args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
