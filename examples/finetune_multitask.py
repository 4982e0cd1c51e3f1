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
mixture as its batch order, minibert.predict, and classification_scores (accuracy,
macro-F1) and span_f1 (with word accuracy) for the metrics; finetune_common.py holds what
the fine-tuning scripts share. --epochs counts epoch-equivalents: (all tasks' training
examples) / --batch-size steps, after each of which every task is evaluated. Outputs in
--out: metrics.jsonl (keys "task/metric"), eval.json ({"tasks": {name: scores}}, run
totals), checkpoints/ and final/ with one exported single-task folder per task
(final/<name>/, loadable by minibert and transformers). Bad input ends with one line on
stderr and exit status 2, before --out is touched.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import sha256_file
from minibert.data import TaskCollator
from minibert.data.sampler import TaskMixtureBatches
from minibert.engine import train
from minibert.metrics import SCHEMES
from minibert.multitask import KINDS, check_task_name
from minibert.precision import resolve_precision
from minibert.predict import predict

# The wiring all fine-tuning scripts share. Run as a script, this folder is already on
# sys.path; imported by file path (as the tests do), it is not, hence the insert.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_common as common  # noqa: E402

log = logging.getLogger("finetune_multitask")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--task", action="append", required=True, metavar="NAME:KIND:TRAIN:EVAL",
                   help=f"once per task; KIND is one of {', '.join(KINDS)}")
    d.add_argument("--text-column", help="sequence tasks: the text column")
    d.add_argument("--text-pair-column", help="sequence tasks: a second text, for pairs")
    d.add_argument("--label-column", help="sequence tasks: the label column")
    d.add_argument("--scheme", choices=list(SCHEMES), default="IOB2", help="token tasks' tags")
    d.add_argument("--seq-len", type=int, default=128, help="longer inputs are truncated "
                   "(sequence) or cut into windows of whole words (token)")
    common.add_finetune_args(p, out="runs/finetune_multitask", epochs_help="epoch-equivalents: "
                             "all training examples / --batch-size steps each")
    return p.parse_args(argv)


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
        tasks.append({"name": name, "kind": kind, "train_file": Path(train_file),
                      "eval_file": Path(eval_file)})
    return tasks


def prepare(args, ctx) -> list[dict]:
    """The tasks and flags checked, then every task's files read (its "names", "train" and
    "eval" splits): all before --out is touched."""
    tasks = parse_tasks(args.task)
    common.check_finetune_args(args, ctx)
    if args.seq_len < 5:
        raise ValueError("--seq-len must be at least 5 (the special tokens and some text)")
    for t in tasks:
        if t["kind"] == "token":
            t.update(common.read_conll_task(t["train_file"], t["eval_file"], args.scheme))
        elif not (args.text_column and args.label_column):
            raise ValueError(f"--task {t['name']} is a sequence task: pass --text-column "
                             f"and --label-column")
        else:
            t.update(common.read_table_task(t["train_file"], t["eval_file"], args.text_column,
                                            args.text_pair_column, args.label_column))
    return tasks


def encode(tok, task: dict, split: str, seq_len: int) -> list[dict]:
    features = common.encode_task(tok, task["kind"], task[split], seq_len)
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


def main(argv=None) -> int:
    return common.run_script(parse_args(argv), prepare, run)


def run(args, ctx, tasks: list[dict]) -> None:
    minibert.set_seed(args.seed)
    texts = [x for kind in ("sequence", "token") for t in tasks if t["kind"] == kind
             for x in common.task_texts(kind, t["train"])]
    tok = common.prepare_tokenizer(args, ctx, texts)
    # The encoder of --init-from, a fresh head per task.
    model = common.build_model(minibert.BertMultiTask, args, tok,
                               tasks={t["name"]: (t["kind"], t["names"]) for t in tasks})
    train_parts = [encode(tok, t, "train", args.seq_len) for t in tasks]
    eval_sets = {t["name"]: encode(tok, t, "eval", args.seq_len) for t in tasks}
    train_set = [f for part in train_parts for f in part]  # task t at offset sum(sizes[:t])
    batches = TaskMixtureBatches([len(p) for p in train_parts], args.batch_size,
                                 seed=args.seed, rank=ctx.rank, world_size=ctx.world_size,
                                 task_names=[f"task {t['name']}" for t in tasks])
    cfg = common.train_config(args, max(1, len(train_set) // args.batch_size))  # epoch-equiv.
    log.info("%s; %d steps, P(task) %s", ", ".join(
        f"{t['name']} ({t['kind']}, {len(p)} training examples)" for t, p in
        zip(tasks, train_parts)), cfg.max_steps, np.round(batches.probabilities, 3).tolist())
    collate = MultiTaskCollator(tok.pad_id)
    precision = resolve_precision(args.precision, ctx.device)
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch-equivalent, and at the end
        metrics = {}
        for t in tasks:
            name, features = t["name"], eval_sets[t["name"]]
            pred = predict(raw_model, features, collate, common.eval_batch_size(args, ctx),
                           precision, ctx.device)
            last[name] = common.sequence_scores(pred, t["eval"], t["names"])[0] \
                if t["kind"] == "sequence" else \
                common.token_scores(pred, features, t["eval"], t["names"], args.scheme)[0]
            metrics.update({f"{name}/{k}": v for k, v in common.numbers(last[name]).items()})
        return metrics

    # What --resume compares: the same tasks in the same order (the dataset's layout), each
    # with its training file's content and labels, read and encoded the same way.
    identity = {"tasks": [f"{t['name']}:{t['kind']}" for t in tasks],
                **{f"{t['name']} train file": sha256_file(t["train_file"]) for t in tasks},
                **{f"{t['name']} labels": t["names"] for t in tasks},
                "--text-column": args.text_column, "--text-pair-column": args.text_pair_column,
                "--label-column": args.label_column, "--scheme": args.scheme,
                "--seq-len": args.seq_len, "tokenizer": tok.fingerprint}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   eval_fn=eval_fn, data_identity=identity, batches=batches)
    if common.finished(result, ctx):
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
