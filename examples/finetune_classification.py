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
`minibert.engine.train` trains, evaluating after every epoch with
`minibert.metrics.classification_scores` (accuracy, macro-F1). Outputs in --out:
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

import numpy as np
import torch

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import CheckpointError, sha256_file
from minibert.config import PRESETS
from minibert.data import LabelMap, TaskCollator, encode_classification, read_table
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError, train
from minibert.hf import read_config
from minibert.metrics import classification_scores
from minibert.precision import autocast_context, resolve_precision
from minibert.rundir import open_run

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
    d.add_argument("--vocab-size", type=int, default=8192, help="without --init-from")
    d.add_argument("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    m = p.add_argument_group("model")
    m.add_argument("--init-from", type=Path, help="a minibert or transformers checkpoint "
                   "folder with its tokenizer; default: random weights and a new tokenizer")
    m.add_argument("--preset", default="mini", help=f"without --init-from: {', '.join(PRESETS)}")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--max-steps", type=int, help="stop after this many steps (overrides --epochs); "
                   "may change on --resume to stop earlier or go further")
    t.add_argument("--decay-steps", type=int, help="the learning-rate schedule's horizon, fixed "
                   "for the whole run; steps past it run at --min-lr (default: the steps of the "
                   "run's first start)")
    t.add_argument("--batch-size", type=int, default=32, help="global: examples per step")
    t.add_argument("--micro-batch-size", type=int, help="per rank; default batch / world size")
    t.add_argument("--lr", type=float, help="default 5e-5 with --init-from, 5e-4 without")
    t.add_argument("--min-lr", type=float, default=0.0, help="the rate at the horizon and after")
    t.add_argument("--warmup-ratio", type=float, default=0.1, help="fraction of --decay-steps")
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on a CUDA GPU that has it and on a CPU with native, "
                   "faster bf16 matmuls; fp32 elsewhere")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t.add_argument("--keep-freed-memory", action="store_true",
                   help="reuse freed memory instead of returning it to the kernel (glibc): "
                   "1.13x faster CPU training steps with a 30,522-word vocabulary, 1.01x with "
                   "the default 8,192; the resident set then never shrinks "
                   "(benchmarks/bench_process.py)")
    r = p.add_argument_group("logging and checkpoints")
    r.add_argument("--out", type=Path, default=Path("runs/finetune"))
    r.add_argument("--log-every", type=int, default=10)
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    r.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def check_args(args, ctx) -> None:
    """The mistakes worth one clear line, before any work is done."""
    if not args.init_from and args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    for flag in ("epochs", "max_steps", "decay_steps", "max_train_examples", "batch_size",
                 "micro_batch_size", "log_every"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    shortest = 5 if args.text_pair_column else 3
    if args.seq_len < shortest:
        raise ValueError(f"--seq-len must be at least {shortest} (the special tokens and one "
                         f"token of each text)")
    if not 0 <= args.warmup_ratio < 1:
        raise ValueError(f"--warmup-ratio {args.warmup_ratio} must lie in [0, 1)")
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr {args.lr} must be positive")
    if not 0 <= args.min_lr <= (args.lr or 5e-5):
        raise ValueError(f"--min-lr {args.min_lr} must lie between 0 and --lr "
                         f"({args.lr or 'its default 5e-5 with --init-from, 5e-4 without'})")
    if not args.weight_decay >= 0:
        raise ValueError(f"--weight-decay {args.weight_decay} must be 0 or more")
    per_rank, rest = divmod(args.batch_size, ctx.world_size)
    micro = args.micro_batch_size or per_rank
    if rest or per_rank == 0 or per_rank % micro:
        raise ValueError(f"--batch-size {args.batch_size} must split into {ctx.world_size} "
                         f"process(es) x whole micro-batches of --micro-batch-size {micro}")
    resolve_precision(args.precision, ctx.device)  # e.g. fp16 on a CPU
    if args.init_from:
        read_config(args.init_from)  # a missing folder, or a training checkpoint, said at once


def load_task(args) -> dict:
    """Rows of both files, checked, with the labels as class ids (the training file's)."""
    columns = [args.text_column] + ([args.text_pair_column] if args.text_pair_column else []) \
        + [args.label_column]
    train_rows, eval_rows = read_table(args.train, columns), read_table(args.eval, columns)
    labels = LabelMap.from_labels([r[-1] for _, r in train_rows], args.train)

    def split(rows, path):
        return {"texts": [r[0] for _, r in rows],
                "pairs": [r[1] for _, r in rows] if args.text_pair_column else None,
                "labels": [labels.id(r[-1], path, line) for line, r in rows],
                "lines": [line for line, _ in rows]}

    task = {"names": labels.names, "eval": split(eval_rows, args.eval)}
    if args.max_train_examples and args.max_train_examples < len(train_rows):
        keep = np.random.default_rng(args.seed).choice(len(train_rows), args.max_train_examples,
                                                       replace=False)
        train_rows = [train_rows[i] for i in sorted(keep)]
    return {**task, "train": split(train_rows, args.train)}


def prepare_tokenizer(args, ctx, task: dict) -> minibert.Tokenizer:
    """Rank 0 loads or trains the tokenizer and saves it in --out; every rank reads that copy."""
    tok_dir = args.out / "tokenizer"
    if ctx.is_main and not (args.resume and (tok_dir / "tokenizer.json").is_file()):
        if args.init_from:
            tok = minibert.Tokenizer.from_pretrained(args.init_from)
        else:
            texts = task["train"]["texts"] + (task["train"]["pairs"] or [])
            tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=args.vocab_size,
                                                         cache_dir=args.cache_dir)
        tok.save(tok_dir)
    barrier(ctx)
    return minibert.Tokenizer.from_pretrained(tok_dir)


