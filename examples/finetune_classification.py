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

The path the data takes: rows -> [CLS] text [SEP] ids (truncated to --seq-len) ->
length-grouped batches with dynamic padding -> `minibert.engine.train`, which evaluates
accuracy and macro-F1 after every epoch. Outputs in --out: metrics.jsonl, eval.json,
predictions.tsv, labels.json, checkpoints/ and final/ (model + tokenizer, loadable by
minibert and transformers). Bad input ends with one line on stderr naming the file and the
line, and exit status 2; nothing already in --out is overwritten.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import hashlib
import logging
import sys
from pathlib import Path

import numpy as np
import torch

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import CheckpointError
from minibert.config import PRESETS
from minibert.data.mlm import pad_batch
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError, train
from minibert.precision import autocast_context, resolve_precision
from minibert.hf import read_config
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


# ---- reading the files -----------------------------------------------------------------------

def read_table(path: Path, columns: list[str]) -> list[tuple[int, list[str]]]:
    """(line number, [value of each requested column]) for every data row of a TSV/CSV file.

    TSV has no quoting at all: a tab always separates fields and a quote is an ordinary
    character (the GLUE convention), so "a \"quoted\" word" reads as written. CSV follows
    RFC 4180, as spreadsheets write it (quoted fields may hold commas and newlines).
    """
    kind = path.suffix.lower()
    if kind not in (".tsv", ".csv"):
        raise ValueError(f"{path}: cannot tell the format from the extension {path.suffix!r}; "
                         f"name the file .tsv (tab-separated) or .csv (comma-separated)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # -sig: drop the byte-order mark some editors write
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 (byte 0x{raw[e.start]:02x}); "
                         f"save the file as UTF-8") from None
    if not text.strip():
        raise ValueError(f"{path} is empty; expected a header row naming the columns, then "
                         f"one example per row")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True,
                        **({"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == ".tsv"
                           else {"delimiter": ","}))
    rows, line = [], 1
    try:
        header = [h.strip() for h in next(reader)]
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r} in the header (columns found: "
                             f"{', '.join(map(repr, header))})")
        where = [header.index(c) for c in columns]
        line = reader.line_num + 1
        for fields in reader:
            line, start = reader.line_num + 1, line  # a quoted CSV field may span lines
            if not fields:  # a blank line
                continue
            if len(fields) != len(header):
                hint = "a tab inside a text?" if kind == ".tsv" else \
                    "quote a text that holds commas"
                raise ValueError(f"{path}, line {start}: {len(fields)} field(s) but the header "
                                 f"has {len(header)} ({hint})")
            values = [fields[i].strip() for i in where]
            for name, value in zip(columns, values):
                if not value:
                    raise ValueError(f"{path}, line {start}: the {name!r} field is empty")
            rows.append((start, values))
    except csv.Error as e:
        raise ValueError(f"{path}, line {reader.line_num}: unreadable row ({e})") from None
    if not rows:
        raise ValueError(f"{path} has a header but no data rows")
    return rows


def label_names(labels: list[str], path: Path) -> list[str]:
    """The sorted class names: by value when every label is an integer, else as text."""
    names = sorted(set(labels), key=int if all(_is_int(x) for x in labels) else str)
    if len(names) < 2:
        raise ValueError(f"{path}: every row has the label {names[0]!r}; classification needs "
                         f"at least two classes")
    return names


def _is_int(x: str) -> bool:
    try:
        int(x)
        return True
    except ValueError:
        return False


def _canonical(label: str, integers: bool) -> str:
    return str(int(label)) if integers and _is_int(label) else label  # "07" and "7" are one class


def load_task(args) -> dict:
    """Rows of both files, checked, with the labels as class ids."""
    columns = [args.text_column] + ([args.text_pair_column] if args.text_pair_column else []) \
        + [args.label_column]
    train_rows, eval_rows = read_table(args.train, columns), read_table(args.eval, columns)
    integers = all(_is_int(r[-1]) for _, r in train_rows)
    names = label_names([_canonical(r[-1], integers) for _, r in train_rows], args.train)
    label2id = {n: i for i, n in enumerate(names)}
    for line, r in eval_rows:
        if _canonical(r[-1], integers) not in label2id:
            shown = ", ".join(map(repr, names[:10])) + (", ..." if len(names) > 10 else "")
            raise ValueError(f"{args.eval}, line {line}: label {r[-1]!r} does not occur in "
                             f"{args.train} (its labels: {shown})")
    if args.max_train_examples and args.max_train_examples < len(train_rows):
        keep = np.random.default_rng(args.seed).choice(len(train_rows), args.max_train_examples,
                                                       replace=False)
        train_rows = [train_rows[i] for i in sorted(keep)]

    def split(rows):
        return {"texts": [r[0] for _, r in rows],
                "pairs": [r[1] for _, r in rows] if args.text_pair_column else None,
                "labels": [label2id[_canonical(r[-1], integers)] for _, r in rows],
                "lines": [line for line, _ in rows]}

    return {"names": names, "train": split(train_rows), "eval": split(eval_rows)}


# ---- tokens and batches ----------------------------------------------------------------------

