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

Wiring only: the readers, encoders and TaskCollator of minibert.data, engine.train with the
mixture as its batch order, classification_scores (accuracy, macro-F1) and span_f1 for the
metrics. --epochs counts epoch-equivalents: (all tasks' training examples) / --batch-size
steps, after each of which every task is evaluated. Outputs in --out: metrics.jsonl (keys
"task/metric"), eval.json ({"tasks": {name: scores}}, run totals), checkpoints/ and final/
with one exported single-task folder per task (final/<name>/, loadable by minibert and
transformers). Bad input ends with one line on stderr and exit status 2, before --out is
touched.
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
from minibert.data import (IGNORE_INDEX, LabelMap, TaskCollator, encode_classification,
                           encode_token_classification, read_conll, read_table,
                           word_predictions)
from minibert.data.sampler import TaskMixtureBatches
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError, train
from minibert.hf import read_config
from minibert.metrics import SCHEMES, classification_scores, span_f1, spans
from minibert.multitask import KINDS, check_task_name
from minibert.precision import autocast_context, resolve_precision
from minibert.rundir import open_run

log = logging.getLogger("finetune_multitask")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", action="append", required=True, metavar="NAME:KIND:TRAIN:EVAL",
                   help=f"once per task; KIND is one of {', '.join(KINDS)}")
    p.add_argument("--text-column", help="sequence tasks: the text column")
    p.add_argument("--text-pair-column", help="sequence tasks: a second text, for pairs")
    p.add_argument("--label-column", help="sequence tasks: the label column")
    p.add_argument("--scheme", choices=list(SCHEMES), default="IOB2", help="token tasks' tags")
    p.add_argument("--seq-len", type=int, default=128, help="longer inputs are truncated "
                   "(sequence) or cut into windows of whole words (token)")
    p.add_argument("--vocab-size", type=int, default=8192, help="without --init-from")
    p.add_argument("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    p.add_argument("--init-from", type=Path, help="a minibert or transformers checkpoint "
                   "folder with its tokenizer; default: random weights and a new tokenizer")
    p.add_argument("--preset", default="mini", help=f"without --init-from: {', '.join(PRESETS)}")
    p.add_argument("--epochs", type=int, default=3, help="epoch-equivalents: all training "
                   "examples / --batch-size steps each")
    p.add_argument("--max-steps", type=int, help="overrides --epochs; may change on --resume")
    p.add_argument("--decay-steps", type=int, help="the learning-rate schedule's horizon, "
                   "fixed for the run (default: the steps of the run's first start)")
    p.add_argument("--batch-size", type=int, default=32, help="global: examples per step")
    p.add_argument("--micro-batch-size", type=int, help="per rank; default batch / world size")
    p.add_argument("--lr", type=float, help="default 5e-5 with --init-from, 5e-4 without")
    p.add_argument("--min-lr", type=float, default=0.0, help="the rate at the horizon and after")
    p.add_argument("--warmup-ratio", type=float, default=0.1, help="fraction of --decay-steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--out", type=Path, default=Path("runs/finetune_multitask"))
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def parse_tasks(specs: list[str]) -> list[dict]:
    """--task values as {name, kind, train, eval}; each mistake is one clear error."""
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
        tasks.append({"name": name, "kind": kind, "train": Path(train_file),
                      "eval": Path(eval_file)})
    return tasks


def check_args(args, ctx) -> None:
    """The mistakes worth one clear line, before any work is done."""
    if not args.init_from and args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    for flag in ("epochs", "max_steps", "decay_steps", "batch_size", "micro_batch_size",
                 "log_every"):
        if (value := getattr(args, flag)) is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.seq_len < 5:
        raise ValueError("--seq-len must be at least 5 (the special tokens and some text)")
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