def build_model(args, tok, names: list[str]) -> minibert.BertForSequenceClassification:
    cls = minibert.BertForSequenceClassification
    if args.init_from:
        stored = read_config(args.init_from)
        labels = stored.get("id2label") or {}
        other_head = "BertForSequenceClassification" in (stored.get("architectures") or []) \
            and [labels[k] for k in sorted(labels, key=int)] != names
        if other_head:  # a classifier for other classes: keep its encoder, start a new head
            log.info("%s classifies other labels; its classifier head is replaced",
                     args.init_from)
            encoder = minibert.BertModel.from_pretrained(args.init_from)
            model = cls(encoder.config, len(names), id2label=names)
            model.bert.load_state_dict(encoder.state_dict())
        else:  # usually an MLM checkpoint: the pooler and classifier start fresh
            model = cls.from_pretrained(args.init_from, num_labels=len(names), id2label=names)
    else:
        config = minibert.BertConfig.preset(args.preset, vocab_size=tok.vocab_size,
                                            pad_token_id=tok.pad_id)
        model = cls(config, len(names), id2label=names)
    if args.seq_len > model.config.max_position_embeddings:
        raise ValueError(f"--seq-len {args.seq_len} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}")
    if model.config.vocab_size < tok.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings; is it the checkpoint's own?")
    return model


