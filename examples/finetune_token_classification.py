"""Fine-tune BERT for token classification (NER, POS) on CoNLL-style files.

    python examples/finetune_token_classification.py --train train.conll --eval dev.conll \\
        --init-from runs/mini/final --out runs/ner

Each line holds `word ... label` (whitespace- or tab-separated), a blank line ends a sentence,
-DOCSTART- lines are ignored. A word's first piece carries its label; its other pieces are
left out of the loss and the prediction. Without --init-from, a tokenizer is trained on the
training words and the weights start at random (the baseline). Wiring only: the library
reads and checks the tags against --scheme (`read_conll_task`), encodes
(`TokenSplit.encode`), predicts (`minibert.tasks.predict`), reads words back and scores
(`minibert.cli.finetune.task_scores`: `span_f1`, as seqeval); `minibert.cli.finetune` and
`minibert.cli` hold what the fine-tuning scripts share. Outputs in --out: metrics.jsonl,
eval.json, predictions.conll, labels.json, checkpoints/, final/. Bad input: one line naming
the file and the line, exit status 2, and nothing in --out is touched.
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import logging
import sys
from types import SimpleNamespace

import minibert
from minibert import cli
from minibert.cli import finetune
from minibert.training.checkpoint import sha256_file
from minibert.data import TaskCollator, read_conll_task
from minibert.training.engine import train
from minibert.tasks.metrics import SCHEMES, canonical_scheme
from minibert.tasks.predict import predict
from minibert.training.resume import RunPlan
from minibert.atomic import writing

log = logging.getLogger("finetune_token")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    d = p.add_argument_group("data")
    d.add_argument("--train", type=cli.path_flag, required=True,
                   help="CoNLL-style: `word label` lines")
    d.add_argument("--eval", type=cli.path_flag, required=True,
                   help="CoNLL-style, the training tags")
    d.add_argument("--scheme", choices=list(SCHEMES), default="IOB2",
                   help="how tags form entities for the span F1 (BIO is IOB2)")
    d.add_argument("--max-train-examples", type=int, help="a random subset of sentences")
    d.add_argument("--seq-len", type=int, default=finetune.FINETUNE.seq_len,
                   help="pieces per window, [CLS] and "
                   "[SEP] included. A longer sentence is cut into consecutive windows of whole "
                   "words, no overlap, so every word is predicted exactly once (one too long "
                   "for a window alone keeps its first pieces)")
    finetune.add_args(p, out="runs/finetune_token", unit="windows")
    args = p.parse_args(argv)
    args.scheme = canonical_scheme(args.scheme)  # BIO is IOB2: one name in the run's identity
    return args


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
    sentences (every tag against --scheme), a resumed run's tags, the tokenizer against the
    model, the windows, and what --resume compares (the run's `RunPlan`)."""
    finetune.check_args(args, ctx, positive=["max_train_examples"])
    if args.seq_len < 3:
        raise ValueError("--seq-len must be at least 3 ([CLS], one piece, [SEP])")
    task = read_conll_task(args.train, args.eval, args.scheme, args.max_train_examples,
                           args.seed)
    finetune.check_labels(args, task.names, "tags")
    tok = finetune.prepare_tokenizer(args, ctx, task.train.tokenizer_texts())
    minibert.set_seed(args.seed)
    model = finetune.build_model(minibert.BertForTokenClassification, args, tok,
                                 num_labels=len(task.names), id2label=task.names)
    train_set = task.train.encode(tok, args.seq_len)
    cfg = finetune.epoch_config(args, ctx, len(train_set),
                                f"{args.train} gives {len(train_set)} training windows")
    # What --resume compares besides the model and training settings: the same sentences,
    # windows, tags and tokenizer, and the same evaluation sentences, so that every epoch's
    # scores compare (minibert/training/state.py).
    identity = {"train file": sha256_file(args.train), "--eval file": sha256_file(args.eval),
                "--seq-len": args.seq_len,
                "--max-train-examples": args.max_train_examples, "--scheme": args.scheme,
                "tokenizer": tok.fingerprint, "labels": task.names}
    return SimpleNamespace(task=task, tok=tok, model=model, cfg=cfg, train_set=train_set,
                           eval_set=task.eval.encode(tok, args.seq_len), identity=identity,
                           runs=[RunPlan(model, cfg, identity, args.out, args.resume)])


def run(args, ctx, p: SimpleNamespace) -> None:
    task, tok, model, cfg = p.task, p.tok, p.model, p.cfg
    if ctx.is_main:
        finetune.save_labels(args, task.names)
    finetune.save_tokenizer(args, ctx, tok)
    log.info("%d training sentences in %d windows, %d eval sentences in %d; %d tags; %d steps",
             len(task.train), len(p.train_set), len(task.eval), len(p.eval_set),
             len(task.names), cfg.max_steps)
    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)

    def eval_fn(raw_model, precision: str) -> dict:  # every epoch, and at the end
        pred = predict(raw_model, p.eval_set, collate, finetune.eval_batch_size(args, ctx),
                       precision, ctx.device)
        return finetune.task_scores(task, pred, p.eval_set, args.scheme)

    cli.apply_keep_freed_memory(args.keep_freed_memory, ctx)
    minibert.fast(model)  # the CPU kernels, swapped in (docs/machine-room.md)
    result = train(model, p.train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in p.train_set], eval_fn=eval_fn,
                   data_identity=p.identity)
    if not cli.finished(result, ctx, cfg.lr, model, args.out):
        return
    with writing(args.out / "final"):
        model.save_pretrained(args.out / "final", tokenizer=tok)
    names, tags = task.names, result["scores"]["predictions"]
    lines = ["\n".join(f"{w}\t{names[g]}\t{t}" for w, g, t in zip(s.words, g_s, t_s)) + "\n"
             for s, g_s, t_s in zip(task.eval.sentences, task.eval.labels, tags)]
    finetune.write_eval(args.out, {"predictions.conll": "\n".join(lines)}, **finetune.summary(
        result, **{k: result[k] for k in ("f1", "entity_precision", "entity_recall",
                                           "accuracy", "eval_loss")},
        per_type=result["scores"]["per_type"], labels=names, scheme=args.scheme,
        train_sentences=len(task.train), train_windows=len(p.train_set),
        eval_sentences=len(task.eval), eval_windows=len(p.eval_set),
        eval_words=sum(map(len, task.eval.labels))))
    log.info("eval entity F1 %.4f, word accuracy %.4f; model in %s", result["f1"],
             result["accuracy"], args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