def load_task(args, task: dict) -> dict:
    """The task's training and evaluation examples, read and checked, labels as ids."""
    if task["kind"] == "sequence":
        if not (args.text_column and args.label_column):
            raise ValueError(f"--task {task['name']} is a sequence task: pass --text-column "
                             f"and --label-column")
        columns = [args.text_column] + ([args.text_pair_column] if args.text_pair_column
                                        else []) + [args.label_column]
        rows = {s: read_table(task[s], columns) for s in ("train", "eval")}
        labels = LabelMap.from_labels([r[-1] for _, r in rows["train"]], task["train"])
        for s in ("train", "eval"):
            task[s + "_data"] = {
                "texts": [r[0] for _, r in rows[s]],
                "pairs": [r[1] for _, r in rows[s]] if args.text_pair_column else None,
                "labels": [labels.id(r[-1], task[s], line) for line, r in rows[s]]}
        return {**task, "names": labels.names}
    for s in ("train", "eval"):
        sentences = read_conll(task[s])
        for sent in sentences:  # every tag must be one the scheme has
            for i, tag in enumerate(sent.labels):
                try:
                    spans([tag], args.scheme)
                except ValueError as e:
                    raise ValueError(f"{task[s]}, line {sent.line + i}: {e}") from None
        task[s + "_data"] = sentences
    labels = LabelMap.from_labels([t for s in task["train_data"] for t in s.labels],
                                  task["train"], "word")
    for s in ("train", "eval"):
        task[s + "_ids"] = [[labels.id(t, task[s], x.line + i) for i, t in enumerate(x.labels)]
                            for x in task[s + "_data"]]
    return {**task, "names": labels.names}


def encode(tok, task: dict, split: str, seq_len: int) -> list[dict]:
    if task["kind"] == "sequence":
        d = task[split + "_data"]
        features = encode_classification(tok, d["texts"], d["labels"], d["pairs"], seq_len)
    else:
        features = encode_token_classification(tok, [s.words for s in task[split + "_data"]],
                                               task[split + "_ids"], seq_len)
    for f in features:
        f["task"] = task["name"]
    return features


class MultiTaskCollator(TaskCollator):
    """TaskCollator's batch plus `task`, the name its examples share (the model's head)."""

    def __call__(self, examples, epoch: int = 0) -> dict:
        tasks = {e["task"] for e in examples}
        if len(tasks) != 1:
            raise ValueError(f"a batch must hold one task's examples, got {sorted(tasks)}")
        return {**super().__call__(examples, epoch), "task": tasks.pop()}


@torch.no_grad()
def predict(model, features, collate, batch_size, precision, device) -> tuple[list, float]:
    """(argmax per feature: a class id, or one per token), mean loss over the targets."""
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")
    preds, loss_sum, count = [None] * len(features), 0.0, 0
    for b0 in range(0, len(order), batch_size):
        idx = order[b0:b0 + batch_size]
        batch = {k: v.to(device) if torch.is_tensor(v) else v
                 for k, v in collate([features[i] for i in idx]).items()}
        with autocast_context(precision, device):
            out = model(**batch)
        n = int((batch["labels"] != IGNORE_INDEX).sum())  # examples, or labelled words
        loss_sum, count = loss_sum + float(out.loss) * n, count + n
        for i, row in zip(idx, out.logits.argmax(-1).cpu().numpy()):
            preds[i] = row
    return preds, loss_sum / max(count, 1)


def scores(task, features, preds, scheme) -> dict:
    if task["kind"] == "sequence":
        s = classification_scores(task["eval_data"]["labels"], [int(p) for p in preds],
                                  len(task["names"]))
        return {"accuracy": s["accuracy"], "f1": s["f1"],
                "per_class": dict(zip(task["names"], s["per_class"]))}
    names = task["names"]
    gold = [[names[i] for i in s] for s in task["eval_ids"]]
    tags = [[names[i] for i in s] for s in word_predictions(features, preds)]
    s = span_f1(gold, tags, scheme)
    return {"f1": s["f1"], "entity_precision": s["precision"], "entity_recall": s["recall"],
            "per_type": s["per_type"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = None
    try:
        ctx = init_distributed(args.device)
        logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING,
                            format="%(message)s", stream=sys.stdout)
        tasks = parse_tasks(args.task)
        check_args(args, ctx)
        tasks = [load_task(args, t) for t in tasks]  # all files read before --out is touched
        with open_run(args.out, args.resume, main=ctx.is_main):
            run(args, ctx, tasks)
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


def prepare_tokenizer(args, ctx, tasks) -> minibert.Tokenizer:
    """Rank 0 loads or trains the tokenizer (on every task's training text) into --out."""
    tok_dir = args.out / "tokenizer"
    if ctx.is_main and not (args.resume and (tok_dir / "tokenizer.json").is_file()):
        if args.init_from:
            tok = minibert.Tokenizer.from_pretrained(args.init_from)
        else:
            texts = [x for t in tasks if t["kind"] == "sequence" for x in
                     t["train_data"]["texts"] + (t["train_data"]["pairs"] or [])]
            texts += [" ".join(s.words) for t in tasks if t["kind"] == "token"
                      for s in t["train_data"]]
            tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=args.vocab_size,
                                                         cache_dir=args.cache_dir)
        tok.save(tok_dir)
    barrier(ctx)
    return minibert.Tokenizer.from_pretrained(tok_dir)