@torch.no_grad()
def predict(model, features: list[dict], collate, batch_size: int, precision: str,
            device: torch.device) -> tuple[np.ndarray, float]:
    """(predicted class per feature, mean cross-entropy), in batches of similar length."""
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")  # little padding
    preds, loss_sum = np.zeros(len(features), dtype=np.int64), 0.0
    for b0 in range(0, len(order), batch_size):
        idx = order[b0:b0 + batch_size]
        batch = {k: v.to(device) for k, v in collate([features[i] for i in idx]).items()}
        with autocast_context(precision, device):
            out = model(**batch)
        loss_sum += float(out.loss) * len(idx)
        preds[idx] = out.logits.argmax(-1).cpu().numpy()
    return preds, loss_sum / len(features)


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = None
    try:
        ctx = init_distributed(args.device)
        logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING,
                            format="%(message)s", stream=sys.stdout)
        if args.keep_freed_memory and not minibert.runtime.keep_freed_memory():
            log.warning("--keep-freed-memory has no effect here: it needs glibc's malloc")
        check_args(args, ctx)
        task = load_task(args)  # the files are read and checked before --out is touched
        with open_run(args.out, args.resume, main=ctx.is_main):
            run(args, ctx, task)
    except (ValueError, OSError, CheckpointError, ImportError) as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if ctx is not None:
            cleanup(ctx)
    return 0


def run(args, ctx, task: dict) -> None:
    minibert.set_seed(args.seed)
    names, n_train = task["names"], len(task["train"]["labels"])
    if n_train < args.batch_size:
        raise ValueError(f"{args.train} gives {n_train} training examples, fewer than one "
                         f"batch; lower --batch-size below {n_train}")
    if ctx.is_main:
        save_labels(args, names)
    tok = prepare_tokenizer(args, ctx, task)
    model = build_model(args, tok, names)
    train_set, eval_set = (encode_classification(tok, task[s]["texts"], task[s]["labels"],
                                                 task[s]["pairs"], max_len=args.seq_len)
                           for s in ("train", "eval"))
    truncated = sum(len(f["input_ids"]) == args.seq_len for f in train_set)
    steps_per_epoch = n_train // args.batch_size  # full, length-grouped batches
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    log.info("%d training and %d evaluation examples, %d classes (%s); %d steps of %d "
             "(%d per epoch); %d training texts reach --seq-len %d", n_train, len(eval_set),
             len(names), ", ".join(names[:10]), max_steps, args.batch_size, steps_per_epoch,
             truncated, args.seq_len)
    collate = TaskCollator(tok.pad_id)
    precision = resolve_precision(args.precision, ctx.device)
    eval_batch = args.micro_batch_size or args.batch_size // ctx.world_size
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch, and at the end
        preds, loss = predict(raw_model, eval_set, collate, eval_batch, precision, ctx.device)
        last["preds"] = preds
        last["scores"] = classification_scores(task["eval"]["labels"], preds, len(names))
        return {"accuracy": last["scores"]["accuracy"], "f1": last["scores"]["f1"],
                "eval_loss": loss}

    cfg = TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=max_steps, decay_steps=args.decay_steps,
        lr=args.lr or (5e-5 if args.init_from else 5e-4), min_lr=args.min_lr,
        warmup=args.warmup_ratio, weight_decay=args.weight_decay, precision=args.precision,
        seed=args.seed, log_every=args.log_every, eval_every=steps_per_epoch,
        save_every=steps_per_epoch, progress=not args.no_progress)
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
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        summary = write_results(args, model, tok, task, result, last["scores"], last["preds"])
        log.info("eval accuracy %.4f, macro-F1 %.4f over %d examples; model in %s",
                 summary["accuracy"], summary["f1"], summary["eval_examples"],
                 args.out / "final")


def save_labels(args, names: list[str]) -> None:
    """labels.json: written by a new run, compared by a resumed one."""
    path = args.out / "labels.json"
    if args.resume and path.is_file():
        before = json.loads(path.read_text())["id2label"]
        if before != names:
            raise ValueError(f"cannot resume: the run was trained on the labels {before} but "
                             f"{args.train} now has {names}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id2label": names}, indent=2) + "\n")


def write_results(args, model, tok, task, result, scores, preds) -> dict:
    model.save_pretrained(args.out / "final", tokenizer=tok)
    names = task["names"]
    summary = {"accuracy": result["accuracy"], "f1": result["f1"],
               "eval_loss": result["eval_loss"], "labels": names,
               "per_class": dict(zip(names, scores["per_class"])),
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
