"""Pretrain BERT with masked-language modelling on WikiText: minibert's main job.

    python examples/pretrain_wikitext.py --out runs/mini            # downloads WikiText-2
    python examples/pretrain_wikitext.py --data-dir DIR --out runs/mini --precision bf16
    python examples/pretrain_wikitext.py --data-dir enwiki/ --out runs/wiki  # train.txt.gz, ...
    python examples/pretrain_wikitext.py --out runs/mini --resume   # continue a stopped run
    torchrun --nproc_per_node 2 examples/pretrain_wikitext.py --out runs/ddp

The path the data takes: text -> WordPiece tokenizer (trained once, cached) -> memory-mapped
token file (written once, cached) -> packed [CLS] ... [SEP] blocks -> dynamically masked
batches -> `minibert.training.engine.train` (`minibert.data.prepare` makes the data ready;
`minibert.cli.pretrain` holds the flags and checks this script shares with distill.py).
Outputs in --out: metrics.jsonl, eval.json,
checkpoints/, final/ (loadable by transformers, with the tokenizer) and loss.png.
Bad input ends with one line on stderr and exit status 2, before --out is touched; the exit
status says how a run ended (minibert/cli.py: 1 diverged, 3 could not write, 128 + N
stopped by signal N).
One run at a time uses an --out folder (a lock held for the run's life), a finished or
started run there is never overwritten without --resume, and --resume continues only the
same run: the data, tokenizer and settings are compared with the checkpoint's.
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

import minibert
from minibert import cli
from minibert.cli import pretrain
from minibert.data import MLMCollator
from minibert.data.prepare import save_prepared
from minibert.training.engine import train
from minibert.training.evaluation import eval_batches, evaluate
from minibert.training.resume import RunPlan
from minibert.atomic import writing
from minibert.interop.hf import transformers_class
from minibert.training.runlog import spoken_seconds
from minibert.tasks.blimp import evaluate_blimp

log = logging.getLogger("pretrain")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    job = pretrain.MAIN_JOB  # every default below is the main job's
    d = pretrain.add_data_args(p, job)
    cli.add_flags(d, job, ["--vocab-size"])
    m = p.add_argument_group("model")
    cli.add_flags(m, job, ["--preset"])
    pretrain.add_architecture_args(m)
    cli.add_flags(m, job, ["--attention", "--dropout", "--init-from", "--compile",
                           "--gradient-checkpointing"])
    pretrain.add_training_args(p, job)
    pretrain.add_budget_args(p.add_argument_group("compute budget"))
    pretrain.add_run_args(p, default_out=Path("runs/pretrain"), job=job)
    pretrain.add_eval_blimp_args(p.add_argument_group("quality beside the loss"))
    # --max-steps left out stays None (train_config fills in the job's), so that
    # --time-budget can tell it from one given: argparse fills only what a namespace lacks.
    return p.parse_args(argv, argparse.Namespace(max_steps=None))


def main(argv=None) -> int:
    args = parse_args(argv)
    # One block, read top to bottom: Ctrl-C and SIGTERM stop it in one line, --out is held
    # by its lock while the run writes, and how the block ends is the exit status
    # (minibert/cli/__init__.py has the table).
    with cli.Script(args, pretrain.flag_names(args)) as script:
        ctx = script.start()  # the device, the process group of a torchrun, logging

        # The flags and the model's fit (positions, --init-from's tokenizer and weights);
        # nothing before script.claim writes to --out.
        cfg = pretrain.check_args(args, ctx, continued=bool(args.init_from))
        pretrain.check_model_fits(args)

        # The data: the corpus, its tokenizer (trained once, cached) and its splits as
        # memory-mapped token blocks (tokenized once, cached).
        corpus = pretrain.read_corpus(args, ctx)
        minibert.set_seed(args.seed, deterministic=args.deterministic)
        data, identity = pretrain.prepare_data(args, ctx, corpus)
        tok = data.tokenizer
        blimp = pretrain.read_eval_blimp(args)  # the pairs scored at each evaluation, or None
        if blimp is not None:
            identity["--eval-blimp"] = pretrain.blimp_digest(blimp)
        train_set, eval_set = data.splits[args.train_split], data.splits[args.eval_split]

        model = minibert.fast(build_model(args, tok))  # the CPU kernels (machine-room.md)
        log.info("model: %s, %.1fM parameters; %d training blocks of %d tokens",
                 args.init_from or args.preset, sum(p.numel() for p in model.parameters()) / 1e6,
                 len(train_set), args.seq_len)

        # Training: dynamic masking of each batch as it is drawn.
        collate = MLMCollator(tok, mlm_probability=args.mask_prob, seed=args.seed,
                              whole_word_mask=args.whole_word_mask)
        # The plan, said in one summary: a few steps timed on a copy of the model (and the
        # scoring of a part of the BLiMP sample) give the run's time, and under --time-budget
        # its steps, kept from the run's start on a --resume (docs/runs.md, "A compute budget").
        scoring = pretrain.blimp_scoring(blimp, tok) if blimp is not None else None
        cfg = pretrain.plan_run(args, cfg, model, train_set, collate, ctx, identity, scoring)

        # --out: a fresh start, or a --resume of this very run (its data, tokenizer and
        # settings compared with the checkpoint's).
        if not script.claim([RunPlan(model, cfg, identity, args.out, args.resume)]):
            return 0  # the run was finished: nothing is done and nothing is written
        if ctx.is_main:
            save_prepared(args.out, data)  # the run's tokenizer and its corpus keys

        # Evaluation always masks single tokens at --eval-mask-prob, so that eval losses
        # compare across runs with and without --whole-word-mask (predicting a whole word is
        # the harder task) and across training masking rates (a 40% rate leaves less context
        # per prediction, so its own loss is higher at equal quality; Wettig et al. 2023).
        eval_collate = MLMCollator(tok, mlm_probability=args.eval_mask_prob, seed=args.seed)

        def mlm_metrics(m, precision: str) -> dict:  # in the run's precision, kept on resume
            scores = evaluate(m, eval_batches(eval_set, eval_collate, cfg, ctx), precision,
                              ctx.device, ctx)
            if blimp is not None:  # zero-shot grammar, the same pairs every time
                scores["blimp_accuracy"] = evaluate_blimp(m, tok, blimp,
                                                          precision=precision).overall
            return scores

        cli.apply_keep_freed_memory(args.keep_freed_memory, ctx)  # on by default on a CPU
        result = train(model, train_set, collate, cfg, args.out, ctx=ctx, eval_fn=mlm_metrics,
                       resume=args.resume, data_identity=identity)

        # The outputs, on rank 0 of a run that finished well (a diverged run raises).
        if cli.finished(result, ctx, cfg.lr, model, args.out):
            with writing(args.out / "final"):
                model.save_pretrained(args.out / "final", tokenizer=tok)
            pretrain.plot_losses(args.out, cfg, args)
            # Last: eval.json marks the run complete, which a --resume of it leaves alone.
            pretrain.write_json(args.out / "eval.json", {k: result[k] for k in (
                "eval_loss", "eval_accuracy", "perplexity", "steps", "tokens_seen",
                "wall_seconds", "train_seconds", "precision")})
            log.info("eval loss %.4f, accuracy %.4f, perplexity %.1f", result["eval_loss"],
                     result["eval_accuracy"], result["perplexity"])
            hf_class = transformers_class(model)
            log.info("done in %s (%s of it training); in %s: final/ (the model and its "
                     "tokenizer, %s), eval.json, metrics.jsonl, loss.png and checkpoints/",
                     spoken_seconds(result["wall_seconds"]),
                     spoken_seconds(result["train_seconds"]), args.out,
                     f"which transformers' {hf_class} loads too" if hf_class else
                     "a mix of switches transformers has no class for: minibert loads it")
    return script.status


def build_model(args, tok) -> minibert.BertForMaskedLM:
    overrides = {}
    if args.attention:
        overrides["attention"] = args.attention
    dropout = (pretrain.MAIN_JOB.dropout if args.dropout is None and not args.init_from
               else args.dropout)
    overrides.update(cli.dropout_fields(dropout))
    if args.init_from:
        # its architecture flags were checked against it in prepare (check_model_fits)
        model = minibert.BertForMaskedLM.from_pretrained(
            args.init_from, allow_vocab_mismatch=args.allow_vocab_mismatch, **overrides)
    else:
        model = minibert.BertForMaskedLM(minibert.BertConfig.preset(
            args.preset, vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
            **pretrain.architecture_overrides(args), **overrides))
    cli.in_flag_names(lambda: model.config.check_fits(args.seq_len, tok.vocab_size,
                                                      what=cli.model_source(args)),
                      cli.SEQ_LEN_FLAG)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


if __name__ == "__main__":
    sys.exit(main())
