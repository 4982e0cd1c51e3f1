"""Fine-tune BERT for token classification (NER, POS) on CoNLL-style files.

    python examples/finetune_token_classification.py --train train.conll --eval dev.conll \\
        --init-from runs/mini/final --out runs/ner

Each line holds `word ... label` (whitespace- or tab-separated), a blank line ends a sentence,
-DOCSTART- lines are ignored. A word's first piece carries its label; its other pieces are
left out of the loss and the prediction. Without --init-from, a tokenizer is trained on the
training words and the weights start at random (the baseline). Wiring only: the library
reads (`read_conll`), checks tags (`metrics.spans`), encodes (`encode_token_classification`),
reads words back (`word_predictions`) and scores (`span_f1`, as seqeval). Outputs in --out:
metrics.jsonl, eval.json, predictions.conll, labels.json, checkpoints/, final/. Bad input:
one line naming the file and the line, exit status 2, and nothing in --out is touched.
"""

from __future__ import annotations

import argparse
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
from minibert.data import (IGNORE_INDEX, LabelMap, TaskCollator, encode_token_classification,
                           read_conll, word_predictions)
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError, train
from minibert.hf import read_config
from minibert.metrics import SCHEMES, accuracy, span_f1, spans
from minibert.precision import autocast_context, resolve_precision
from minibert.rundir import open_run

log = logging.getLogger("finetune_token")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", type=Path, required=True, help="CoNLL-style: `word label` lines")
    p.add_argument("--eval", type=Path, required=True, help="CoNLL-style, the training tags")
    p.add_argument("--scheme", choices=list(SCHEMES), default="IOB2",
                   help="how tags form entities for the span F1 (BIO is IOB2)")
    p.add_argument("--max-train-examples", type=int, help="a random subset of sentences")
    p.add_argument("--seq-len", type=int, default=128, help="pieces per window, [CLS] and "
                   "[SEP] included. A longer sentence is cut into consecutive windows of whole "
                   "words, no overlap, so every word is predicted exactly once (one too long "
                   "for a window alone keeps its first pieces)")
    p.add_argument("--vocab-size", type=int, default=8192, help="without --init-from")
    p.add_argument("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    p.add_argument("--init-from", type=Path, help="a minibert or transformers checkpoint "
                   "folder with its tokenizer; default: random weights and a new tokenizer")
    p.add_argument("--preset", default="mini", help=f"without --init-from: {', '.join(PRESETS)}")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, help="overrides --epochs; may change on --resume")
    p.add_argument("--decay-steps", type=int, help="the schedule's horizon, fixed for the run; "
                   "steps past it run at --min-lr (default: the steps of the first start)")
    p.add_argument("--batch-size", type=int, default=32, help="global: windows per step")
    p.add_argument("--micro-batch-size", type=int, help="per rank; default batch / world size")
    p.add_argument("--lr", type=float, help="default 5e-5 with --init-from, 5e-4 without")
    p.add_argument("--min-lr", type=float, default=0.0, help="the rate at the horizon and after")
    p.add_argument("--warmup-ratio", type=float, default=0.1, help="fraction of --decay-steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--out", type=Path, default=Path("runs/finetune_token"))
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def check_args(args, ctx) -> None:
    """The mistakes worth one clear line, before any work is done."""
    if not args.init_from and args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    for flag in ("epochs", "max_steps", "decay_steps", "max_train_examples", "batch_size",
                 "micro_batch_size", "log_every"):
        if (value := getattr(args, flag)) is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.seq_len < 3:
        raise ValueError("--seq-len must be at least 3 ([CLS], one piece, [SEP])")
    if not 0 <= args.warmup_ratio < 1:
        raise ValueError(f"--warmup-ratio {args.warmup_ratio} must lie in [0, 1)")
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr {args.lr} must be positive")
    if not 0 <= args.min_lr <= (args.lr or 5e-5):
        raise ValueError(f"--min-lr {args.min_lr} must lie between 0 and --lr")
    per_rank, rest = divmod(args.batch_size, ctx.world_size)
    micro = args.micro_batch_size or per_rank
    if rest or per_rank == 0 or per_rank % micro:
        raise ValueError(f"--batch-size {args.batch_size} must split into {ctx.world_size} "
                         f"process(es) x whole micro-batches of --micro-batch-size {micro}")
    resolve_precision(args.precision, ctx.device)
    if args.init_from:
        read_config(args.init_from)


