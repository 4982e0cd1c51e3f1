"""The fine-tuning scripts' shared wiring: flags and their checks, the tokenizer, the model,
the training settings, the labels file and the evaluation of a labelled task.

The four examples/finetune_*.py scripts are these pieces and `cli.Script`, with their own
data flags and outputs. Every check runs before --out is touched (a ValueError: exit 2).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import tokenizers
import torch.nn as nn

from ..atomic import write_files_atomically, writing
from . import (SEQ_LEN_FLAG, Job, add_flags, check_numbers, dropout_fields, finite_flags,
               in_flag_names, model_flag_names, model_source, refuse_shaping_flags)
from ..model.config import ALL_PRESETS, BertConfig
from ..data.sampler import batches_per_epoch
from ..data.tasks import TaskData, word_predictions
from ..training.distributed import DistContext, all_gather_objects
from ..interop.hf import MODEL_FOLDER, config_from_hf, read_config, require_safetensors
from ..tasks.metrics import sequence_scores, token_scores
from ..paths import check_readable
from ..machine.precision import resolve_precision
from ..tasks.predict import Predictions
from ..interop.pretrained import PretrainedMixin, check_tokenizer_fits
from ..training.state import TrainConfig
from ..data.tokenizer import Tokenizer
from .pretrain import write_json

# The fine-tuning scripts' defaults: BERT's recipe (a few epochs, a short linear warmup).
# From a checkpoint the rate is 1e-4, the GLUE recipe's: a small encoder takes more than
# BERT-base's 2e-5 - 5e-5 (Turc et al. 2019 tuned theirs over 3e-5 - 3e-4), and from a
# pretrained `mini` 1e-4 beat 5e-5 on every task measured (benchmarks/RESULTS.md,
# "Fine-tuning's defaults from a checkpoint"). From random weights the model learns faster
# with a higher rate. Dropout is BERT's 0.1 from random weights and, from a checkpoint, the
# checkpoint's own, as transformers' from_pretrained keeps it: 0.1 after BERT's pretraining,
# 0 after the main job's, which then fine-tunes as it pretrained (RESULTS, "Dropout from a
# checkpoint: its own").
FINETUNE = Job(train=TrainConfig(batch_size=32, lr=5e-4, min_lr=0.0, warmup=0.1, weight_decay=0.01),
               preset="mini", vocab_size=8192, seq_len=128, dropout=0.1, epochs=3,
               lr_init_from=1e-4, dropout_init_from=None, keep_freed_memory=False)

FLAGS = FINETUNE.flags()  # TrainConfig's fields as their flags


def flag_names(args: Any) -> dict[str, str]:
    """What a refused resume calls the settings: FLAGS, and the model's as its flags."""
    return {**FLAGS, **model_flag_names("--init-from" if args.init_from else "--preset", {
        "hidden_dropout": "--dropout", "attention_dropout": "--dropout"})}


def add_args(p: argparse.ArgumentParser, *, out: str, unit: str = "examples",
             job: Job = FINETUNE, epoch: str = "passes over the training data") -> None:
    """The model, training and output flags of every fine-tuning script (`cli.flag_specs`)."""
    add_flags(p.add_argument_group("model"), job, [
        "--init-from", "--random-weights", "--preset", "--vocab-size", "--cache-dir", "--dropout",
        "--allow-vocab-mismatch", "--gradient-checkpointing"])
    add_flags(p.add_argument_group("training"), job, [
        "--epochs", "--max-steps", "--decay-steps", "--batch-size", "--micro-batch-size", "--lr",
        "--min-lr", "--warmup-ratio", "--weight-decay", "--precision", "--seed", "--device",
        "--keep-freed-memory"], unit=unit, epoch=epoch)
    add_flags(p.add_argument_group("logging and checkpoints"), job,
              ["--out", "--log-every", "--resume", "--no-progress"], out=out)


def learning_rate(args: Any) -> float:
    """--lr, or its default: FINETUNE's from a checkpoint (--init-from) or from random weights."""
    if args.lr is not None:
        return args.lr
    return FINETUNE.lr_init_from if args.init_from else FINETUNE.train.lr


def dropout_rate(args: Any) -> Optional[float]:
    """--dropout, or its default: from random weights FINETUNE's, from a checkpoint None (its
    own, which `build_model` keeps)."""
    if args.dropout is not None:
        return args.dropout
    return FINETUNE.dropout_init_from if args.init_from else FINETUNE.dropout