def run(args, ctx, tasks: list[dict]) -> None:
    minibert.set_seed(args.seed)
    tok = prepare_tokenizer(args, ctx, tasks)
    heads = {t["name"]: (t["kind"], t["names"]) for t in tasks}
    if args.init_from:  # the encoder of the checkpoint, a fresh head per task
        model = minibert.BertMultiTask.from_pretrained(args.init_from, heads)
    else:
        model = minibert.BertMultiTask(minibert.BertConfig.preset(
            args.preset, vocab_size=tok.vocab_size, pad_token_id=tok.pad_id), heads)
    if args.seq_len > model.config.max_position_embeddings:
        raise ValueError(f"--seq-len {args.seq_len} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}")
    if model.config.vocab_size < tok.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings; is it the checkpoint's own?")
    train_parts = [encode(tok, t, "train", args.seq_len) for t in tasks]
    eval_sets = {t["name"]: encode(tok, t, "eval", args.seq_len) for t in tasks}
    train_set = [f for part in train_parts for f in part]  # task t at offset sum(sizes[:t])
    batches = TaskMixtureBatches([len(p) for p in train_parts], args.batch_size,
                                 seed=args.seed, rank=ctx.rank, world_size=ctx.world_size,
                                 task_names=[f"task {t['name']}" for t in tasks])
    steps_per_epoch = max(1, len(train_set) // args.batch_size)  # one epoch-equivalent
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    log.info("%s; %d steps, P(task) %s", ", ".join(
        f"{t['name']} ({t['kind']}, {len(p)} training examples)" for t, p in
        zip(tasks, train_parts)), max_steps, np.round(batches.probabilities, 3).tolist())
    collate, precision = MultiTaskCollator(tok.pad_id), resolve_precision(args.precision,
                                                                           ctx.device)
    eval_batch = args.micro_batch_size or args.batch_size // ctx.world_size
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch-equivalent, and at the end
        metrics = {}
        for t in tasks:
            name = t["name"]
            preds, loss = predict(raw_model, eval_sets[name], collate, eval_batch, precision,
                                  ctx.device)
            last[name] = {**scores(t, eval_sets[name], preds, args.scheme), "eval_loss": loss}
            metrics.update({f"{name}/{k}": v for k, v in last[name].items()
                            if isinstance(v, float)})
        return metrics

    cfg = TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=max_steps, decay_steps=args.decay_steps,
        lr=args.lr or (5e-5 if args.init_from else 5e-4), min_lr=args.min_lr,
        warmup=args.warmup_ratio, weight_decay=args.weight_decay, precision=args.precision,
        seed=args.seed, log_every=args.log_every, eval_every=steps_per_epoch,
        save_every=steps_per_epoch, progress=not args.no_progress)
    # What --resume compares: the same tasks in the same order (the dataset's layout), each
    # with its training file's content and labels, read and encoded the same way.
    identity = {"tasks": [f"{t['name']}:{t['kind']}" for t in tasks],
                **{f"{t['name']} train file": sha256_file(t["train"]) for t in tasks},
                **{f"{t['name']} labels": t["names"] for t in tasks},
                "--text-column": args.text_column, "--text-pair-column": args.text_pair_column,
                "--label-column": args.label_column, "--scheme": args.scheme,
                "--seq-len": args.seq_len, "tokenizer": tok.fingerprint}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   eval_fn=eval_fn, data_identity=identity, batches=batches)
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        for t in tasks:
            model.export(t["name"], args.out / "final" / t["name"], tokenizer=tok)
        summary = {"tasks": {t["name"]: {"kind": t["kind"], **last[t["name"]],
                                         "labels": t["names"], "train_examples": len(p),
                                         "eval_examples": len(eval_sets[t["name"]])}
                             for t, p in zip(tasks, train_parts)},
                   **{k: result[k] for k in ("steps", "tokens_seen", "wall_seconds",
                                             "precision")}}
        write_files_atomically(args.out, {"eval.json": json.dumps(summary, indent=2) + "\n"})
        log.info("%s; models in %s", ", ".join(f"{n} F1 {s['f1']:.4f}" for n, s in last.items()),
                 args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
