"""Fine-tune BERT for extractive question answering on SQuAD v1.1 or v2.0 JSON.

    python examples/finetune_qa.py --train train-v1.1.json --eval dev-v1.1.json \\
        --init-from runs/mini/final --out runs/squad        # add --version-2 for SQuAD 2.0

Wiring only: `read_squad` reads and checks the questions; `encode_qa` cuts each context into
windows of --seq-len tokens (the training examples, targets the answer's first and last
token, or [CLS] where a window lacks it); `TaskCollator` pads; `engine.train` trains; after
every epoch `minibert.tasks.predict` scores every window's tokens, `best_span` picks each
question's best span over its windows, in characters of the context, and `squad_scores`
scores it; `minibert.cli.finetune` and `minibert.cli` hold what the fine-tuning scripts share.
Without --init-from, a WordPiece tokenizer is trained on the training questions and
contexts and the weights start random (the baseline).
Writes metrics.jsonl, eval.json, predictions.json (id -> answer, "" for none), checkpoints/
and final/ (model + tokenizer, for minibert, and for transformers where the encoder is
classic BERT or ModernBERT) into --out. Bad input (a file,
a window too small for any context): one line naming the file (and question) on stderr,
exit status 2, and --out untouched.
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import json
import logging
import sys
from dataclasses import replace
from types import SimpleNamespace

import minibert
from minibert import cli
from minibert.cli import finetune
from minibert.training.checkpoint import sha256_file
from minibert.data import TaskCollator, best_span, encode_qa, random_subset, read_squad
from minibert.training.engine import train
from minibert.tasks.metrics import squad_scores
from minibert.tasks.predict import predict
from minibert.training.resume import RunPlan
from minibert.atomic import writing

log = logging.getLogger("finetune_qa")

# Fine-tuning's defaults for SQuAD, as BERT's recipe for it: two epochs over windows of 384.
JOB = replace(finetune.FINETUNE, epochs=2, seq_len=384)

# encode_qa's arguments as the flags that set them, for its messages.
WINDOW_FLAGS = {"max_len": "--seq-len", "doc_stride": "--doc-stride",
                "max_question_len": "--max-question-len"}


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    arg = p.add_argument_group("data").add_argument
    arg("--train", type=cli.path_flag, required=True, help="SQuAD JSON")
    arg("--eval", type=cli.path_flag, required=True, help="SQuAD JSON")
    arg("--version-2", action="store_true", help="SQuAD 2.0: unanswerable (is_impossible) "
        "questions are allowed, and an answer may be none")
    arg("--max-train-examples", type=int, help="a random subset of questions (by --seed)")
    arg("--seq-len", type=int, default=JOB.seq_len, help="tokens per window")
    arg("--doc-stride", type=int, help="context tokens that consecutive windows share: the "
        "overlap, as transformers' stride (BERT's run_squad.py gave the name to the step "
        "between windows); default --seq-len // 3, 128 at 384")
    arg("--max-question-len", type=int, default=64, help="longer questions are cut (tokens)")
    arg("--max-answer-length", type=int, default=30, help="the longest answer span "
        "predicted, in tokens")
    arg("--n-best", type=int, default=20, help="start and end candidates per window")
    arg("--null-score-diff-threshold", type=float, default=0.0, help="with --version-2: no "
        "answer when the [CLS] score beats the best span's by more than this")
    finetune.add_args(p, out="runs/finetune_qa", unit="windows", job=JOB)
    args = p.parse_args(argv)
    if args.doc_stride is None:
        args.doc_stride = args.seq_len // 3
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
    """Everything that can be checked, before --out is touched: the flags, the questions of
    both files, the tokenizer against the model, and the windows (a question may leave a
    window no room for context), and what --resume compares (the run's `RunPlan`)."""
    finetune.check_args(args, ctx, positive=["max_train_examples", "max_question_len",
                                             "max_answer_length", "n_best"])
    # nan compares false with every score: no question would ever be left unanswered
    cli.finite_flags(args, ["null_score_diff_threshold"])
    # A window holds [CLS] question [SEP] context [SEP]: with a one-token question, seq_len - 4
    # context tokens. encode_qa names a longer question that leaves no more than --doc-stride.
    if not 0 <= args.doc_stride < args.seq_len - 4:
        raise ValueError(f"--doc-stride {args.doc_stride} must lie in [0, {args.seq_len - 4}):"
                         f" windows of --seq-len {args.seq_len} share less than they hold")
    questions = {}
    for split, path in (("train", args.train), ("eval", args.eval)):
        try:  # an is_impossible question without --version-2 is named, with its flag's value
            questions[split] = read_squad(path, version_2=args.version_2)
        except ValueError as e:
            raise ValueError(str(e).replace("read the file with version_2=True", "pass "
                             "--version-2 to train and evaluate with unanswerable questions")
                             ) from None
    questions["train"] = random_subset(questions["train"], args.max_train_examples, args.seed)
    # Without --init-from the tokenizer learns from each context once, however many
    # questions it has.
    tok = finetune.prepare_tokenizer(args, ctx, [ex.question for ex in questions["train"]] + list(
        dict.fromkeys(ex.context for ex in questions["train"])))
    minibert.set_seed(args.seed)
    model = finetune.build_model(minibert.BertForQuestionAnswering, args, tok)
    # A question too long for its window is said in the flags that set the window.
    train_set, eval_set = (cli.in_flag_names(lambda s=s: encode_qa(
        tok, questions[s], max_len=args.seq_len, doc_stride=args.doc_stride,
        max_question_len=args.max_question_len), WINDOW_FLAGS) for s in ("train", "eval"))
    cfg = finetune.epoch_config(args, ctx, len(train_set),
                                f"{args.train} gives {len(train_set)} training windows")
    # What --resume compares besides the model and training settings: the same questions,
    # cut into the same windows by the same tokenizer; and the same evaluation questions,
    # whose answers are picked by the same rules, so that every epoch's scores compare
    # (minibert/training/state.py).
    identity = {"train file": sha256_file(args.train), "--eval file": sha256_file(args.eval),
                "--max-train-examples": args.max_train_examples, "--seq-len": args.seq_len,
                "--doc-stride": args.doc_stride, "--max-question-len": args.max_question_len,
                "--version-2": args.version_2, "tokenizer": tok.fingerprint,
                "--max-answer-length": args.max_answer_length, "--n-best": args.n_best,
                "--null-score-diff-threshold": args.null_score_diff_threshold}
    return SimpleNamespace(questions=questions, tok=tok, model=model, cfg=cfg,
                           train_set=train_set, eval_set=eval_set, identity=identity,
                           runs=[RunPlan(model, cfg, identity, args.out, args.resume)])


def run(args, ctx, p: SimpleNamespace) -> None:
    questions, tok, model, cfg = p.questions, p.tok, p.model, p.cfg
    finetune.save_tokenizer(args, ctx, tok)
    log.info("%d training questions in %d windows, %d evaluation questions in %d; %d steps "
             "of %d (%d per epoch)", len(questions["train"]), len(p.train_set),
             len(questions["eval"]), len(p.eval_set), cfg.max_steps, args.batch_size,
             cfg.eval_every)
    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)
    gold = {ex.id: [text for text, _ in ex.answers] for ex in questions["eval"]}  # [] if none

    def eval_fn(raw_model, precision: str) -> dict:  # every epoch, and at the end
        pred = predict(raw_model, p.eval_set, collate, finetune.eval_batch_size(args, ctx),
                       precision, ctx.device)
        spans = best_span(pred.outputs["start_logits"], pred.outputs["end_logits"], p.eval_set,
                          questions["eval"], args.max_answer_length, args.n_best,
                          version_2=args.version_2,
                          null_score_diff_threshold=args.null_score_diff_threshold)
        predictions = {s.id: s.text for s in spans}
        return {**squad_scores(predictions, gold), "eval_loss": pred.loss,
                "predictions": predictions}

    cli.apply_keep_freed_memory(args.keep_freed_memory, ctx)
    minibert.fast(model)  # the CPU kernels, swapped in (docs/machine-room.md)
    result = train(model, p.train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in p.train_set], eval_fn=eval_fn,
                   data_identity=p.identity)
    if not cli.finished(result, ctx, cfg.lr, model, args.out):
        return
    with writing(args.out / "final"):
        model.save_pretrained(args.out / "final", tokenizer=tok)
    answers = json.dumps(result["scores"]["predictions"], indent=2, ensure_ascii=False)
    finetune.write_eval(args.out, {"predictions.json": answers + "\n"}, **finetune.summary(
        result, exact_match=result["exact_match"], f1=result["f1"],
        eval_loss=result["eval_loss"], train_examples=len(questions["train"]),
        train_windows=len(p.train_set), eval_examples=len(questions["eval"]),
        version_2=args.version_2))
    log.info("eval exact match %.2f, F1 %.2f over %d questions; model in %s",
             result["exact_match"], result["f1"], len(questions["eval"]), args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
