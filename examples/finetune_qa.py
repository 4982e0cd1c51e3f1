"""Fine-tune BERT for extractive question answering on SQuAD v1.1 or v2.0 JSON.

    python examples/finetune_qa.py --train train-v1.1.json --eval dev-v1.1.json \\
        --init-from runs/mini/final --out runs/squad        # add --version-2 for SQuAD 2.0

Wiring only: `read_squad` reads and checks the questions; `encode_qa` cuts each context into
windows of --seq-len tokens (the training examples, targets the answer's first and last
token, or [CLS] where a window lacks it); `TaskCollator` pads; `engine.train` trains; after
every epoch `best_span` picks each question's best span over its windows, in characters of
the context, and `squad_scores` scores it. Without --init-from, a WordPiece tokenizer is
trained on the training questions and contexts and the weights start random (the baseline).
Writes metrics.jsonl, eval.json, predictions.json (id -> answer, "" for none), checkpoints/
and final/ (model + tokenizer, for minibert and transformers) into --out. Bad input: one line
naming the file (and question) on stderr, exit status 2, and --out untouched.
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
from minibert.data import TaskCollator, best_span, encode_qa, read_squad
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError, train
from minibert.hf import read_config
from minibert.metrics import squad_scores
from minibert.precision import autocast_context, resolve_precision
from minibert.rundir import open_run

log = logging.getLogger("finetune_qa")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    arg = p.add_argument
    arg("--train", type=Path, required=True, help="SQuAD JSON")
    arg("--eval", type=Path, required=True, help="SQuAD JSON")
    arg("--version-2", action="store_true", help="SQuAD 2.0: unanswerable (is_impossible) "
        "questions are allowed, and an answer may be none")
    arg("--max-train-examples", type=int, help="a random subset of questions (by --seed)")
    arg("--seq-len", type=int, default=384, help="tokens per window")
    arg("--doc-stride", type=int, help="context tokens that consecutive windows share: the "
        "overlap, as transformers' stride (BERT's run_squad.py gave the name to the step "
        "between windows); default --seq-len // 3, 128 at 384")
    arg("--max-question-len", type=int, default=64, help="longer questions are cut (tokens)")
    arg("--max-answer-length", type=int, default=30, help="tokens")
    arg("--n-best", type=int, default=20, help="start and end candidates per window")
    arg("--null-score-diff-threshold", type=float, default=0.0, help="with --version-2: no "
        "answer when the [CLS] score beats the best span's by more than this")
    arg("--vocab-size", type=int, default=8192, help="without --init-from")
    arg("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    arg("--init-from", type=Path, help="a minibert or transformers checkpoint folder with its "
        "tokenizer; default: random weights and a new tokenizer")
    arg("--preset", default="mini", help=f"without --init-from: {', '.join(PRESETS)}")
    arg("--epochs", type=int, default=2)
    arg("--max-steps", type=int, help="overrides --epochs; may change on --resume")
    arg("--decay-steps", type=int, help="the learning-rate schedule's horizon, fixed for the "
        "run; later steps run at --min-lr (default: the steps of the first start)")
    arg("--batch-size", type=int, default=32, help="global: windows per step")
    arg("--micro-batch-size", type=int, help="per rank; default batch / world size")
    arg("--lr", type=float, help="default 5e-5 with --init-from, 5e-4 without")
    arg("--min-lr", type=float, default=0.0, help="the rate at the horizon and after")
    arg("--warmup-ratio", type=float, default=0.1, help="fraction of --decay-steps")
    arg("--weight-decay", type=float, default=0.01)
    arg("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
        help="auto: bf16 on a CUDA GPU that has it and on a CPU with fast native bf16")
    arg("--seed", type=int, default=0)
    arg("--device", choices=["auto", "cpu", "cuda"], default="auto")
    arg("--out", type=Path, default=Path("runs/finetune_qa"))
    arg("--log-every", type=int, default=10)
    arg("--resume", action="store_true", help="continue from the last checkpoint")
    arg("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    if args.doc_stride is None:
        args.doc_stride = args.seq_len // 3
    return args


def check_args(args, ctx) -> None:
    """The mistakes worth one clear line, before any work is done."""
    for flag in ("epochs", "max_steps", "decay_steps", "max_train_examples", "batch_size",
                 "micro_batch_size", "log_every", "max_question_len", "max_answer_length",
                 "n_best"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if not args.init_from and args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    # A window holds [CLS] question [SEP] context [SEP]: with a one-token question, seq_len - 4
    # context tokens. encode_qa names a longer question that leaves no more than --doc-stride.
    if not 0 <= args.doc_stride < args.seq_len - 4:
        raise ValueError(f"--doc-stride {args.doc_stride} must lie in [0, {args.seq_len - 4}):"
                         f" windows of --seq-len {args.seq_len} share less than they hold")
    if not 0 <= args.warmup_ratio < 1:
        raise ValueError(f"--warmup-ratio {args.warmup_ratio} must lie in [0, 1)")
    lr = args.lr or (5e-5 if args.init_from else 5e-4)
    if not (lr > 0 and 0 <= args.min_lr <= lr):
        raise ValueError(f"--lr {lr} must be positive and --min-lr {args.min_lr} lie in [0, --lr]")
    per_rank, rest = divmod(args.batch_size, ctx.world_size)
    micro = args.micro_batch_size or per_rank
    if rest or per_rank == 0 or per_rank % micro:
        raise ValueError(f"--batch-size {args.batch_size} must split into {ctx.world_size} "
                         f"process(es) x whole micro-batches of --micro-batch-size {micro}")
    resolve_precision(args.precision, ctx.device)  # e.g. fp16 on a CPU
    if args.init_from:
        read_config(args.init_from)  # a missing folder, or a training checkpoint, said at once


def load_task(args) -> dict:
    """The questions of both files, checked; a random subset of the training ones."""
    task = {}
    for split, path in (("train", args.train), ("eval", args.eval)):
        examples = read_squad(path, version_2=True)  # SQuAD 2.0 marks are refused just below
        unanswerable = next((ex for ex in examples if ex.is_impossible), None)
        if unanswerable is not None and not args.version_2:
            raise ValueError(f"{path}: question {unanswerable.id!r} is marked is_impossible, "
                             f"a SQuAD 2.0 question; pass --version-2 to train and evaluate "
                             f"with unanswerable questions")
        task[split] = examples
    n = len(task["train"])
    if args.max_train_examples and args.max_train_examples < n:
        keep = np.random.default_rng(args.seed).choice(n, args.max_train_examples, replace=False)
        task["train"] = [task["train"][i] for i in sorted(keep)]
    return task


def prepare_tokenizer(args, ctx, train_examples) -> minibert.Tokenizer:
    """Rank 0 loads or trains the tokenizer and saves it in --out; every rank reads that copy."""
    tok_dir = args.out / "tokenizer"
    if ctx.is_main and not (args.resume and (tok_dir / "tokenizer.json").is_file()):
        if args.init_from:
            tok = minibert.Tokenizer.from_pretrained(args.init_from)
        else:  # each context once, however many questions it has
            texts = [ex.question for ex in train_examples] + \
                list(dict.fromkeys(ex.context for ex in train_examples))
            tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=args.vocab_size,
                                                         cache_dir=args.cache_dir)
        tok.save(tok_dir)
    barrier(ctx)
    return minibert.Tokenizer.from_pretrained(tok_dir)


def build_model(args, tok) -> minibert.BertForQuestionAnswering:
    cls = minibert.BertForQuestionAnswering
    if args.init_from:  # from an MLM checkpoint the span scorer starts fresh
        model = cls.from_pretrained(args.init_from)
    else:
        model = cls(minibert.BertConfig.preset(args.preset, vocab_size=tok.vocab_size,
                                               pad_token_id=tok.pad_id))
    if args.seq_len > model.config.max_position_embeddings:
        raise ValueError(f"--seq-len {args.seq_len} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}")
    if model.config.vocab_size < tok.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings; is it the checkpoint's own?")
    return model


@torch.no_grad()
def span_logits(model, features, collate, batch_size, precision, device) -> tuple[list, list]:
    """(start logits, end logits) of every feature, in batches of similar length."""
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")
    starts, ends = [None] * len(features), [None] * len(features)
    for b0 in range(0, len(order), batch_size):
        idx = order[b0:b0 + batch_size]
        batch = collate([features[i] for i in idx])
        inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask",
                                                    "token_type_ids")}
        with autocast_context(precision, device):
            out = model(**inputs)
        start, end = out.start_logits.float().cpu(), out.end_logits.float().cpu()  # (B, T)
        for row, i in enumerate(idx):
            starts[i], ends[i] = start[row], end[row]
    return starts, ends


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
    tok = prepare_tokenizer(args, ctx, task["train"])
    model = build_model(args, tok)
    train_set, eval_set = (encode_qa(tok, task[s], max_len=args.seq_len,
                                     doc_stride=args.doc_stride,
                                     max_question_len=args.max_question_len)
                           for s in ("train", "eval"))
    if len(train_set) < args.batch_size:
        raise ValueError(f"{args.train} gives {len(train_set)} training windows, fewer than "
                         f"one batch; lower --batch-size below {len(train_set)}")
    steps_per_epoch = len(train_set) // args.batch_size
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    log.info("%d training questions in %d windows, %d evaluation questions in %d; %d steps "
             "of %d (%d per epoch)", len(task["train"]), len(train_set), len(task["eval"]),
             len(eval_set), max_steps, args.batch_size, steps_per_epoch)
    collate = TaskCollator(tok.pad_id)
    precision = resolve_precision(args.precision, ctx.device)
    gold = {ex.id: [text for text, _ in ex.answers] for ex in task["eval"]}  # [] if none
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch, and at the end
        starts, ends = span_logits(raw_model, eval_set, collate, args.micro_batch_size or
                                   args.batch_size // ctx.world_size, precision, ctx.device)
        spans = best_span(starts, ends, eval_set, task["eval"], args.max_answer_length,
                          args.n_best, version_2=args.version_2,
                          null_score_diff_threshold=args.null_score_diff_threshold)
        last["predictions"] = {p.id: p.text for p in spans}
        return squad_scores(last["predictions"], gold)

    cfg = TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=max_steps, decay_steps=args.decay_steps,
        lr=args.lr or (5e-5 if args.init_from else 5e-4), min_lr=args.min_lr,
        warmup=args.warmup_ratio, weight_decay=args.weight_decay, precision=args.precision,
        seed=args.seed, log_every=args.log_every, eval_every=steps_per_epoch,
        save_every=steps_per_epoch, progress=not args.no_progress)
    # What --resume compares besides the model and training settings: the same questions,
    # cut into the same windows by the same tokenizer.
    identity = {"train file": sha256_file(args.train),
                "--max-train-examples": args.max_train_examples, "--seq-len": args.seq_len,
                "--doc-stride": args.doc_stride, "--max-question-len": args.max_question_len,
                "--version-2": args.version_2, "tokenizer": tok.fingerprint}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        model.save_pretrained(args.out / "final", tokenizer=tok)
        summary = {"exact_match": result["exact_match"], "f1": result["f1"],
                   "train_examples": len(task["train"]), "train_windows": len(train_set),
                   "eval_examples": len(task["eval"]), "version_2": args.version_2,
                   **{k: result[k] for k in ("steps", "tokens_seen", "wall_seconds",
                                             "precision")}}
        write_files_atomically(args.out, {  # eval.json last: it marks the results complete
            "predictions.json": json.dumps(last["predictions"], indent=2,
                                           ensure_ascii=False) + "\n",
            "eval.json": json.dumps(summary, indent=2) + "\n"})
        log.info("eval exact match %.2f, F1 %.2f over %d questions; model in %s",
                 summary["exact_match"], summary["f1"], summary["eval_examples"],
                 args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
