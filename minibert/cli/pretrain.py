"""The masked-language-model jobs' command line: the flags, checks, settings and data that
examples/pretrain_wikitext.py (the main job) and examples/distill.py share. The numeric
rules here are those no setting checks itself; `TrainConfig`'s own are said in flag names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import tokenizers
import torch.nn as nn
from torch.utils.data import Dataset

from ..atomic import atomic_file, write_files_atomically, writing
from . import (SEQ_LEN_FLAG, Job, add_flags, check_init_weights, check_numbers, finite_flags,
               given, in_flag_names, model_flag_names, model_source, path_flag,
               refuse_shaping_flags)
from ..model.config import ALL_PRESETS, BertConfig
from ..data.corpus import CORPUS_FOLDER, Corpus, load_corpus
from ..data.prepare import PreparedCorpus, check_splits, open_prepared, prepare_corpus
from ..data.text import TEXT_FIELD
from ..data.wikitext import SPLITS as WIKITEXT_SPLITS, WIKITEXT_VARIANTS
from ..tasks.blimp import read_blimp, sample_pairs, score_pairs
from ..training import budget, runlog
from ..training.checkpoint import latest_checkpoint, load_checkpoint
from ..training.distributed import DistContext, all_gather_objects
from ..interop.hf import (MODEL_FOLDER, check_tied_decoder, config_from_hf,
                          read_config, require_safetensors)
from ..paths import check_readable
from ..machine.precision import resolve_precision
from ..interop.pretrained import check_tokenizer_fits
from ..training.optim import resolve_warmup
from ..training.state import Saved, TrainConfig
from ..data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainJob(Job):
    """A masked-LM run's defaults: `cli.Job`'s, and its corpus and masking."""

    dataset: str = "wikitext-2-raw-v1"
    train_split: str = "train"
    eval_split: str = "valid"
    mask_prob: float = 0.15  # share of tokens masked for training
    eval_mask_prob: float = 0.15  # share masked for evaluation, apart from the training rate
    position: Optional[str] = None  # --position's default; None: the preset's own


# Why the main job turns classic BERT's learned position table into rotary positions.
POSITION_WHY = ("a learned table holds the first thousand steps of real text on the "
                "unigram plateau, and a CPU-hour of rotary positions fine-tunes and scores "
                "better on GLUE and BLiMP (benchmarks/RESULTS.md, 'What pretraining buys')")

# The main job, examples/pretrain_wikitext.py: every default of its flags. Where it leaves
# BERT's recipe (30% masking, sequence-length warmup, no dropout), the flag's help says why;
# the measurements are in benchmarks/RESULTS.md. The peak learning rate is TrainConfig's own
# default, which says why (training/state.py). Five evaluations over the default 1,000 steps
# draw the eval curve in loss.png, at a cost docs/runs.md states.
MAIN_JOB = PretrainJob(
    train=TrainConfig(batch_size=32, max_steps=1000, min_lr=1e-5, warmup=0.1,
                      schedule="linear", weight_decay=0.01, adam_eps=1e-6, max_grad_norm=1.0,
                      eval_every=200, eval_batches=20, save_every=100, seq_len_warmup=0.5,
                      seq_len_start=16),
    preset="mini", position="rope", vocab_size=8192, seq_len=128, dropout=0.0, mask_prob=0.3)

# Distillation (examples/distill.py): the main job's training, a `tiny` student with its
# preset's own switches.
DISTILL = replace(MAIN_JOB, preset="tiny", position=None, dropout=None, init_from=False)

# The BertConfig fields the architecture flags set (architecture_overrides), as those flags.
ARCHITECTURE_FLAGS = {"norm_position": "--norm", "position": "--position", "mlp": "--mlp",
                      "bias": "--bias", "global_every": "--global-every",
                      "local_window": "--local-window"}

FLAGS = MAIN_JOB.flags()  # TrainConfig's fields as their flags
# The BertConfig fields flags set, as those flags (the others: --preset or --init-from).
MODEL_FLAGS = {**ARCHITECTURE_FLAGS, "attention": "--attention", "hidden_dropout": "--dropout",
               "attention_dropout": "--dropout"}

NUMBER_RULES = [  # for cli.check_numbers, which says them in the flag's name
    ("seq_len", lambda v: v >= 3, "at least 3 ([CLS], one token, [SEP])"),
    ("vocab_size", lambda v: v >= 16, "at least 16 (the special tokens and some words)"),
    ("seq_len_start", lambda v: v >= 8, "at least 8"),
    ("mask_prob", lambda v: 0 < v < 1, "between 0 and 1, e.g. 0.15"),
    ("eval_mask_prob", lambda v: 0 < v < 1, "between 0 and 1, e.g. 0.15"),
    ("dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("seed", lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
]


def flag_names(args: Any, model: Optional[str] = None) -> dict[str, str]:
    """What a refused resume calls the settings: FLAGS, the model's fields as `MODEL_FLAGS`
    or of `model` (default --init-from or --preset), and `corpus SPLIT` as its split flags."""
    chose: dict[str, list[str]] = {}
    for flag, split in (("--train-split", args.train_split), ("--eval-split", args.eval_split)):
        chose.setdefault(split, []).append(flag)
    model = model or ("--init-from" if args.init_from else "--preset")
    return {**FLAGS, **model_flag_names(model, MODEL_FLAGS),
            **{f"corpus {split}": f"the text of {' and '.join(flags)} {split} (as "
               f"--data-dir and --text-field give it)"
               for split, flags in chose.items()}}


def add_data_args(p: argparse.ArgumentParser, job: PretrainJob = MAIN_JOB
                  ) -> argparse._ArgumentGroup:
    warmup, start = job.train.seq_len_warmup, job.train.seq_len_start
    d = p.add_argument_group("data")
    d.add_argument("--data-dir", type=path_flag, help="WikiText folder (raw or tokenized layout), "
                   "or any folder of .txt, .txt.gz, .jsonl and .jsonl.gz files (documents "
                   "separated by blank lines, or one JSON object a line), read as they "
                   "stream: files named by their split (train.txt.gz, valid.jsonl, ...) "
                   "are those splits, other files are the corpus, every 20th document held "
                   "out as the valid split; default: download --dataset")
    d.add_argument("--text-field", default=TEXT_FIELD, help="the field of each JSON object "
                   "that holds its document, in --data-dir's .jsonl and .jsonl.gz files")
    d.add_argument("--dataset", default=job.dataset, choices=sorted(WIKITEXT_VARIANTS),
                   help="downloaded once into --cache-dir; $MINIBERT_WIKITEXT_URL names a mirror")
    add_flags(d, job, ["--cache-dir"])
    d.add_argument("--train-split", default=job.train_split, help="the corpus split to "
                   f"train on: one of WikiText's ({', '.join(WIKITEXT_SPLITS)}) or of "
                   "--data-dir's")
    d.add_argument("--eval-split", default=job.eval_split, help="the corpus split each "
                   "evaluation scores (its first --eval-batches batches)")
    d.add_argument("--seq-len", type=int, default=job.seq_len, help="tokens per training "
                   "block, [CLS] and [SEP] included: the documents are packed into blocks "
                   "of this length")
    d.add_argument("--mask-prob", type=float, default=job.mask_prob, help="share of tokens "
                   "masked for training; 30%% reaches a given loss in fewer steps than BERT's "
                   "15%% (Wettig et al. 2023; measured in benchmarks/RESULTS.md)")
    d.add_argument("--eval-mask-prob", type=float, default=job.eval_mask_prob, help="share "
                   "masked for evaluation; fixed apart from --mask-prob so that eval losses "
                   "compare across training rates")
    d.add_argument("--whole-word-mask", action="store_true", help="mask whole words (a piece "
                   "and the ## pieces after it) instead of single tokens")
    d.add_argument("--seq-len-warmup", type=int, help="sequence-length warmup: training "
                   "batches grow from --seq-len-start positions to --seq-len over this many "
                   f"steps (Li et al. 2022); default {warmup * 100:.0f}%% of the "
                   "schedule (--decay-steps, else --max-steps), 0 = off" + (
                       "; 0 with --init-from, whose model has learned its full length (give "
                       "one to restart the warmup)" if job.init_from else "") +
                   ". It is the largest lever on the time to a given loss "
                   "(benchmarks/RESULTS.md)")
    d.add_argument("--seq-len-start", type=int, help="positions per sequence at the first "
                   f"step of the sequence-length warmup; default {start} (no warmup "
                   f"for a --seq-len of {start} or less)")
    return d


def add_training_args(p: argparse.ArgumentParser, job: PretrainJob = MAIN_JOB) -> None:
    add_flags(p.add_argument_group("training"), job, [
        "--batch-size", "--micro-batch-size", "--max-steps", "--decay-steps", "--lr", "--min-lr",
        "--warmup-steps", "--schedule", "--weight-decay", "--adam-eps", "--max-grad-norm",
        "--precision", "--seed", "--deterministic", "--device", "--keep-freed-memory",
        "--allow-vocab-mismatch"])


def add_budget_args(group: argparse._ArgumentGroup, also: str = "") -> None:
    """--time-budget, the main job's and distillation's: a run's length as a time (`plan_run`);
    `also`: what a script adds to its help."""
    group.add_argument("--time-budget", metavar="DURATION", help="train for as many steps "
                       "as fit this time (90s, 45m, 1h, 1.5h, or seconds), measured at the "
                       "start and kept on --resume; warmup and decay fit those steps, and the "
                       "run stops at the last of them, whatever the clock says (docs/runs.md, "
                       "'A compute budget'). Instead of --max-steps and --decay-steps" + also)


def add_eval_blimp_args(group: argparse._ArgumentGroup) -> None:
    """--eval-blimp: zero-shot grammar beside the loss, at each evaluation (`read_eval_blimp`)."""
    group.add_argument("--eval-blimp", type=path_flag, metavar="DIR", help="a BLiMP folder (one "
                       ".jsonl file per paradigm): at each evaluation, score the same sample of "
                       "its minimal pairs by pseudo-log-likelihood and log blimp_accuracy, "
                       "drawn beside the loss in loss.png (docs/quality.md)")
    group.add_argument("--eval-blimp-pairs", type=int, default=EVAL_BLIMP_PAIRS,
                       help="pairs of each paradigm in that sample, the same at every "
                       "evaluation and on --resume")


# Pairs per paradigm that --eval-blimp scores at each evaluation: over BLiMP's sample of 10
# paradigms, 1,000 pairs, whose accuracy moves by about 1.6 points (one standard error,
# sqrt(0.25 / 1000)) from sample to sample. What scoring costs: benchmarks/RESULTS.md,
# "BLiMP: the main job's model against random weights".
EVAL_BLIMP_PAIRS = 100


def read_eval_blimp(args: Any) -> Optional[dict]:
    """--eval-blimp's sample of minimal pairs, read and checked before --out is touched (None
    without the flag); its digest joins the run identity, so a resume scores the same pairs."""
    if args.eval_blimp is None:
        return None
    check_numbers(args, [("eval_blimp_pairs", lambda v: v >= 1, "at least 1")])
    check_readable(args.eval_blimp, "--eval-blimp", "a BLiMP folder of .jsonl files")
    return sample_pairs(read_blimp(args.eval_blimp), args.eval_blimp_pairs)


# The share of --eval-blimp's sample that a --time-budget times, one pair of each paradigm at
# the least: scoring costs about its pairs, so a tenth tells an evaluation's cost in a tenth
# of the time (budget.ExtraScores).
BLIMP_TIMED_SHARE = 0.1


def blimp_scoring(sample: dict, tokenizer: Tokenizer) -> budget.ExtraScores:
    """What --eval-blimp adds to each evaluation, for a budget to time: the scoring of a part of
    `sample` (`read_eval_blimp`'s), and that part's share of its pairs."""
    per_paradigm = max(len(pairs) for pairs in sample.values())
    part = sample_pairs(sample, max(1, round(per_paradigm * BLIMP_TIMED_SHARE)))
    share = sum(map(len, part.values())) / sum(map(len, sample.values()))
    return budget.ExtraScores(
        lambda model, precision: score_pairs(model, tokenizer, part, precision=precision), share)


def blimp_digest(sample: dict) -> str:
    """What makes two --eval-blimp samples the same: their pairs' sentences, in order."""
    h = hashlib.blake2b(digest_size=8)
    for name, pairs in sorted(sample.items()):
        for pair in pairs:
            h.update(f"{name}\0{pair.good}\0{pair.bad}\0".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def add_run_args(p: argparse.ArgumentParser, default_out: Path, job: PretrainJob = MAIN_JOB
                 ) -> None:
    add_flags(p.add_argument_group("logging and checkpoints"), job, [
        "--out", "--log-every", "--eval-every", "--eval-batches", "--save-every", "--resume",
        "--no-progress"], out=str(default_out))


def add_architecture_args(group: argparse._ArgumentGroup, job: PretrainJob = MAIN_JOB) -> None:
    """The model's switches as flags (BertConfig's docstring): unset, the job's
    (`PretrainJob.position`), else the preset's own."""
    group.add_argument("--norm", choices=["pre", "post"], help="LayerNorm placement; default "
                       "the preset's (post for BERT's, pre for modernbert-*)")
    group.add_argument("--position", choices=["learned", "rope"], default=job.position,
                       help="position embeddings: rotary (rope) or a learned table (classic "
                       "BERT's); default " + (f"{job.position}: " + POSITION_WHY
                                              if job.position else "the preset's"))
    group.add_argument("--mlp", choices=["gelu", "geglu"], help="the feed-forward")
    group.add_argument("--bias", action=argparse.BooleanOptionalAction, help="biases in the "
                       "linear layers and LayerNorms")
    group.add_argument("--global-every", type=int, help="every n-th layer attends globally, "
                       "the others within --local-window (1: all global)")
    group.add_argument("--local-window", type=int, help="a local layer's window, in tokens")


def architecture_overrides(args: Any) -> dict[str, Any]:
    """BertConfig fields for the switches given on the command line."""
    names = {field: flag[2:].replace("-", "_") for field, flag in ARCHITECTURE_FLAGS.items()}
    return {field: getattr(args, flag) for field, flag in names.items()
            if getattr(args, flag, None) is not None}


def check_args(args: Any, ctx: DistContext, continued: bool = False) -> TrainConfig:
    """The mistakes worth one clear line, before any work; the run's settings (`continued`:
    `train_config`'s)."""
    if args.data_dir is not None:
        check_readable(args.data_dir, "--data-dir", CORPUS_FOLDER)  # or said why not
    if args.preset not in ALL_PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of "
                         f"{', '.join(ALL_PRESETS)}")
    check_numbers(args, NUMBER_RULES)
    finite_flags(args, ["lr", "min_lr", "weight_decay", "adam_eps", "max_grad_norm"])
    budget_seconds(args)  # a duration, and the only length given
    cfg = train_config(args, continued)
    require_safetensors()  # the model is saved at the end: said now, not after training
    in_flag_names(lambda: cfg.split_batch(ctx.world_size), FLAGS)
    if args.seq_len_warmup != 0 and (args.seq_len_start or 0) > args.seq_len:
        raise ValueError(f"--seq-len-start {args.seq_len_start} is longer than --seq-len "
                         f"{args.seq_len}: the warmup would never shorten a batch; lower it, "
                         f"or turn the warmup off with --seq-len-warmup 0")
    resolve_precision(args.precision, ctx.device)  # e.g. fp16 on a CPU
    return cfg


def check_model_fits(args: Any) -> None:
    """The model this run will build (--init-from's, with its tokenizer, or --preset's)
    checked against --seq-len and the vocabulary, before anything is written."""
    if args.init_from:
        check_readable(args.init_from, "--init-from", MODEL_FOLDER)
        stored = read_config(args.init_from)
        check_tied_decoder(stored)  # pretraining decodes: a masked LM
        config = config_from_hf(stored)
        # The architecture is the checkpoint's, even where a flag names the same value.
        built = [architecture_flag(field, getattr(config, field))
                 for field, flag in ARCHITECTURE_FLAGS.items() if given(args, flag)]
        refuse_shaping_flags(args, ARCHITECTURE_FLAGS.values(), ", ".join(built))
        tok = Tokenizer.from_pretrained(args.init_from)
        in_flag_names(lambda: config.check_fits(args.seq_len, tok.vocab_size,
                                                what=model_source(args)), SEQ_LEN_FLAG)
        check_tokenizer_fits(config, tok, source=args.init_from,
                             allow_vocab_mismatch=args.allow_vocab_mismatch)
        # missing, damaged or not the config's: said now, not after the data is prepared
        check_init_weights(args.init_from, config)
    else:
        config = in_flag_names(lambda: BertConfig.preset(
            args.preset, vocab_size=args.vocab_size, **architecture_overrides(args)),
            ARCHITECTURE_FLAGS)
        in_flag_names(lambda: config.check_fits(args.seq_len, args.vocab_size,
                                                what=model_source(args)), SEQ_LEN_FLAG)


def architecture_flag(field: str, value: Any) -> str:
    """An architecture field's value as the flag that sets it: `--norm post`, `--no-bias`."""
    flag = ARCHITECTURE_FLAGS[field]
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {value}"


def train_config(args: Any, continued: bool = False) -> TrainConfig:
    """The flags as the engine's settings; TrainConfig's own checks, said in flag names.
    `continued`: the run continues a pretrained model's training (the main job's
    --init-from), which is evaluated at step 0, before it trains, and whose sequence length
    is full from the start unless --seq-len-warmup restarts the warmup: the model has
    learned its full length already.
    A fresh start's horizon is --decay-steps or --max-steps (a warmup longer than it is
    refused now); a resume keeps the checkpoint's, so --max-steps may shrink. Under
    --time-budget the steps and the horizon are `plan_run`'s, after a measurement."""
    job = MAIN_JOB.train  # what an unset flag leaves; distillation trains as the main job
    # --max-steps unset is None where the script tells it from given (--time-budget refuses it)
    max_steps = args.max_steps if args.max_steps is not None else job.max_steps
    # --decay-steps 0 is given, not unset: TrainConfig refuses it.
    horizon = args.decay_steps if args.decay_steps is not None else (
        None if args.resume or budget_seconds(args) is not None else max_steps)
    # The horizon a warmup is measured against, as the flag that set it.
    flags = {**FLAGS, "total_steps": "--max-steps" if args.decay_steps is None else
             "--decay-steps"}
    return in_flag_names(lambda: replace(
        job, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=max_steps, decay_steps=horizon, lr=args.lr, min_lr=args.min_lr,
        warmup=args.warmup_steps if args.warmup_steps is not None else job.warmup,
        schedule=args.schedule, weight_decay=args.weight_decay, adam_eps=args.adam_eps,
        max_grad_norm=args.max_grad_norm, precision=args.precision, seed=args.seed,
        log_every=args.log_every, eval_every=args.eval_every, eval_batches=args.eval_batches,
        save_every=args.save_every, compile=args.compile, progress=not args.no_progress,
        seq_len_warmup=(args.seq_len_warmup if args.seq_len_warmup is not None
                        else 0 if continued else job.seq_len_warmup), eval_at_start=continued,
        seq_len_start=args.seq_len_start or job.seq_len_start), flags)


# ---- the compute budget (training/budget.py) --------------------------------------------------

BUDGET = "--time-budget"  # its record in the run's identity: {"seconds": ..., "steps": N}


def budget_seconds(args: Any) -> Optional[float]:
    """--time-budget in seconds (None: not given), refused with another length of the run."""
    text = args.time_budget
    if text is None:
        return None
    for flag, value in (("--max-steps", args.max_steps), ("--decay-steps", args.decay_steps)):
        if value is not None:
            raise ValueError(f"--time-budget {text} and {flag} {value} both set the run's "
                             f"length: give one of them")
    try:
        return budget.parse_duration(text)
    except ValueError as e:
        raise ValueError(f"--time-budget {e}") from None


def plan_run(args: Any, cfg: TrainConfig, model: nn.Module, train_set: Dataset,
             collate: Callable, ctx: DistContext, identity: dict[str, Any],
             extra: Optional[budget.ExtraScores] = None,
             evaluated: Callable[[nn.Module], nn.Module] = lambda m: m) -> TrainConfig:
    """The run's settings once its length is known, said in one summary before --out is
    touched: its steps, its schedules and the time it is estimated to take.

    A fresh start times a few steps at the lengths of its sequence-length warmup
    (budget.measure_step_times, on a copy of `model`: the run is as it would be unmeasured)
    and integrates them over the schedule (budget.estimate_seconds), so the estimate counts
    the longer steps to come. Under --time-budget the same measurement fits the steps and the
    schedule's horizon to the budget; a resume keeps the steps of the run's start and
    measures nothing (the engine says the time left at each evaluation, from the run's own
    speed). `identity` (the data's, which a resume compares) records the budget and its
    steps, so that a resume under another budget, or none, is refused by name. `extra`: what
    each evaluation scores beyond its batches (`blimp_scoring`), timed and counted too;
    `evaluated`: the part of `model` an evaluation runs (budget.measure_step_times)."""
    seconds = budget_seconds(args)
    if args.resume:
        record = recorded_budget(args.out)
        if seconds is not None:
            # no checkpoint, or a run without a budget: check_resume says which
            identity[BUDGET] = {"seconds": seconds, **({"steps": record["steps"]} if record
                                                       else {})}
            if record is not None:
                cfg = replace(cfg, max_steps=record["steps"])
        # Another budget than the run's, or none where it had one, is refused next
        # (check_resume): no plan of a run that will not happen.
        if ctx.is_main and (record or {}).get("seconds") == seconds:
            log.info("%s", describe_plan(cfg, args.seq_len, None))
            if record is not None:
                log.info("--time-budget %s: the run keeps the %s fitted at its start, "
                         "measured then and not again", args.time_budget,
                         _counted(record["steps"], "step"))
        return cfg

    full = args.seq_len
    start = cfg.seq_len_start if cfg.seq_len_warmup else full
    began = time.perf_counter()
    times = budget.measure_step_times(model, train_set, collate, cfg, ctx,
                                      budget.measured_lengths(full, start),
                                      resolve_precision(cfg.precision, ctx.device), extra=extra,
                                      evaluated=evaluated)
    took = time.perf_counter() - began
    fitted = None
    if seconds is not None:
        text = args.time_budget
        try:
            fitted = budget.fit_steps(seconds, times, cfg, full)
        except ValueError as e:
            raise ValueError(f"--time-budget {text}: {e}") from None
        # A warmup in steps longer than the steps that fit, said as the budget's
        cfg = in_flag_names(lambda: replace(cfg, max_steps=fitted.steps,
                                            decay_steps=fitted.steps),
                            {**FLAGS, "total_steps": f"the steps --time-budget {text} fits:"})
        identity[BUDGET] = {"seconds": seconds, "steps": fitted.steps}
    if ctx.is_main:
        if fitted is not None:
            log.info("--time-budget %s (%g s): %s fit, %.0f%% of the budget held back for "
                     "checkpoints and the log. The run stops at step %d, not at a time, and a "
                     "resume keeps it; --max-steps %d repeats this run exactly", text,
                     seconds, _counted(fitted.steps, "step"), budget.RESERVE * 100,
                     fitted.steps, fitted.steps)
        log.info("%s\n  timed: a step takes %s (measured in %.1f s, not counted)",
                 describe_plan(cfg, full, budget.estimate_seconds(cfg.max_steps, times, cfg,
                                                                  full)),
                 budget.describe(times), took)
    return cfg


def describe_plan(cfg: TrainConfig, full: int, estimate: Optional[float]) -> str:
    """The start-up summary, a few lines: steps, the two schedules, evaluations and
    checkpoints, and the `estimate` of the run's time in seconds (None: a resume, which
    measured nothing)."""
    steps = cfg.max_steps
    horizon = cfg.decay_steps or steps
    seq_warmup = resolve_warmup(cfg.seq_len_warmup, horizon)
    if estimate is None:
        time_said = "resumed: the time left is said at each evaluation"
    else:
        time_said = (f"about {runlog.spoken_seconds(estimate)}, the longer steps to come "
                     f"counted (said again at each evaluation)")
    if seq_warmup and cfg.seq_len_start < full:
        lengths = (f"{cfg.seq_len_start} -> {full} tokens over steps 1-{seq_warmup:,} "
                   f"(--seq-len-warmup), then {full}")
    else:
        lengths = f"{full} tokens from the first step (no --seq-len-warmup)"
    evaluations = budget.evaluations(steps, cfg) + cfg.eval_at_start
    return "\n  ".join([
        f"plan: {_counted(steps, 'step')} of {cfg.batch_size} sequences, {time_said}",
        f"learning rate: {cfg.schedule} warmup to {cfg.lr:g} over "
        f"{_counted(resolve_warmup(cfg.warmup, horizon), 'step')}, then {cfg.schedule} decay "
        f"to {cfg.min_lr:g} at step {horizon:,}",
        f"sequence length: {lengths}",
        f"evaluations: {evaluations}" + (" (step 0 included)" if cfg.eval_at_start else "")
        + f", {cfg.eval_batches} batches each (--eval-every, --eval-batches)"
        + (f"; checkpoints every {cfg.save_every:,} steps" if 0 < cfg.save_every < steps
           else "")])


def _counted(n: int, word: str) -> str:
    """`n` of `word`, as said: 1 step, 20 steps."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def recorded_budget(out: Path) -> Optional[dict[str, Any]]:
    """The budget recorded by the run in `out` (its newest intact checkpoint's), or None."""
    last = latest_checkpoint(Path(out) / "checkpoints")
    if last is None:
        return None
    saved = Saved.of(load_checkpoint(last, mmap=True, verify=False))  # tensors not read
    return (saved.data_identity or {}).get(BUDGET)


def read_corpus(args: Any, ctx: DistContext) -> Optional[Corpus]:
    """--data-dir's corpus, with --train-split and --eval-split in it, read before --out is
    touched (rank 0; None elsewhere, and where WikiText is downloaded)."""
    if args.data_dir is None:  # WikiText, to download: its splits are known beforehand
        for flag, split in (("--train-split", args.train_split), ("--eval-split", args.eval_split)):
            if split not in WIKITEXT_SPLITS:
                raise ValueError(f"{flag} {split!r}: WikiText's splits are "
                                 f"{', '.join(WIKITEXT_SPLITS)}")
    if not ctx.is_main or args.data_dir is None:
        return None
    # Refuses a folder whose files it would not all read, and a line of JSON without its text.
    corpus = in_flag_names(lambda: load_corpus(args.data_dir, text_field=args.text_field),
                           {"text_field": "--text-field"})
    # (WikiText found offline may hold valid and test alone: the message names the flags.)
    check_splits(corpus, (args.train_split, args.eval_split), args.data_dir,
                 flags=("--train-split", "--eval-split"))
    return corpus


def prepare_data(args: Any, ctx: DistContext, corpus: Optional[Corpus] = None
                 ) -> tuple[PreparedCorpus, dict[str, Any]]:
    """The corpus (rank 0 prepares it, every rank opens it) and the data's identity, which a
    resume compares; nothing is written into --out. `corpus`: `read_corpus`'s, if read."""
    splits = (args.train_split, args.eval_split)
    # A split too short for one block, said as the flags that chose the split and the length.
    flags = {**SEQ_LEN_FLAG, **{f"the {split} split": f"{flag} {split}" for flag, split in
                                (("--eval-split", args.eval_split),
                                 ("--train-split", args.train_split))}}
    made = None
    if ctx.is_main:
        data = in_flag_names(lambda: prepare_corpus(
            args.out, splits, args.seq_len, data_dir=args.data_dir, dataset=args.dataset,
            cache_dir=args.cache_dir, init_from=args.init_from, vocab_size=args.vocab_size,
            resume=args.resume, corpus=corpus), flags)
        made = (data.tokenizer.backend.to_str(), data.keys)
    if ctx.distributed:  # every rank encodes with the one pipeline --out/tokenizer will hold
        tok_json, keys = all_gather_objects(made, ctx)[0]
        data = in_flag_names(lambda: open_prepared(Tokenizer(tokenizers.Tokenizer.from_str(
            tok_json)), keys, args.seq_len, args.cache_dir), flags)
    identity = {"corpus": data.keys, "--train-split": args.train_split,
                "--eval-split": args.eval_split, "--seq-len": args.seq_len,
                "--mask-prob": args.mask_prob, "--whole-word-mask": args.whole_word_mask,
                "tokenizer": data.tokenizer.fingerprint}
    # Left out where it is --mask-prob: checkpoints from before the flag stay resumable.
    if args.eval_mask_prob != args.mask_prob:
        identity["--eval-mask-prob"] = args.eval_mask_prob
    return data, identity


def write_json(path: Path, obj: Any) -> None:
    """Written whole (`write_files_atomically`): a crash keeps the previous file."""
    with writing(path):
        write_files_atomically(path.parent, {path.name: json.dumps(obj, indent=2) + "\n"})


# ---- loss.png ---------------------------------------------------------------------------------

def loss_figure(rows: list[dict[str, Any]], cfg: TrainConfig, args: Any) -> Any:
    """The run's curves from its metrics.jsonl `rows`, each labelled with what it measures.
    The training loss masks --mask-prob of sequences whose length grows during the
    sequence-length warmup (shaded); the eval loss masks --eval-mask-prob of full blocks of
    --eval-split. The two differ in what they ask, so each compares with itself only: a gap
    between them is not overfitting. --eval-blimp's accuracy has an axis of its own."""
    import matplotlib.pyplot as plt

    train_rows = [r for r in rows if "loss" in r]
    eval_rows = [r for r in rows if "eval_loss" in r]
    blimp_rows = [r for r in rows if "blimp_accuracy" in r]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    seq_warmup = resolve_warmup(cfg.seq_len_warmup, cfg.decay_steps or cfg.max_steps)
    if seq_warmup and cfg.seq_len_start < args.seq_len:
        ax.axvspan(0, seq_warmup, color="0.9", label=f"sequence-length warmup "
                   f"({cfg.seq_len_start} -> {args.seq_len} tokens)")
    ax.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows],
            label=f"training loss ({args.mask_prob:.0%} masked, training length)")
    if eval_rows:
        ax.plot([r["step"] for r in eval_rows], [r["eval_loss"] for r in eval_rows], "o-",
                label=f"eval loss ({args.eval_mask_prob:.0%} masked, {args.seq_len} tokens, "
                      f"{args.eval_split} split)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("MLM loss (each curve compares with itself)")
    ax.legend(loc="upper right", fontsize=8)
    if blimp_rows:  # the quality curve beside the loss, on its own axis
        acc = ax.twinx()
        acc.plot([r["step"] for r in blimp_rows], [100 * r["blimp_accuracy"] for r in blimp_rows],
                 "s--", color="tab:green", label="BLiMP accuracy")
        acc.set_ylabel("BLiMP accuracy (%)")
        acc.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_losses(out: Path, cfg: TrainConfig, args: Any) -> None:
    """`out`/loss.png from `out`/metrics.jsonl (`loss_figure`), written whole or not at all;
    nothing without matplotlib (an optional extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig = loss_figure(runlog.read_rows(out / "metrics.jsonl"), cfg, args)  # pyplot's current
    with writing(out / "loss.png"), atomic_file(out / "loss.png") as f:
        plt.savefig(f, format="png", dpi=110)
    plt.close(fig)
