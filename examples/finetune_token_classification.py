"""Fine-tune BERT for token classification (NER, POS) on CoNLL-style files.

    python examples/finetune_token_classification.py --train train.conll --eval dev.conll \\
        --init-from runs/mini/final --out runs/ner

Each line holds `word ... label` (whitespace- or tab-separated), a blank line ends a sentence,
-DOCSTART- lines are ignored. A word's first piece carries its label; its other pieces are
left out of the loss and the prediction. Without --init-from, a tokenizer is trained on the
training words and the weights start at random (the baseline). Wiring only: the library
reads (`read_conll`), checks tags (`metrics.spans`), encodes (`encode_token_classification`),
predicts (`minibert.predict`), reads words back (`word_predictions`) and scores (`span_f1`,
as seqeval); finetune_common.py holds what the fine-tuning scripts share. Outputs in --out:
metrics.jsonl, eval.json, predictions.conll, labels.json, checkpoints/, final/. Bad input:
one line naming the file and the line, exit status 2, and nothing in --out is touched.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import sha256_file
from minibert.data import TaskCollator
from minibert.engine import train
from minibert.metrics import SCHEMES
from minibert.precision import resolve_precision
from minibert.predict import predict

# The wiring all fine-tuning scripts share. Run as a script, this folder is already on
# sys.path; imported by file path (as the tests do), it is not, hence the insert.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_common as common  # noqa: E402

log = logging.getLogger("finetune_token")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data")
    d.add_argument("--train", type=Path, required=True, help="CoNLL-style: `word label` lines")
    d.add_argument("--eval", type=Path, required=True, help="CoNLL-style, the training tags")
    d.add_argument("--scheme", choices=list(SCHEMES), default="IOB2",
                   help="how tags form entities for the span F1 (BIO is IOB2)")
    d.add_argument("--max-train-examples", type=int, help="a random subset of sentences")
    d.add_argument("--seq-len", type=int, default=128, help="pieces per window, [CLS] and "
                   "[SEP] included. A longer sentence is cut into consecutive windows of whole "
                   "words, no overlap, so every word is predicted exactly once (one too long "
                   "for a window alone keeps its first pieces)")
    common.add_finetune_args(p, out="runs/finetune_token", unit="windows")
    return p.parse_args(argv)


def prepare(args, ctx) -> dict:
    """The flags checked, then the sentences of both files, every tag checked against
    --scheme: all before --out is touched."""
    common.check_finetune_args(args, ctx, positive=["max_train_examples"])
    if args.seq_len < 3:
        raise ValueError("--seq-len must be at least 3 ([CLS], one piece, [SEP])")
    return common.read_conll_task(args.train, args.eval, args.scheme, args.max_train_examples,
                                  args.seed)


def main(argv=None) -> int:
    return common.run_script(parse_args(argv), prepare, run)


def run(args, ctx, task: dict) -> None:
    minibert.set_seed(args.seed)
    names = task["names"]
    if ctx.is_main:
        common.save_labels(args, names, "tags")
    tok = common.prepare_tokenizer(args, ctx, common.task_texts("token", task["train"]))
    model = common.build_model(minibert.BertForTokenClassification, args, tok,
                               num_labels=len(names), id2label=names)
    train_set, eval_set = (common.encode_task(tok, "token", task[s], args.seq_len)
                           for s in ("train", "eval"))
    if len(train_set) < args.batch_size:
        raise ValueError(f"{args.train} gives {len(train_set)} training windows, fewer than "
                         f"one batch; lower --batch-size below {len(train_set)}")
    cfg = common.train_config(args, steps_per_epoch=len(train_set) // args.batch_size)
    sentences = {s: task[s]["sentences"] for s in ("train", "eval")}
    log.info("%d training sentences in %d windows, %d eval sentences in %d; %d tags; %d steps",
             len(sentences["train"]), len(train_set), len(sentences["eval"]), len(eval_set),
             len(names), cfg.max_steps)
    collate, precision = TaskCollator(tok.pad_id), resolve_precision(args.precision, ctx.device)
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch, and at the end
        pred = predict(raw_model, eval_set, collate, common.eval_batch_size(args, ctx),
                       precision, ctx.device)
        last["scores"], last["tags"] = common.token_scores(pred, eval_set, task["eval"], names,
                                                           args.scheme)
        return common.numbers(last["scores"])

    identity = {"train file": sha256_file(args.train), "--seq-len": args.seq_len,
                "--max-train-examples": args.max_train_examples, "--scheme": args.scheme,
                "tokenizer": tok.fingerprint, "labels": names}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    if common.finished(result, ctx):
        model.save_pretrained(args.out / "final", tokenizer=tok)
        summary = {**{k: result[k] for k in ("f1", "entity_precision", "entity_recall",
                                              "accuracy", "eval_loss")},
                   "per_type": last["scores"]["per_type"], "labels": names,
                   "scheme": args.scheme, "train_sentences": len(sentences["train"]),
                   "train_windows": len(train_set), "eval_sentences": len(sentences["eval"]),
                   "eval_windows": len(eval_set),
                   "eval_words": sum(map(len, task["eval"]["labels"])),
                   **{k: result[k] for k in ("steps", "tokens_seen", "wall_seconds",
                                             "precision")}}
        lines = ["\n".join(f"{w}\t{names[g]}\t{p}" for w, g, p in zip(s.words, g_s, p_s)) + "\n"
                 for s, g_s, p_s in zip(sentences["eval"], task["eval"]["labels"], last["tags"])]
        write_files_atomically(args.out, {"predictions.conll": "\n".join(lines),
                                          "eval.json": json.dumps(summary, indent=2) + "\n"})
        log.info("eval entity F1 %.4f, word accuracy %.4f; model in %s", summary["f1"],
                 summary["accuracy"], args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