def load_task(args) -> dict:
    """Sentences of both files, every tag checked against --scheme, as the training tag ids."""
    train_s, eval_s = read_conll(args.train), read_conll(args.eval)
    for path, sentences in ((args.train, train_s), (args.eval, eval_s)):
        first = {}  # each tag, and the line it first appears on
        for s in sentences:
            for i, tag in enumerate(s.labels):
                first.setdefault(tag, s.line + i)
        for tag, line in first.items():
            try:
                spans([tag], args.scheme)  # a tag the scheme does not have raises
            except ValueError as e:
                raise ValueError(f"{path}, line {line}: {e}") from None
    labels = LabelMap.from_labels([t for s in train_s for t in s.labels], args.train, "word")
    if args.max_train_examples and args.max_train_examples < len(train_s):
        keep = np.random.default_rng(args.seed).choice(len(train_s), args.max_train_examples,
                                                       replace=False)
        train_s = [train_s[i] for i in sorted(keep)]
    ids = [[labels.id(t, args.eval, s.line + i) for i, t in enumerate(s.labels)] for s in eval_s]
    return {"names": labels.names, "train": train_s, "eval": eval_s, "eval_ids": ids,
            "train_ids": [[labels.id(t, args.train, s.line + i) for i, t in enumerate(s.labels)]
                          for s in train_s]}


def prepare_tokenizer(args, ctx, task: dict) -> minibert.Tokenizer:
    """Rank 0 loads or trains the tokenizer and saves it in --out; every rank reads that copy."""
    tok_dir = args.out / "tokenizer"
    if ctx.is_main and not (args.resume and (tok_dir / "tokenizer.json").is_file()):
        tok = minibert.Tokenizer.from_pretrained(args.init_from) if args.init_from else \
            minibert.Tokenizer.train_from_iterator([" ".join(s.words) for s in task["train"]],
                                                   args.vocab_size, cache_dir=args.cache_dir)
        tok.save(tok_dir)
    barrier(ctx)
    return minibert.Tokenizer.from_pretrained(tok_dir)


