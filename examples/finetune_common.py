"""The wiring the fine-tuning scripts share: flags, their checks, start-up and exit codes,
reading labelled files, the tokenizer, the model, the training settings and the scores.

finetune_classification.py, finetune_token_classification.py, finetune_qa.py and
finetune_multitask.py import it (examples/ is on sys.path when they run as scripts, and
they put it there when imported by file path). Each script keeps what is its own: its data
flags and their checks, its task's evaluation, what --resume compares, and its outputs.
The errors here are the scripts' one-line messages: a ValueError or OSError ends a run with
"error: ..." and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

import minibert
from minibert import memory
from minibert.atomic import write_files_atomically
from minibert.checkpoint import CheckpointError
from minibert.config import PRESETS
from minibert.data import (LabelMap, encode_classification, encode_token_classification,
                           read_conll, read_table, word_predictions)
from minibert.distributed import DistContext, barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError
from minibert.hf import read_config, require_safetensors
from minibert.metrics import accuracy, classification_scores, span_f1, spans
from minibert.precision import resolve_precision
from minibert.predict import Predictions
from minibert.rundir import open_run

log = logging.getLogger("finetune")


# ---- flags -----------------------------------------------------------------------------------

def add_finetune_args(p: argparse.ArgumentParser, *, out: str, unit: str = "examples",
                      epochs: int = 3,
                      epochs_help: str = "passes over the training data") -> None:
    """The model, training and output flags of every fine-tuning script. `unit` is what a
    batch holds (examples, windows); `out` the default --out."""
    m = p.add_argument_group("model")
    m.add_argument("--init-from", type=Path, help="a minibert or transformers checkpoint "
                   "folder with its tokenizer; default: random weights and a new tokenizer")
    m.add_argument("--preset", default="mini", help=f"without --init-from: {', '.join(PRESETS)}")
    m.add_argument("--vocab-size", type=int, default=8192, help="without --init-from")
    m.add_argument("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    m.add_argument("--dropout", type=float, help="hidden and attention dropout; default the "
                   "checkpoint's, or 0.1 for random weights (BERT's)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=int, default=epochs, help=epochs_help)
    t.add_argument("--max-steps", type=int, help="stop after this many steps (overrides --epochs); "
                   "may change on --resume to stop earlier or go further")
    t.add_argument("--decay-steps", type=int, help="the learning-rate schedule's horizon, fixed "
                   "for the whole run; steps past it run at --min-lr (default: the steps of the "
                   "run's first start)")
    t.add_argument("--batch-size", type=int, default=32, help=f"global: {unit} per step")
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
    r.add_argument("--out", type=Path, default=Path(out))
    r.add_argument("--log-every", type=int, default=10)
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    r.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")


def learning_rate(args) -> float:
    """--lr, or its default: 5e-5 to fine-tune a checkpoint, 5e-4 from random weights."""
    return args.lr if args.lr is not None else (5e-5 if args.init_from else 5e-4)


def check_finetune_args(args, ctx: DistContext, positive: Sequence[str] = ()) -> None:
    """The mistakes in the shared flags worth one clear line, before any work is done;
    `positive` names the script's own flags that must be at least 1 too."""
    if not args.init_from and args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    require_safetensors()  # the model is saved at the end: said now, not after training
    for flag in ("epochs", "max_steps", "decay_steps", "batch_size", "micro_batch_size",
                 "log_every", *positive):
        if (value := getattr(args, flag)) is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if not 0 <= args.warmup_ratio < 1:
        raise ValueError(f"--warmup-ratio {args.warmup_ratio} must lie in [0, 1)")
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr {args.lr} must be positive")
    if not 0 <= args.min_lr <= learning_rate(args):
        raise ValueError(f"--min-lr {args.min_lr} must lie between 0 and --lr "
                         f"({learning_rate(args)})")
    if not args.weight_decay >= 0:
        raise ValueError(f"--weight-decay {args.weight_decay} must be 0 or more")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise ValueError(f"--dropout {args.dropout} must lie in [0, 1)")
    per_rank, rest = divmod(args.batch_size, ctx.world_size)
    micro = args.micro_batch_size or per_rank
    if rest or per_rank == 0 or per_rank % micro:
        raise ValueError(f"--batch-size {args.batch_size} must split into {ctx.world_size} "
                         f"process(es) x whole micro-batches of --micro-batch-size {micro}")
    resolve_precision(args.precision, ctx.device)  # e.g. fp16 on a CPU
    if args.init_from:
        read_config(args.init_from)  # a missing folder, or a training checkpoint, said at once


# ---- start-up, errors, exit status -----------------------------------------------------------