def check_args(args: Any, ctx: DistContext, positive: Sequence[str] = ()) -> TrainConfig:
    """The mistakes in the shared flags worth one clear line, before any work; the settings
    (`epoch_config` adds the epochs). `positive`: the script's flags that must be >= 1."""
    for flag in ("train", "eval"):  # each path there to read, or said why not
        if getattr(args, flag, None) is not None:
            check_readable(getattr(args, flag), f"--{flag}")
    if args.init_from:
        refuse_shaping_flags(args)  # --preset and --vocab-size: the checkpoint's are its own
        check_readable(args.init_from, "--init-from", MODEL_FOLDER)
    elif args.random_weights:
        raise ValueError("--random-weights needs --init-from: it starts from new weights of "
                         "that checkpoint's config and tokenizer (without --init-from the "
                         "weights are new already, of --preset)")
    elif args.preset not in ALL_PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of "
                         f"{', '.join(ALL_PRESETS)}")
    require_safetensors()  # the model is saved at the end: said now, not after training
    finite_flags(args, ["lr", "min_lr", "weight_decay"])
    check_columns(args)
    check_numbers(args, [
        # the rest of the integers are TrainConfig's
        *((flag, lambda v: v >= 1, "at least 1") for flag in ("epochs", *positive)),
        ("dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
        # Said here rather than by TrainConfig, whose message offers a step count instead.
        ("warmup_ratio", lambda v: 0 <= v < 1, "a fraction of the schedule in [0, 1), e.g. 0.1")])
    cfg = train_config(args, steps_per_epoch=1)
    in_flag_names(lambda: cfg.split_batch(ctx.world_size), FLAGS)
    resolve_precision(args.precision, ctx.device)  # e.g. fp16 on a CPU
    if args.init_from:
        read_config(args.init_from)  # a missing folder, or a training checkpoint, said at once
    return cfg


def train_config(args: Any, steps_per_epoch: int) -> TrainConfig:
    """The flags as the engine's settings, evaluating and saving every `steps_per_epoch`."""
    return in_flag_names(lambda: replace(
        FINETUNE.train, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=args.max_steps if args.max_steps is not None else
        args.epochs * steps_per_epoch,
        decay_steps=args.decay_steps, lr=learning_rate(args), min_lr=args.min_lr,
        warmup=args.warmup_ratio, weight_decay=args.weight_decay, precision=args.precision,
        seed=args.seed, log_every=args.log_every, eval_every=steps_per_epoch,
        save_every=steps_per_epoch, progress=not args.no_progress), FLAGS)


def check_columns(args: Any) -> None:
    """--text-column, --text-pair-column and --label-column name three different columns (a
    label column read as text would hand the model its answer)."""
    seen: dict[str, str] = {}  # column -> the flag that named it
    for name in ("text_column", "text_pair_column", "label_column"):
        column, flag = getattr(args, name, None), f"--{name.replace('_', '-')}"
        if column in seen:
            raise ValueError(f"{seen[column]} and {flag} both name the column {column!r}; "
                             f"name each of the file's columns once")
        if column:
            seen[column] = flag


def epoch_config(args: Any, ctx: DistContext, n_train: int, what: str) -> TrainConfig:
    """The settings once the training set is encoded; `what` names it, if short of a batch."""
    if n_train < args.batch_size:
        raise ValueError(f"{what}, fewer than one batch; lower --batch-size to {n_train} or less")
    return train_config(args, batches_per_epoch(n_train, args.batch_size, ctx.world_size))


def eval_batch_size(args: Any, ctx: DistContext) -> int:
    """Evaluation batches: a training micro-batch, whose memory the run is known to fit."""
    return args.micro_batch_size or args.batch_size // ctx.world_size


def prepare_tokenizer(args: Any, ctx: DistContext, texts: Iterable[str]) -> Tokenizer:
    """The run's tokenizer: a resumed run's own, else --init-from's, else one trained on
    `texts`. Every rank gets rank 0's (or its error), so all ranks encode alike."""
    made, error = None, None
    if ctx.is_main:
        kept = args.out / "tokenizer"
        try:
            if args.resume and (kept / "tokenizer.json").is_file():
                tok = Tokenizer.from_pretrained(kept)
            elif args.init_from:
                tok = Tokenizer.from_pretrained(args.init_from)
            else:
                tok = Tokenizer.train_from_iterator(texts, vocab_size=args.vocab_size,
                                                    cache_dir=args.cache_dir)
            made = tok.backend.to_str()
        except (ValueError, OSError) as e:
            if not ctx.distributed:
                raise
            error = e
    made, message = all_gather_objects((made, error and str(error)), ctx)[0]
    if message is not None:  # rank 0 raises its own error, the other ranks its message
        raise error or ValueError(message)
    # Every rank, rank 0 too, uses the serialized pipeline: what --out/tokenizer will hold.
    return Tokenizer(tokenizers.Tokenizer.from_str(made))


def save_tokenizer(args: Any, ctx: DistContext, tok: Tokenizer) -> None:
    """Rank 0 writes the run's tokenizer to --out/tokenizer; a resumed run's is kept."""
    if ctx.is_main and not (args.resume and (args.out / "tokenizer" / "tokenizer.json").is_file()):
        with writing(args.out / "tokenizer"):
            tok.save(args.out / "tokenizer")


def build_model(cls: Any, args: Any, tok: Tokenizer, **head: Any) -> nn.Module:
    """`cls(config, **head)` from --init-from or --preset, checked against --seq-len and
    `tok` before the weights are read. A checkpoint trained for other labels than
    `head["id2label"]` gets a new head (its classifier would score the wrong classes).
    --random-weights: new weights of --init-from's config, drawn from torch's generator."""
    rate = dropout_rate(args)
    dropout = dropout_fields(rate)
    if args.init_from:
        config = config_from_hf(read_config(args.init_from), **dropout)
    else:
        config = BertConfig.preset(args.preset, vocab_size=tok.vocab_size,
                                   pad_token_id=tok.pad_id, **dropout)
    in_flag_names(lambda: config.check_fits(args.seq_len, tok.vocab_size,
                                            what=model_source(args)), SEQ_LEN_FLAG)
    if args.init_from:
        check_tokenizer_fits(config, tok, source=args.init_from,
                             allow_vocab_mismatch=args.allow_vocab_mismatch)
    if args.init_from and not args.random_weights:
        options: dict[str, Any] = {"allow_vocab_mismatch": args.allow_vocab_mismatch}
        if issubclass(cls, PretrainedMixin) and "id2label" in head:  # BertMultiTask: no head read
            options["on_other_labels"] = "new_head"
        model = cls.from_pretrained(args.init_from, **options, **head, **dropout)
    else:
        model = cls(config, **head)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def check_labels(args: Any, names: list[str], what: str = "labels") -> None:
    """A resumed run's labels.json against the labels `names` read now."""
    path = args.out / "labels.json"
    if args.resume and path.is_file():
        if (before := json.loads(path.read_text())["id2label"]) != names:
            raise ValueError(f"cannot resume: the run was trained on the {what} {before} but "
                             f"{args.train} now has {names}")


def save_labels(args: Any, names: list[str]) -> None:
    """labels.json, written by a new run (rank 0); a resumed one keeps its own."""
    if not (args.resume and (args.out / "labels.json").is_file()):
        write_json(args.out / "labels.json", {"id2label": names})


def task_scores(task: TaskData, pred: Predictions, features: Sequence[Mapping],
                scheme: str = "IOB2") -> dict[str, Any]:
    """The scores of `pred` on `task`'s eval `features`, and `predictions` (ids or tags)."""
    if task.kind == "sequence":
        preds = [int(p) for p in pred.argmax()]
        return {**sequence_scores(task.eval.labels, preds, task.names, pred.loss),
                "predictions": preds}
    ids = word_predictions(features, pred.argmax())  # per sentence, per word: a tag id
    return {**token_scores(task.eval.labels, ids, task.names, scheme, pred.loss),
            "predictions": [[task.names[i] for i in s] for s in ids]}


def summary(result: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """eval.json's content: `fields`, then the run totals of `engine.train`'s result."""
    return {**fields, **{k: result[k] for k in ("steps", "tokens_seen", "wall_seconds",
                                                "precision")}}


def write_eval(out: Path, files: Optional[Mapping[str, str]] = None, **content: Any) -> None:
    """`files` (name -> text), then eval.json, written last: it marks the results complete."""
    contents = {**(files or {}), "eval.json": json.dumps(content, indent=2) + "\n"}
    with writing(f"{', '.join(contents)} in {out}"):
        write_files_atomically(out, contents)