def build_model(args, tok, names: list[str]) -> minibert.BertForTokenClassification:
    cls = minibert.BertForTokenClassification
    if args.init_from:
        stored = read_config(args.init_from)
        old = stored.get("id2label") or {}
        if cls.__name__ in (stored.get("architectures") or []) and \
                [old[k] for k in sorted(old, key=int)] != names:  # a tagger of other tags
            encoder = cls.from_pretrained(args.init_from).bert  # its encoder, a new head
            model = cls(encoder.config, len(names), id2label=names)
            model.bert = encoder
        else:
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
def predict(model, features, collate, batch_size, precision, device) -> tuple[list, float]:
    """(argmax tag id at every token of each feature, mean cross-entropy over the words)."""
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")  # little padding
    preds, loss_sum, words = [None] * len(features), 0.0, 0
    for b0 in range(0, len(order), batch_size):
        idx = order[b0:b0 + batch_size]
        batch = {k: v.to(device) for k, v in collate([features[i] for i in idx]).items()}
        with autocast_context(precision, device):
            out = model(**batch)
        n = int((batch["labels"] != IGNORE_INDEX).sum())  # every window holds a word
        loss_sum, words = loss_sum + float(out.loss) * n, words + n
        for i, row in zip(idx, out.logits.argmax(-1).cpu().numpy()):
            preds[i] = row
    return preds, loss_sum / words


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = None
    try:
        ctx = init_distributed(args.device)
        logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING,
                            format="%(message)s", stream=sys.stdout)
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
    names = task["names"]
    if ctx.is_main:
        save_labels(args, names)
    tok = prepare_tokenizer(args, ctx, task)
    model = build_model(args, tok, names)
    train_set, eval_set = (encode_token_classification(tok, [s.words for s in task[k]],
                                                       task[k + "_ids"], args.seq_len)
                           for k in ("train", "eval"))
    if len(train_set) < args.batch_size:
        raise ValueError(f"{args.train} gives {len(train_set)} training windows, fewer than "
                         f"one batch; lower --batch-size below {len(train_set)}")
    steps_per_epoch = len(train_set) // args.batch_size
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    log.info("%d training sentences in %d windows, %d eval sentences in %d; %d tags; %d steps",
             len(task["train"]), len(train_set), len(task["eval"]), len(eval_set), len(names),
             max_steps)
    collate, precision = TaskCollator(tok.pad_id), resolve_precision(args.precision, ctx.device)
    gold = [[names[i] for i in s] for s in task["eval_ids"]]
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch, and at the end
        preds, loss = predict(raw_model, eval_set, collate, args.micro_batch_size or
                              args.batch_size // ctx.world_size, precision, ctx.device)
        ids = word_predictions(eval_set, preds)  # per sentence, per word: a tag id
        last["tags"] = [[names[i] for i in s] for s in ids]
        last["scores"] = span_f1(gold, last["tags"], args.scheme)
        # Not "precision": the engine's result already holds the dtype under that key.
        return {"f1": last["scores"]["f1"], "entity_precision": last["scores"]["precision"],
                "entity_recall": last["scores"]["recall"], "eval_loss": loss,
                "accuracy": accuracy([i for s in task["eval_ids"] for i in s],
                                     [i for s in ids for i in s])}

    cfg = TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=max_steps, decay_steps=args.decay_steps,
        lr=args.lr or (5e-5 if args.init_from else 5e-4), min_lr=args.min_lr,
        warmup=args.warmup_ratio, weight_decay=args.weight_decay, precision=args.precision,
        seed=args.seed, log_every=args.log_every, eval_every=steps_per_epoch,
        save_every=steps_per_epoch, progress=not args.no_progress)
    identity = {"train file": sha256_file(args.train), "--seq-len": args.seq_len,
                "--max-train-examples": args.max_train_examples, "--scheme": args.scheme,
                "tokenizer": tok.fingerprint, "labels": names}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        model.save_pretrained(args.out / "final", tokenizer=tok)
        summary = {**{k: result[k] for k in ("f1", "entity_precision", "entity_recall",
                                              "accuracy", "eval_loss")},
                   "per_type": last["scores"]["per_type"], "labels": names,
                   "scheme": args.scheme, "train_sentences": len(task["train"]),
                   "train_windows": len(train_set), "eval_sentences": len(task["eval"]),
                   "eval_windows": len(eval_set), "eval_words": sum(map(len, gold)),
                   **{k: result[k] for k in ("steps", "tokens_seen", "wall_seconds",
                                             "precision")}}
        lines = ["\n".join(f"{w}\t{g}\t{p}" for w, g, p in zip(s.words, g_s, p_s)) + "\n"
                 for s, g_s, p_s in zip(task["eval"], gold, last["tags"])]
        write_files_atomically(args.out, {"predictions.conll": "\n".join(lines),
                                          "eval.json": json.dumps(summary, indent=2) + "\n"})
        log.info("eval entity F1 %.4f, word accuracy %.4f; model in %s", summary["f1"],
                 summary["accuracy"], args.out / "final")


def save_labels(args, names: list[str]) -> None:
    """labels.json: written by a new run, compared by a resumed one."""
    path = args.out / "labels.json"
    if args.resume and path.is_file():
        if (before := json.loads(path.read_text())["id2label"]) != names:
            raise ValueError(f"cannot resume: the run was trained on the tags {before} but "
                             f"{args.train} now has {names}")
        return
    write_files_atomically(args.out, {"labels.json": json.dumps({"id2label": names}) + "\n"})


if __name__ == "__main__":
    sys.exit(main())
