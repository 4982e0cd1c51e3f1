"""Distil a pretrained BERT (the teacher) into a smaller one (the student) with masked-LM.

    python examples/distill.py --teacher runs/mini/final --out runs/distill
    python examples/distill.py --teacher bert-base-uncased-folder --student-preset mini \\
        --alpha 0.5 --temperature 2 --data-dir DIR --out runs/distill
    python examples/distill.py --teacher runs/mini/final --out runs/distill --resume
    python examples/distill.py --teacher runs/mini/final --time-budget 1h --out runs/d1h

Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network";
for BERT, Sanh et al. 2019, DistilBERT): the student learns from the teacher's whole output
distribution, not only from the one correct token, on the masked positions of WikiText.
The loss is  alpha * T^2 * KL(p_teacher^T || p_student^T) + (1 - alpha) * CE(student, labels).

The loss and the module the engine trains are `minibert.tasks.distill`'s. The teacher's data path
is pretrain_wikitext.py's (same flags from `minibert.cli.pretrain`, same cached files), with the
teacher's tokenizer: teacher and student share one vocabulary. The same student is then
trained again without the teacher (plain MLM, same seed, same steps: under --time-budget,
the steps the distillation fits), and the three are evaluated on the same masked evaluation
blocks. Outputs in --out: eval.json (teacher, distilled, baseline), metrics.jsonl and
checkpoints/ of the distillation, baseline/ (the same for the run without the teacher) and
final/ (the distilled student with the tokenizer, loadable by transformers when its
switches are BERT's or ModernBERT's; --norm, --position and the other architecture flags are
pretrain_wikitext.py's, applied to the student). Bad input ends with one line on stderr and
exit status 2, before --out is touched; the exit status says how a run ended
(minibert/cli.py).
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import argparse
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn

import minibert
from minibert import cli
from minibert.cli import pretrain
from minibert.training.checkpoint import checkpoint_written
from minibert.model.config import ALL_PRESETS
from minibert.data import MLMCollator
from minibert.tasks.distill import Distiller, check_alpha_temperature, load_teacher, teacher_digest
from minibert.data.prepare import save_prepared
from minibert.training.engine import train
from minibert.training.evaluation import eval_batches, evaluate
from minibert.interop.hf import MODEL_FOLDER
from minibert.paths import check_readable
from minibert.training.resume import RunPlan
from minibert.atomic import writing

log = logging.getLogger("distill")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    job = pretrain.DISTILL  # the main job's defaults, for a tiny student
    k = p.add_argument_group("distillation")
    k.add_argument("--teacher", type=cli.path_flag, required=True, help="a minibert or "
                   "transformers checkpoint folder (config.json, weights, tokenizer)")
    k.add_argument("--student-preset", default=job.preset,
                   help=f"one of {', '.join(ALL_PRESETS)}")
    k.add_argument("--alpha", type=float, default=0.5, help="weight of the soft (teacher) loss")
    k.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T")
    # The data, training and run flags are pretrain_wikitext.py's, with the same defaults;
    # the training flags apply to each of the two student runs.
    pretrain.add_data_args(p, job)
    m = p.add_argument_group("student")
    pretrain.add_architecture_args(m, job)  # the student's switches; unset, its preset's own
    cli.add_flags(m, job, ["--attention", "--dropout", "--compile", "--gradient-checkpointing"])
    pretrain.add_training_args(p, job)
    pretrain.add_budget_args(p.add_argument_group("compute budget"), also=". It fits the "
                             "distillation; the run without the teacher then trains the same "
                             "steps, outside the budget")
    pretrain.add_run_args(p, default_out=Path("runs/distill"), job=job)
    # --max-steps left out stays None, so that --time-budget can tell it from one given.
    args = p.parse_args(argv, argparse.Namespace(max_steps=None))
    # What minibert.cli.pretrain reads: the teacher's folder supplies the tokenizer
    # (`init_from`), and the student preset is the one to build (`preset`).
    args.init_from, args.preset, args.vocab_size = args.teacher, args.student_preset, None
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # the signals, --out's lock and the exit status (minibert/cli/__init__.py)
    with cli.Script(args, pretrain.flag_names(args, "--student-preset")) as script:
        ctx = script.start()
        prepared = prepare(args, ctx)  # checks and reads; writes nothing
        if script.claim(prepared.runs):  # --out held: a fresh start, or the run to resume
            run(args, ctx, prepared)
    return script.status


def prepare(args, ctx) -> SimpleNamespace:
    """Everything that can be checked, before --out is touched: the flags, the teacher (its
    tokenizer and positions), the corpus (read, tokenized into the cache), the student, the
    plan (its steps under --time-budget), and what --resume compares for each of the two
    runs (their `RunPlan`s)."""
    check_alpha_temperature(args.alpha, args.temperature)
    check_readable(args.teacher, "--teacher", MODEL_FOLDER)  # there to read, or said why not
    if args.teacher.is_file():
        raise NotADirectoryError(f"--teacher {args.teacher} is a file, not a checkpoint "
                                 f"folder; pass the folder that holds config.json, the "
                                 f"weights and the tokenizer")
    if args.student_preset not in ALL_PRESETS:
        raise ValueError(f"unknown --student-preset {args.student_preset!r}; choose one of "
                         f"{', '.join(ALL_PRESETS)}")
    cfg = pretrain.check_args(args, ctx)  # every numeric flag, the batch split
    teacher, tok = cli.in_flag_names(
        lambda: load_teacher(args.teacher, args.seq_len, args.allow_vocab_mismatch,
                             what=f"--teacher {args.teacher}"), cli.SEQ_LEN_FLAG)
    student = student_config(args, teacher, tok)
    cli.in_flag_names(lambda: student.check_fits(
        args.seq_len, tok.vocab_size, what=f"--student-preset {args.student_preset}"),
        cli.SEQ_LEN_FLAG)
    # The teacher's tokenizer (--init-from is the teacher), or a resumed run's own.
    data, identity = pretrain.prepare_data(args, ctx, pretrain.read_corpus(args, ctx))
    # The distillation's own settings join the run identity that --resume compares.
    distill_identity = {**identity, "--alpha": args.alpha, "--temperature": args.temperature,
                        "teacher": teacher_digest(teacher)}
    # The student, distilled. The seed is set right before each student is built, so both
    # start from the same weights and draw the same dropout masks (the teacher, in eval
    # mode, draws no random numbers); the one without the teacher is built after the first
    # has trained. Here it is built on the meta device, for its resume check alone: its
    # class and config, without memory or random draws.
    minibert.set_seed(args.seed, deterministic=args.deterministic)
    distiller = Distiller(student_model(args, student), teacher, args.alpha, args.temperature)
    minibert.fast(distiller)  # the CPU kernels (docs/machine-room.md), as the plan times it
    with torch.device("meta"):
        plain = minibert.BertForMaskedLM(student)
    tok = data.tokenizer
    collate = MLMCollator(tok, mlm_probability=args.mask_prob, seed=args.seed,
                          whole_word_mask=args.whole_word_mask)
    # The plan, said in one summary, from a few steps of the distillation timed on a copy
    # (the teacher's forward counted; an evaluation scores the student alone, and is timed
    # so). Under --time-budget they fit its steps, which the run without the teacher then
    # takes too: the two differ in the teacher alone.
    cfg = pretrain.plan_run(args, cfg, distiller, data.splits[args.train_split], collate, ctx,
                            distill_identity, evaluated=lambda d: d.student)
    if pretrain.BUDGET in distill_identity:
        identity[pretrain.BUDGET] = distill_identity[pretrain.BUDGET]
    # Resumed, the baseline goes on from its checkpoint; one stopped before its first
    # checkpoint has only a log, of steps it will compute again, so it starts over. (One
    # whose checkpoints are all damaged is resumed, and refused: nothing is deleted.)
    base_out = args.out / "baseline"
    base_resumed = args.resume and checkpoint_written(base_out / "checkpoints")
    return SimpleNamespace(cfg=cfg, teacher=teacher, student=student, data=data,
                           collate=collate, identity=identity, distill_identity=distill_identity,
                           distiller=distiller, base_out=base_out,
                           base_resumed=base_resumed, runs=[
                               RunPlan(distiller, cfg, distill_identity, args.out, args.resume),
                               RunPlan(plain, cfg, identity, base_out, base_resumed)])


def student_model(args, config: minibert.BertConfig) -> minibert.BertForMaskedLM:
    student = minibert.BertForMaskedLM(config)
    if args.gradient_checkpointing:
        student.gradient_checkpointing_enable()
    return student


def student_config(args, teacher: minibert.BertForMaskedLM,
                   tok: minibert.Tokenizer) -> minibert.BertConfig:
    """--student-preset with its switches as the flags set them, and exactly the teacher's
    output vocabulary."""
    overrides = pretrain.architecture_overrides(args)
    if args.attention:
        overrides["attention"] = args.attention
    overrides.update(cli.dropout_fields(args.dropout))
    return cli.in_flag_names(lambda: minibert.BertConfig.preset(
        args.student_preset, vocab_size=teacher.config.vocab_size, pad_token_id=tok.pad_id,
        **overrides), pretrain.ARCHITECTURE_FLAGS)


def report(rows: dict[str, dict]) -> str:
    lines = ["| model | parameters | eval loss | accuracy | perplexity |",
             "|---|---|---|---|---|"]
    for r in rows.values():
        lines.append(f"| {r['model']} | {r['parameters'] / 1e6:.2f}M | {r['eval_loss']:.4f} | "
                     f"{r['eval_accuracy']:.4f} | {r['perplexity']:.1f} |")
    return "\n".join(lines)


def run(args, ctx, p: SimpleNamespace) -> None:
    cfg, teacher, data, distiller = p.cfg, p.teacher, p.data, p.distiller
    if ctx.is_main:
        save_prepared(args.out, data)  # the run's tokenizer and its corpus keys
    tok = data.tokenizer
    train_set, eval_set = data.splits[args.train_split], data.splits[args.eval_split]
    collate = p.collate
    # Scored as the main job scores: single tokens at --eval-mask-prob, whatever trains.
    eval_collate = MLMCollator(tok, mlm_probability=args.eval_mask_prob, seed=args.seed)

    def mlm_metrics(model: nn.Module, precision: str) -> dict[str, float]:
        return evaluate(model, eval_batches(eval_set, eval_collate, cfg, ctx), precision,
                        ctx.device, ctx)

    teacher.to(ctx.device)
    rows = {"teacher": {"model": f"teacher ({args.teacher})",
                        "parameters": sum(p.numel() for p in teacher.parameters())}}
    # 1. The student, distilled (built in `prepare`, right after the seed was set).
    n_student = sum(p.numel() for p in distiller.parameters())
    log.info("teacher: %s, %.1fM parameters; student: %s, %.1fM; alpha %g, T %g",
             args.teacher, rows["teacher"]["parameters"] / 1e6, args.student_preset,
             n_student / 1e6, args.alpha, args.temperature)
    cli.apply_keep_freed_memory(args.keep_freed_memory, ctx)  # on by default on a CPU
    distilled = train(distiller, train_set, collate, cfg, args.out, ctx=ctx,
                      resume=args.resume, data_identity=p.distill_identity,
                      eval_fn=lambda m, precision: mlm_metrics(m.student, precision))
    cli.finished(distilled, ctx, cfg.lr, distiller, args.out, what="the distillation")
    # The teacher is scored as its student is, in the precision the distillation ran in
    # (decided at its first start, whatever `auto` measures on a resume).
    rows["teacher"].update(mlm_metrics(teacher, distilled["precision"]))
    # 2. The same student, same seed and steps, without the teacher: plain MLM.
    minibert.set_seed(args.seed, deterministic=args.deterministic)
    plain = student_model(args, p.student)
    base_out = p.base_out
    minibert.fast(plain)
    baseline = train(plain, train_set, collate, cfg, base_out, ctx=ctx,
                     resume=p.base_resumed, overwrite=args.resume and not p.base_resumed,
                     data_identity=p.identity, eval_fn=mlm_metrics)
    # A baseline that diverged says nothing about distillation: no row, no final/.
    if not cli.finished(baseline, ctx, cfg.lr, plain, base_out,
                        what="the run without the teacher"):
        return
    keys = ("eval_loss", "eval_accuracy", "perplexity", "steps", "tokens_seen",
            "wall_seconds", "precision")
    rows["distilled"] = {"model": f"student {args.student_preset}, distilled (alpha "
                                  f"{args.alpha:g}, T {args.temperature:g})",
                         "parameters": n_student, "alpha": args.alpha,
                         "temperature": args.temperature, **{k: distilled[k] for k in keys}}
    rows["baseline"] = {"model": f"student {args.student_preset}, without teacher",
                        "parameters": n_student, **{k: baseline[k] for k in keys}}
    with writing(args.out / "final"):
        distiller.student.save_pretrained(args.out / "final", tokenizer=tok)
    # Last: eval.json marks the run complete, which a --resume of it then leaves as it is.
    pretrain.write_json(args.out / "eval.json", rows)
    print(report(rows))
    print(f"\ndistilled student in {args.out / 'final'}; numbers in {args.out / 'eval.json'}")


if __name__ == "__main__":
    sys.exit(main())