def run_script(args, prepare: Callable[[Any, DistContext], Any],
               run: Callable[[Any, DistContext, Any], None]) -> int:
    """A script's life: `prepare(args, ctx)` checks the flags and reads the input before
    --out is touched; `run(args, ctx, data)` trains inside the run folder. Bad input or
    flags: one line on stderr and status 2; a failed run: status 1; 0 otherwise."""
    ctx = None
    ok = False
    try:
        ctx = init_distributed(args.device)
        logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING,
                            format="%(message)s", stream=sys.stdout)
        if args.keep_freed_memory and not memory.keep_freed_memory():
            log.warning("--keep-freed-memory has no effect here: it needs glibc's malloc")
        data = prepare(args, ctx)
        with open_run(args.out, args.resume, main=ctx.is_main):
            run(args, ctx, data)
        ok = True
    except (ValueError, OSError, CheckpointError, ImportError) as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if ctx is not None:
            cleanup(ctx, wait=ok)
    return 0


def finished(result: dict, ctx: DistContext) -> bool:
    """True on rank 0 of a run that reached its last step; an interrupted one says how to
    go on."""
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    return ctx.is_main and not result["interrupted"]


# ---- labelled files: read, checked, labels as class ids --------------------------------------

def random_subset(items: list, n: Optional[int], seed: int) -> list:
    """`n` of the items, chosen by `seed`, in their order (all of them without `n`)."""
    if not n or n >= len(items):
        return items
    keep = np.random.default_rng(seed).choice(len(items), n, replace=False)
    return [items[i] for i in sorted(keep)]


def read_table_task(train_file: Path, eval_file: Path, text: str, pair: Optional[str],
                    label: str, max_train: Optional[int] = None, seed: int = 0) -> dict:
    """{"names", "train", "eval"}: per split its texts, pairs (or None), class ids and file
    lines; the classes are the training file's."""
    columns = [text] + ([pair] if pair else []) + [label]
    train_rows, eval_rows = read_table(train_file, columns), read_table(eval_file, columns)
    labels = LabelMap.from_labels([r[-1] for _, r in train_rows], train_file)

    def split(rows, path):
        return {"texts": [r[0] for _, r in rows], "pairs": [r[1] for _, r in rows] if pair
                else None, "labels": [labels.id(r[-1], path, line) for line, r in rows],
                "lines": [line for line, _ in rows]}

    return {"names": labels.names, "eval": split(eval_rows, eval_file),
            "train": split(random_subset(train_rows, max_train, seed), train_file)}


def read_conll_task(train_file: Path, eval_file: Path, scheme: str,
                    max_train: Optional[int] = None, seed: int = 0) -> dict:
    """{"names", "train", "eval"}: per split its sentences and their tags as ids; every tag
    is checked against `scheme`, and the tags are the training file's."""
    train_s, eval_s = read_conll(train_file), read_conll(eval_file)
    for path, sentences in ((train_file, train_s), (eval_file, eval_s)):
        first = {}  # each tag, and the line it first appears on
        for s in sentences:
            for i, tag in enumerate(s.labels):
                first.setdefault(tag, s.line + i)
        for tag, line in first.items():
            try:
                spans([tag], scheme)  # a tag the scheme does not have raises
            except ValueError as e:
                raise ValueError(f"{path}, line {line}: {e}") from None
    labels = LabelMap.from_labels([t for s in train_s for t in s.labels], train_file, "word")

    def split(sents, path):
        return {"sentences": sents, "labels": [[labels.id(t, path, s.line + i)
                                                for i, t in enumerate(s.labels)] for s in sents]}

    return {"names": labels.names, "eval": split(eval_s, eval_file),
            "train": split(random_subset(train_s, max_train, seed), train_file)}


def task_texts(kind: str, split: dict) -> list[str]:
    """The texts of a split, to train a tokenizer on."""
    if kind == "sequence":
        return split["texts"] + (split["pairs"] or [])
    return [" ".join(s.words) for s in split["sentences"]]


def encode_task(tok, kind: str, split: dict, seq_len: int) -> list[dict]:
    """A read split as model inputs with their targets: one per row, or windows of words."""
    if kind == "sequence":
        return encode_classification(tok, split["texts"], split["labels"], split["pairs"],
                                     max_len=seq_len)
    return encode_token_classification(tok, [s.words for s in split["sentences"]],
                                       split["labels"], seq_len)


def save_labels(args, names: list[str], what: str = "labels") -> None:
    """labels.json: written by a new run, compared by a resumed one."""
    path = args.out / "labels.json"
    if args.resume and path.is_file():
        if (before := json.loads(path.read_text())["id2label"]) != names:
            raise ValueError(f"cannot resume: the run was trained on the {what} {before} but "
                             f"{args.train} now has {names}")
        return
    write_files_atomically(args.out, {"labels.json": json.dumps({"id2label": names}, indent=2)
                                      + "\n"})


