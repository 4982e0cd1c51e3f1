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

This script is wiring; each step is a library piece. `minibert.data.read_table` reads and
checks the rows, `LabelMap` turns labels into class ids, `encode_classification` makes
[CLS] text [SEP] (pair [SEP]) ids cut to --seq-len (a pair loses tokens from its longer
text first, as transformers does), `TaskCollator` pads length-grouped batches, and
`minibert.engine.train` trains, evaluating after every epoch with `minibert.predict` and
`minibert.metrics.classification_scores` (accuracy, macro-F1); the flags, checks and
start-up shared with the other fine-tuning scripts are in finetune_common.py. Outputs in --out:
metrics.jsonl, eval.json, predictions.tsv, labels.json, checkpoints/ and final/ (model +
tokenizer, loadable by minibert and transformers). Bad input ends with one line on stderr
naming the file and the line, and exit status 2; nothing already in --out is overwritten.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from pathlib import Path

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import sha256_file
from minibert.data import TaskCollator
from minibert.engine import train
from minibert.precision import resolve_precision
from minibert.predict import predict

# The wiring all fine-tuning scripts share. Run as a script, this folder is already on
# sys.path; imported by file path (as the tests do), it is not, hence the insert.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_common as common  # noqa: E402

log = logging.getLogger("finetune")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--train", type=Path, required=True, help=".tsv or .csv with a header row")
    d.add_argument("--eval", type=Path, required=True, help=".tsv or .csv with a header row")
    d.add_argument("--text-column", required=True)
    d.add_argument("--text-pair-column", help="a second text, for sentence-pair tasks")
    d.add_argument("--label-column", required=True)
    d.add_argument("--max-train-examples", type=int, help="a random subset (fixed by --seed)")
    d.add_argument("--seq-len", type=int, default=128, help="longer inputs are truncated")
    common.add_finetune_args(p, out="runs/finetune")
    return p.parse_args(argv)


def prepare(args, ctx) -> dict:
    """The flags checked, then the rows of both files, read and checked: all before --out
    is touched."""
    common.check_finetune_args(args, ctx, positive=["max_train_examples"])
    shortest = 5 if args.text_pair_column else 3
    if args.seq_len < shortest:
        raise ValueError(f"--seq-len must be at least {shortest} (the special tokens and one "
                         f"token of each text)")
    return common.read_table_task(args.train, args.eval, args.text_column,
                                  args.text_pair_column, args.label_column,
                                  args.max_train_examples, args.seed)


def main(argv=None) -> int:
    return common.run_script(parse_args(argv), prepare, run)


def run(args, ctx, task: dict) -> None:
    minibert.set_seed(args.seed)
    names, n_train = task["names"], len(task["train"]["labels"])
    if n_train < args.batch_size:
        raise ValueError(f"{args.train} gives {n_train} training examples, fewer than one "
                         f"batch; lower --batch-size below {n_train}")
    if ctx.is_main:
        common.save_labels(args, names)
    tok = common.prepare_tokenizer(args, ctx, common.task_texts("sequence", task["train"]))
    model = common.build_model(minibert.BertForSequenceClassification, args, tok,
                               num_labels=len(names), id2label=names)
    train_set, eval_set = (common.encode_task(tok, "sequence", task[s], args.seq_len)
                           for s in ("train", "eval"))
    truncated = sum(len(f["input_ids"]) == args.seq_len for f in train_set)
    steps_per_epoch = n_train // args.batch_size  # full, length-grouped batches
    cfg = common.train_config(args, steps_per_epoch)
    log.info("%d training and %d evaluation examples, %d classes (%s); %d steps of %d "
             "(%d per epoch); %d training texts reach --seq-len %d", n_train, len(eval_set),
             len(names), ", ".join(names[:10]), cfg.max_steps, args.batch_size,
             steps_per_epoch, truncated, args.seq_len)
    collate = TaskCollator(tok.pad_id)
    precision = resolve_precision(args.precision, ctx.device)
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch, and at the end
        pred = predict(raw_model, eval_set, collate, common.eval_batch_size(args, ctx),
                       precision, ctx.device)
        last["scores"], last["preds"] = common.sequence_scores(pred, task["eval"], names)
        return common.numbers(last["scores"])

    # What --resume compares besides the model and training settings: the same examples,
    # read from the same columns, encoded by the same tokenizer, for the same classes.
    identity = {"train file": sha256_file(args.train),
                "--max-train-examples": args.max_train_examples,
                "--text-column": args.text_column, "--text-pair-column": args.text_pair_column,
                "--label-column": args.label_column, "--seq-len": args.seq_len,
                "tokenizer": tok.fingerprint, "labels": names}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    if common.finished(result, ctx):
        summary = write_results(args, model, tok, task, result, last["scores"], last["preds"])
        log.info("eval accuracy %.4f, macro-F1 %.4f over %d examples; model in %s",
                 summary["accuracy"], summary["f1"], summary["eval_examples"],
                 args.out / "final")


def write_results(args, model, tok, task, result, scores, preds) -> dict:
    model.save_pretrained(args.out / "final", tokenizer=tok)
    names = task["names"]
    summary = {"accuracy": result["accuracy"], "f1": result["f1"],
               "eval_loss": result["eval_loss"], "labels": names,
               "per_class": scores["per_class"],
               "train_examples": len(task["train"]["labels"]),
               "eval_examples": len(task["eval"]["labels"]),
               **{k: result[k] for k in ("steps", "tokens_seen", "wall_seconds", "precision")}}
    write_files_atomically(args.out, {"eval.json": json.dumps(summary, indent=2) + "\n"})
    with open(args.out / "predictions.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["line", "label", "prediction"])
        for line, y, p in zip(task["eval"]["lines"], task["eval"]["labels"], preds):
            w.writerow([line, names[y], names[p]])
    return summary


if __name__ == "__main__":
    sys.exit(main())
