"""Fine-tune BERT for extractive question answering on SQuAD v1.1 or v2.0 JSON.

    python examples/finetune_qa.py --train train-v1.1.json --eval dev-v1.1.json \\
        --init-from runs/mini/final --out runs/squad        # add --version-2 for SQuAD 2.0

Wiring only: `read_squad` reads and checks the questions; `encode_qa` cuts each context into
windows of --seq-len tokens (the training examples, targets the answer's first and last
token, or [CLS] where a window lacks it); `TaskCollator` pads; `engine.train` trains; after
every epoch `minibert.predict` scores every window's tokens, `best_span` picks each
question's best span over its windows, in characters of the context, and `squad_scores`
scores it; finetune_common.py holds what the fine-tuning scripts share. Without
--init-from, a WordPiece tokenizer is trained on the training questions and contexts and
the weights start random (the baseline).
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

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import sha256_file
from minibert.data import TaskCollator, best_span, encode_qa, read_squad
from minibert.engine import train
from minibert.metrics import squad_scores
from minibert.precision import resolve_precision
from minibert.predict import predict

# The wiring all fine-tuning scripts share. Run as a script, this folder is already on
# sys.path; imported by file path (as the tests do), it is not, hence the insert.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_common as common  # noqa: E402

log = logging.getLogger("finetune_qa")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    arg = p.add_argument_group("data").add_argument
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
    common.add_finetune_args(p, out="runs/finetune_qa", unit="windows", epochs=2)
    args = p.parse_args(argv)
    if args.doc_stride is None:
        args.doc_stride = args.seq_len // 3
    return args


def prepare(args, ctx) -> dict:
    """The flags checked, then the questions of both files (a random subset of the training
    ones): all before --out is touched."""
    common.check_finetune_args(args, ctx, positive=["max_train_examples", "max_question_len",
                                                    "max_answer_length", "n_best"])
    # A window holds [CLS] question [SEP] context [SEP]: with a one-token question, seq_len - 4
    # context tokens. encode_qa names a longer question that leaves no more than --doc-stride.
    if not 0 <= args.doc_stride < args.seq_len - 4:
        raise ValueError(f"--doc-stride {args.doc_stride} must lie in [0, {args.seq_len - 4}):"
                         f" windows of --seq-len {args.seq_len} share less than they hold")
    task = {}
    for split, path in (("train", args.train), ("eval", args.eval)):
        examples = read_squad(path, version_2=True)  # SQuAD 2.0 marks are refused just below
        unanswerable = next((ex for ex in examples if ex.is_impossible), None)
        if unanswerable is not None and not args.version_2:
            raise ValueError(f"{path}: question {unanswerable.id!r} is marked is_impossible, "
                             f"a SQuAD 2.0 question; pass --version-2 to train and evaluate "
                             f"with unanswerable questions")
        task[split] = examples
    return {**task, "train": common.random_subset(task["train"], args.max_train_examples,
                                                  args.seed)}


def main(argv=None) -> int:
    return common.run_script(parse_args(argv), prepare, run)


def run(args, ctx, task: dict) -> None:
    minibert.set_seed(args.seed)
    # Without --init-from the tokenizer learns from each context once, however many
    # questions it has.
    texts = [ex.question for ex in task["train"]] + \
        list(dict.fromkeys(ex.context for ex in task["train"]))
    tok = common.prepare_tokenizer(args, ctx, texts)
    model = common.build_model(minibert.BertForQuestionAnswering, args, tok)
    train_set, eval_set = (encode_qa(tok, task[s], max_len=args.seq_len,
                                     doc_stride=args.doc_stride,
                                     max_question_len=args.max_question_len)
                           for s in ("train", "eval"))
    if len(train_set) < args.batch_size:
        raise ValueError(f"{args.train} gives {len(train_set)} training windows, fewer than "
                         f"one batch; lower --batch-size below {len(train_set)}")
    steps_per_epoch = len(train_set) // args.batch_size
    cfg = common.train_config(args, steps_per_epoch)
    log.info("%d training questions in %d windows, %d evaluation questions in %d; %d steps "
             "of %d (%d per epoch)", len(task["train"]), len(train_set), len(task["eval"]),
             len(eval_set), cfg.max_steps, args.batch_size, steps_per_epoch)
    collate = TaskCollator(tok.pad_id)
    precision = resolve_precision(args.precision, ctx.device)
    gold = {ex.id: [text for text, _ in ex.answers] for ex in task["eval"]}  # [] if none
    last = {}

    def eval_fn(raw_model) -> dict:  # every epoch, and at the end
        pred = predict(raw_model, eval_set, collate, common.eval_batch_size(args, ctx),
                       precision, ctx.device)
        spans = best_span(pred.outputs["start_logits"], pred.outputs["end_logits"], eval_set,
                          task["eval"], args.max_answer_length, args.n_best,
                          version_2=args.version_2,
                          null_score_diff_threshold=args.null_score_diff_threshold)
        last["predictions"] = {p.id: p.text for p in spans}
        return squad_scores(last["predictions"], gold)

    # What --resume compares besides the model and training settings: the same questions,
    # cut into the same windows by the same tokenizer.
    identity = {"train file": sha256_file(args.train),
                "--max-train-examples": args.max_train_examples, "--seq-len": args.seq_len,
                "--doc-stride": args.doc_stride, "--max-question-len": args.max_question_len,
                "--version-2": args.version_2, "tokenizer": tok.fingerprint}
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, resume=args.resume,
                   lengths=[len(f["input_ids"]) for f in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    if common.finished(result, ctx):
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
