"""Fine-tune BERT for text classification on a TSV or CSV file.

    python examples/finetune_classification.py --train train.tsv --eval dev.tsv \\
        --text-column sentence --label-column label --init-from runs/mini/final --out runs/cls
    python examples/finetune_classification.py --train train.csv --eval dev.csv \\
        --text-column text --label-column label --preset mini --out runs/cls-scratch

With --init-from, the encoder starts from a minibert or transformers checkpoint and its
tokenizer (tokenizer.json or vocab.txt). Without it, a WordPiece tokenizer is trained on the
training texts and the model starts from random weights: the baseline that shows what
pretraining buys. Labels may be strings or integers; the sorted label names are saved in
the model's config.json (id2label / label2id).

This script is wiring; each step is a library piece. `minibert.data.read_table_task` reads
and checks both files' rows and turns labels into class ids, `SequenceSplit.encode` makes
[CLS] text [SEP] (pair [SEP]) ids cut to --seq-len (a pair loses tokens from its longer
text first, as transformers does), `TaskCollator` pads length-grouped batches, and
`minibert.training.engine.train` trains, evaluating after every epoch with
`minibert.tasks.predict` and `minibert.tasks.metrics.sequence_scores` (accuracy, macro-F1);
the flags, checks and start-up shared with the other fine-tuning scripts are
`minibert.cli.finetune` and `minibert.cli`.
Outputs in --out: metrics.jsonl, eval.json, predictions.tsv, labels.json, checkpoints/ and
final/ (model + tokenizer, loadable by minibert, and by transformers where the encoder is
classic BERT or ModernBERT). Bad input ends with one
line on stderr naming the file and the line, and exit status 2, before --out is touched;
the exit status says how a run ended (minibert/cli.py).
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import csv
import io
import logging
import sys
from types import SimpleNamespace

import minibert
from minibert import cli
from minibert.cli import finetune
from minibert.training.checkpoint import sha256_file
from minibert.data import TaskCollator, read_table_task
from minibert.training.engine import train
from minibert.tasks.predict import predict
from minibert.training.resume import RunPlan
from minibert.atomic import writing

log = logging.getLogger("finetune")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    d = p.add_argument_group("data")
    d.add_argument("--train", type=cli.path_flag, required=True,
                   help=".tsv or .csv with a header row")
    d.add_argument("--eval", type=cli.path_flag, required=True,
                   help=".tsv or .csv with a header row")
    d.add_argument("--text-column", required=True, help="the header of the column that "
                   "holds each row's text")
    d.add_argument("--text-pair-column", help="a second text, for sentence-pair tasks")
    d.add_argument("--label-column", required=True, help="the header of the column that "
                   "holds each row's label (strings or integers)")
    d.add_argument("--max-train-examples", type=int, help="a random subset (fixed by --seed)")
    d.add_argument("--seq-len", type=int, default=finetune.FINETUNE.seq_len,
                   help="longer inputs are truncated")
    finetune.add_args(p, out="runs/finetune")
    return p.parse_args(argv)


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
    """Everything that can be checked, before --out is touched: the flags, both files'
    rows, a resumed run's labels, the tokenizer against the model, the encoded examples,
    and what --resume compares (the run's `RunPlan`)."""
    finetune.check_args(args, ctx, positive=["max_train_examples"])
    shortest = 5 if args.text_pair_column else 3
    if args.seq_len < shortest:
        raise ValueError(f"--seq-len must be at least {shortest} (the special tokens and one "
                         f"token of each text)")
    task = read_table_task(args.train, args.eval, args.text_column, args.text_pair_column,
                           args.label_column, args.max_train_examples, args.seed)
    finetune.check_labels(args, task.names)
    cfg = finetune.epoch_config(args, ctx, len(task.train),
                                f"{args.train} gives {len(task.train)} training examples")
    tok = finetune.prepare_tokenizer(args, ctx, task.train.tokenizer_texts())
    minibert.set_seed(args.seed)
    model = finetune.build_model(minibert.BertForSequenceClassification, args, tok,
                                 num_labels=len(task.names), id2label=task.names)
    # What --resume compares besides the model and training settings: the same examples,
    # read from the same columns, encoded by the same tokenizer, for the same classes; and
    # the same evaluation examples, so that every epoch's scores compare
    # (minibert/training/state.py).
    identity = {"train file": sha256_file(args.train), "--eval file": sha256_file(args.eval),
                "--max-train-examples": args.max_train_examples,
                "--text-column": args.text_column, "--text-pair-column": args.text_pair_column,
                "--label-column": args.label_column, "--seq-len": args.seq_len,
                "tokenizer": tok.fingerprint, "labels": task.names}
    return SimpleNamespace(task=task, tok=tok, model=model, cfg=cfg, identity=identity,
                           train_set=task.train.encode(tok, args.seq_len),
                           eval_set=task.eval.encode(tok, args.seq_len),
                           runs=[RunPlan(model, cfg, identity, args.out, args.resume)])


def run(args, ctx, p: SimpleNamespace) -> None:
    task, tok, model, cfg = p.task, p.tok, p.model, p.cfg
    if ctx.is_main:
        finetune.save_labels(args, task.names)
    finetune.save_tokenizer(args, ctx, tok)
    truncated = sum(len(f["input_ids"]) == args.seq_len for f in p.train_set)
    log.info("%d training and %d evaluation examples, %d classes (%s); %d steps of %d "
             "(%d per epoch); %d training texts reach --seq-len %d", len(p.train_set),
             len(p.eval_set), len(task.names), ", ".join(task.names[:10]), cfg.max_steps,
             args.batch_size, cfg.eval_every, truncated, args.seq_len)
    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)

    def eval_fn(raw_model, precision: str) -> dict:  # every epoch, and at the end
        pred = predict(raw_model, p.eval_set, collate, finetune.eval_batch_size(args, ctx),
                       precision, ctx.device)
        return finetune.task_scores(task, pred, p.eval_set)

    cli.apply_keep_freed_memory(args.keep_freed_memory, ctx)
    minibert.fast(model)  # the CPU kernels, swapped in (docs/machine-room.md)
    result = train(model, p.train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in p.train_set], eval_fn=eval_fn,
                   data_identity=p.identity)
    if not cli.finished(result, ctx, cfg.lr, model, args.out):
        return
    with writing(args.out / "final"):
        model.save_pretrained(args.out / "final", tokenizer=tok)
    scores, names = result["scores"], task.names
    rows = io.StringIO()
    w = csv.writer(rows, delimiter="\t", lineterminator="\n")
    w.writerow(["line", "label", "prediction"])
    for line, y, pred in zip(task.eval.lines, task.eval.labels, scores["predictions"]):
        w.writerow([line, names[y], names[pred]])
    finetune.write_eval(args.out, {"predictions.tsv": rows.getvalue()}, **finetune.summary(
        result, accuracy=result["accuracy"], f1=result["f1"], eval_loss=result["eval_loss"],
        labels=names, per_class=scores["per_class"], train_examples=len(task.train),
        eval_examples=len(task.eval)))
    log.info("eval accuracy %.4f, macro-F1 %.4f over %d examples; model in %s",
             result["accuracy"], result["f1"], len(task.eval), args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