def encode(tok: minibert.Tokenizer, part: dict, seq_len: int) -> list[dict]:
    """[CLS] text [SEP] (text-pair [SEP]) ids per example, truncated to seq_len tokens."""
    a = tok.encode_batch(part["texts"], add_special_tokens=False)
    b = tok.encode_batch(part["pairs"], add_special_tokens=False) if part["pairs"] else None
    examples = []
    for i, x in enumerate(a):
        y = b[i] if b else []
        n = seq_len - (3 if b else 2)  # room left for text after the special tokens
        if len(x) + len(y) > n:
            # Longest first, as BERT did: trim the longer text until both fit.
            half = n // 2
            keep_y = len(y) if len(y) <= half else max(half, n - len(x))
            x, y = x[:n - keep_y], y[:keep_y]
        ids = [tok.cls_id, *x, tok.sep_id] + ([*y, tok.sep_id] if b else [])
        types = [0] * (len(x) + 2) + [1] * (len(ids) - len(x) - 2)  # segment A, then B
        examples.append({"input_ids": np.asarray(ids, dtype=np.int64),
                         "token_type_ids": np.asarray(types, dtype=np.int64),
                         "label": part["labels"][i]})
    return examples


class ClassificationCollator:
    """Pad a list of examples to the longest one (dynamic padding); one label per example."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: list[dict], epoch: int = 0) -> dict[str, torch.Tensor]:
        ids, lengths = pad_batch([e["input_ids"] for e in examples], self.pad_id)  # (B, T)
        types = np.zeros_like(ids)
        for row, e in zip(types, examples):
            row[:len(e["token_type_ids"])] = e["token_type_ids"]
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, T), 1 = token
        return {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
                "attention_mask": torch.from_numpy(mask.astype(np.int64)),
                "labels": torch.tensor([e["label"] for e in examples], dtype=torch.long)}


# ---- evaluation ------------------------------------------------------------------------------

def classification_scores(y_true, y_pred, num_labels: int) -> dict:
    """Accuracy, macro-F1 and per-class precision, recall, F1 and support.

    A class's F1 is 2TP / (2TP + FP + FN), the harmonic mean of precision and recall. Macro-F1
    is the plain mean over the classes that occur in the labels or the predictions (as
    scikit-learn's `f1_score(average="macro")`), so a rare class counts as much as a common
    one, which accuracy hides.
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    cm = np.zeros((num_labels, num_labels), dtype=np.int64)  # rows: truth, columns: prediction
    np.add.at(cm, (y_true, y_pred), 1)
    tp = np.diag(cm)
    support, predicted = cm.sum(1), cm.sum(0)
    f1 = 2 * tp / np.maximum(support + predicted, 1)
    present = (support + predicted) > 0
    return {"accuracy": float(tp.sum() / max(len(y_true), 1)),
            "f1": float(f1[present].mean()),
            "per_class": [{"precision": float(tp[k] / max(predicted[k], 1)),
                           "recall": float(tp[k] / max(support[k], 1)),
                           "f1": float(f1[k]), "support": int(support[k])}
                          for k in range(num_labels)]}


@torch.no_grad()
def predict(model, examples: list[dict], collate, batch_size: int, precision: str,
            device: torch.device) -> tuple[np.ndarray, float]:
    """(predicted class per example, mean cross-entropy) over `examples`."""
    order = np.argsort([len(e["input_ids"]) for e in examples], kind="stable")  # little padding
    preds, loss_sum = np.zeros(len(examples), dtype=np.int64), 0.0
    for b0 in range(0, len(order), batch_size):
        idx = order[b0:b0 + batch_size]
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in idx]).items()}
        with autocast_context(precision, device):
            out = model(**batch)
        loss_sum += float(out.loss) * len(idx)
        preds[idx] = out.logits.argmax(-1).cpu().numpy()
    return preds, loss_sum / len(examples)


# ---- setup -----------------------------------------------------------------------------------

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
        if ctx is not None:
            cleanup(ctx)
        return 2
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        cleanup(ctx)
        return 1
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
    train_set, eval_set = (encode(tok, task[s], args.seq_len) for s in ("train", "eval"))
    truncated = sum(len(e["input_ids"]) == args.seq_len for e in train_set)
    steps_per_epoch = n_train // args.batch_size  # full, length-grouped batches
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    log.info("%d training and %d evaluation examples, %d classes (%s); %d steps of %d "
             "(%d per epoch); %d training texts reach --seq-len %d", n_train, len(eval_set),
             len(names), ", ".join(names[:10]), max_steps, args.batch_size, steps_per_epoch,
             truncated, args.seq_len)
    collate = ClassificationCollator(tok.pad_id)
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
    identity = {"train file": file_digest(args.train),
                "--max-train-examples": args.max_train_examples,
                "--text-column": args.text_column, "--text-pair-column": args.text_pair_column,
                "--label-column": args.label_column, "--seq-len": args.seq_len,
                "tokenizer": tok.fingerprint, "labels": names}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(e["input_ids"]) for e in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        summary = write_results(args, model, tok, task, result, last["scores"], last["preds"])
        log.info("eval accuracy %.4f, macro-F1 %.4f over %d examples; model in %s",
                 summary["accuracy"], summary["f1"], summary["eval_examples"],
                 args.out / "final")


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