# ---- tokenizer, model, training settings -----------------------------------------------------

def prepare_tokenizer(args, ctx: DistContext, texts: Iterable[str]) -> minibert.Tokenizer:
    """Rank 0 loads the checkpoint's tokenizer or trains one on `texts`, and saves it in
    --out (a resumed run keeps its own); every rank reads that copy."""
    tok_dir = args.out / "tokenizer"
    if ctx.is_main and not (args.resume and (tok_dir / "tokenizer.json").is_file()):
        tok = minibert.Tokenizer.from_pretrained(args.init_from) if args.init_from else \
            minibert.Tokenizer.train_from_iterator(texts, vocab_size=args.vocab_size,
                                                   cache_dir=args.cache_dir)
        tok.save(tok_dir)
    barrier(ctx)
    return minibert.Tokenizer.from_pretrained(tok_dir)


def build_model(cls, args, tok, **head):
    """`cls(config, **head)` from --init-from (its encoder, and its head when it fits) or
    from --preset with the tokenizer's vocabulary; checked against --seq-len and `tok`.

    A checkpoint of `cls` itself trained for other labels than `head["id2label"]` keeps
    its encoder and gets a new head: its classifier would score the wrong classes."""
    dropout = {} if args.dropout is None else {"hidden_dropout": args.dropout,
                                               "attention_dropout": args.dropout}
    if args.init_from:
        stored = read_config(args.init_from)
        old = stored.get("id2label") or {}
        if "id2label" in head and cls.__name__ in (stored.get("architectures") or []) and \
                [old[k] for k in sorted(old, key=int)] != list(head["id2label"]):
            log.info("%s classifies other labels; its classifier head is replaced",
                     args.init_from)
            encoder = cls.from_pretrained(args.init_from, **dropout).bert
            model = cls(encoder.config, **head)
            model.bert = encoder
        else:  # usually an MLM checkpoint: the task's head starts fresh
            model = cls.from_pretrained(args.init_from, **head, **dropout)
    else:
        model = cls(minibert.BertConfig.preset(args.preset, vocab_size=tok.vocab_size,
                                               pad_token_id=tok.pad_id, **dropout), **head)
    model.config.check_fits(args.seq_len, tok.vocab_size)
    return model


def train_config(args, steps_per_epoch: int) -> TrainConfig:
    """The flags as the engine's settings; an evaluation and a checkpoint every epoch."""
    return TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=args.max_steps or args.epochs * steps_per_epoch,
        decay_steps=args.decay_steps, lr=learning_rate(args), min_lr=args.min_lr,
        warmup=args.warmup_ratio, weight_decay=args.weight_decay, precision=args.precision,
        seed=args.seed, log_every=args.log_every, eval_every=steps_per_epoch,
        save_every=steps_per_epoch, progress=not args.no_progress)


def eval_batch_size(args, ctx: DistContext) -> int:
    """Evaluation batches: a training micro-batch, whose memory the run is known to fit."""
    return args.micro_batch_size or args.batch_size // ctx.world_size


# ---- scores ----------------------------------------------------------------------------------

def sequence_scores(pred: Predictions, split: dict, names: list[str]) -> tuple[dict, list]:
    """(accuracy, macro-F1, per-class scores and eval loss; the predicted class ids)."""
    preds = [int(p) for p in pred.argmax()]
    s = classification_scores(split["labels"], preds, len(names))
    return {"accuracy": s["accuracy"], "f1": s["f1"], "eval_loss": pred.loss,
            "per_class": dict(zip(names, s["per_class"]))}, preds


def token_scores(pred: Predictions, features: list[dict], split: dict, names: list[str],
                 scheme: str) -> tuple[dict, list]:
    """(entity F1, precision, recall as seqeval, word accuracy, eval loss, per-type
    scores; the predicted tags per sentence, one per word)."""
    ids = word_predictions(features, pred.argmax())  # per sentence, per word: a tag id
    tags = [[names[i] for i in s] for s in ids]
    s = span_f1([[names[i] for i in g] for g in split["labels"]], tags, scheme)
    # Not "precision": the engine's result already holds the dtype under that key.
    return {"f1": s["f1"], "entity_precision": s["precision"], "entity_recall": s["recall"],
            "accuracy": accuracy([i for g in split["labels"] for i in g],
                                 [i for p in ids for i in p]),
            "eval_loss": pred.loss, "per_type": s["per_type"]}, tags


def numbers(scores: dict) -> dict:
    """The scores an evaluation logs: the numbers, not the per-class tables."""
    return {k: v for k, v in scores.items() if isinstance(v, float)}
