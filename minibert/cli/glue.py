"""GLUE in one command (examples/glue.py): one recipe for every task, each task fine-tuned
from the same model folder, seed by seed, and the scores gathered as the benchmark does.

The recipe follows Cramming's "GLUE-sane" rules (Geiping & Goldstein 2023): the same
hyperparameters for every task, at most 5 epochs, and the last epoch's score, with no choice
of the best epoch or rate on the dev set (docs/quality.md gives the numbers and why).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch.nn as nn

from . import Job, dropout_fields, finished, in_flag_names
from ..atomic import write_files_atomically, writing
from ..data.sampler import batches_per_epoch
from ..data.tasks import TaskCollator
from ..data.tokenizer import Tokenizer
from ..interop.hf import config_from_hf, read_config
from ..machine.swap import fast
from ..model.heads import BertForSequenceClassification
from ..tasks.glue import GlueData, glue_average, glue_task_scores
from ..tasks.predict import predict
from ..training.distributed import DistContext
from ..training.engine import train
from ..training.rng import set_seed
from ..training.state import TrainConfig
from .pretrain import write_json

log = logging.getLogger(__name__)

# The one recipe (docs/quality.md says why each): 3 epochs of batches of 32, AdamW at 1e-4
# (a small encoder takes more than BERT-base's 2e-5 - 5e-5: Turc et al. 2019 tuned theirs
# over 3e-5 - 3e-4), 10% warmup then linear decay to 0, and the model folder's own dropout,
# as transformers' from_pretrained keeps it: 0 after the main job, which pretrains without
# dropout, 0.1 after BERT's pretraining. --random-weights keeps the folder's rate too, so that
# its start differs from the pretrained one in the weights alone.
GLUE = Job(train=TrainConfig(batch_size=32, lr=1e-4, min_lr=0.0, warmup=0.1, weight_decay=0.01,
                             eval_every=0, save_every=0),
           seq_len=128, dropout=None, epochs=3, keep_freed_memory=False)
OWN = "the model folder's own"  # --dropout's default, as task_settings records it
MAX_EPOCHS = 5  # GLUE-sane: a longer fine-tuning would stand in for pretraining

FLAGS = GLUE.flags()


def glue_model(init_from: Path, data: GlueData, dropout: Optional[float],
               random_weights: bool) -> nn.Module:
    """A classifier (a regression for STS-B) on `init_from`'s encoder, or, with
    `random_weights`, on a new encoder of the same config: the baseline that differs from
    the pretrained start in the weights alone. `dropout` sets the hidden and attention rates;
    None keeps the folder's own. Draws from torch's generator: seed first."""
    task = data.task
    head = {"num_labels": task.num_labels,
            "id2label": list(task.labels) if task.labels else None}
    rates = dropout_fields(dropout)
    if random_weights:
        config = config_from_hf(read_config(init_from), **rates)
        return BertForSequenceClassification(config, **head)
    return BertForSequenceClassification.from_pretrained(
        init_from, on_other_labels="new_head", **head, **rates)


def finetune_task(data: GlueData, tok: Tokenizer, init_from: Path, cfg: TrainConfig,
                  seq_len: int, dropout: Optional[float], epochs: int, out: Path,
                  ctx: DistContext = DistContext(), *, random_weights: bool = False,
                  overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune one task with `cfg` (its seed, rate and batch) for `epochs` and score the
    final model on every dev split: `glue_task_scores`' numbers, and `predictions`, per dev
    split, one class id (or score) per row. The run's files go to `out`."""
    task = data.task
    train_set = data.train.encode(tok, seq_len)
    evals = {name: split.encode(tok, seq_len) for name, split in data.evals.items()}
    if len(train_set) < cfg.batch_size:
        raise ValueError(f"{task.name} has {len(train_set)} training examples, fewer than one "
                         f"batch; lower --batch-size to {len(train_set)} or less")
    steps = epochs * batches_per_epoch(len(train_set), cfg.batch_size, ctx.world_size)
    cfg = in_flag_names(lambda: replace(cfg, max_steps=steps), FLAGS)
    set_seed(cfg.seed)  # the head (and, with random_weights, the encoder) drawn from it
    model = glue_model(init_from, data, dropout, random_weights)
    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)
    eval_batch = cfg.micro_batch_size or cfg.batch_size // ctx.world_size

    def eval_fn(m: nn.Module, precision: str) -> dict[str, Any]:
        results = {}
        for name, features in evals.items():
            pred = predict(m, features, collate, eval_batch, precision, ctx.device)
            if task.labels is None:  # a regression's one output per example
                predicted: list = [float(x[0]) for x in pred.outputs["logits"]]
            else:
                predicted = [int(c) for c in pred.argmax()]
            results[name] = (data.evals[name].labels, predicted)
        return {**glue_task_scores(task, results),
                "predictions": {name: predicted for name, (_, predicted) in results.items()}}

    identity = {"task": task.name, "train examples": len(train_set), "--seq-len": seq_len,
                "tokenizer": tok.fingerprint, "random weights": random_weights}
    fast(model)  # the CPU kernels, swapped in (docs/machine-room.md)
    result = train(model, train_set, collate, cfg, out, ctx=ctx, overwrite=overwrite,
                   lengths=[len(f["input_ids"]) for f in train_set], eval_fn=eval_fn,
                   data_identity=identity)
    finished(result, ctx, cfg.lr, model, out, what=f"{task.name}'s fine-tuning")
    return result["scores"]


def task_settings(data: GlueData, tok: Tokenizer, init_from: Path, cfg: TrainConfig,
                  seq_len: int, dropout: Optional[float], epochs: int, random_weights: bool
                  ) -> dict[str, Any]:
    """What a task run is trained with, by the flag that sets each (its seed aside, which
    names its folder): recorded beside its scores, which a --resume reads back only under
    the same settings."""
    return {"--init-from": str(Path(init_from).resolve()), "--random-weights": random_weights,
            "--epochs": epochs, "--batch-size": cfg.batch_size, "--lr": cfg.lr,
            "--warmup-ratio": cfg.warmup, "--weight-decay": cfg.weight_decay,
            "--dropout": OWN if dropout is None else dropout, "--seq-len": seq_len,
            "--precision": cfg.precision, "--max-train-examples": len(data.train),
            "the tokenizer": tok.fingerprint}


def check_scored(out: Path, settings: dict[str, Any]) -> None:
    """Refuse to read back the task run in `out` (a --resume) where it was scored with other
    `settings` (`task_settings`): its scores would be reported under the new ones."""
    path = out / SETTINGS_FILE
    if not (out / "scores.json").is_file() or not path.is_file():
        return
    kept = json.loads(path.read_text())
    for flag, value in settings.items():
        if kept.get(flag) != value:
            shown = "training examples" if flag == "--max-train-examples" else flag
            raise ValueError(f"--resume: {out} was scored with {shown} {kept.get(flag)}, "
                             f"this command gives {value}; give the flags it was run with, "
                             f"or choose another --out")


SETTINGS_FILE = "settings.json"


def run_task(data: GlueData, tok: Tokenizer, init_from: Path, cfg: TrainConfig, seq_len: int,
             dropout: Optional[float], epochs: int, out: Path, ctx: DistContext, *,
             random_weights: bool, resume: bool) -> dict[str, float]:
    """`finetune_task` into `out`, recorded in `out/scores.json`, with each dev split's rows
    beside it (`predictions_SPLIT.tsv`: line, label, prediction), from which any tool can
    score it again, and the settings it ran with (`task_settings`). A --resume reads a task
    run already recorded under the same settings, and starts again one that was not. A
    finished run's checkpoints are removed: GLUE's result is its scores."""
    record = out / "scores.json"
    settings = task_settings(data, tok, init_from, cfg, seq_len, dropout, epochs,
                             random_weights)
    if resume and record.is_file():
        check_scored(out, settings)  # (prepare checked every run before any was written)
        log.info("%s, seed %d: already scored in %s", data.task.name, cfg.seed, record)
        return _read_scores(record)
    result = finetune_task(data, tok, init_from, cfg, seq_len, dropout, epochs, out, ctx,
                           random_weights=random_weights, overwrite=resume)
    scores = {k: v for k, v in result.items() if isinstance(v, float)}
    if ctx.is_main:
        names = data.task.labels
        files = {}
        for split, predicted in result["predictions"].items():
            rows = ["line\tlabel\tprediction"] + [
                f"{line}\t{names[y] if names else y}\t{names[p] if names else p}"
                for line, y, p in zip(data.evals[split].lines, data.evals[split].labels,
                                      predicted)]
            files[f"predictions_{split}.tsv"] = "\n".join(rows) + "\n"
        files[SETTINGS_FILE] = json.dumps(settings, indent=2) + "\n"
        with writing(f"the predictions in {out}"):
            write_files_atomically(out, files)
        write_json(record, scores)  # last: it marks the task run complete
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return scores


def _read_scores(path: Path) -> dict[str, float]:
    return {k: float(v) for k, v in json.loads(path.read_text()).items()}


def summarize(per_task: dict[str, list[dict[str, float]]], seeds: list[int]) -> dict[str, Any]:
    """Each task's metrics over the seeds (mean, and the sample std where there are several),
    and the GLUE score: the benchmark's average of the task scores, computed for each seed,
    then its mean and std over the seeds."""
    def spread(values: list[float]) -> dict[str, Optional[float]]:
        return {"mean": float(np.mean(values)),
                "std": float(np.std(values, ddof=1)) if len(values) > 1 else None}

    tasks = {name: {"seeds": runs, **{metric: spread([r[metric] for r in runs])
                                      for metric in runs[0]}}
             for name, runs in per_task.items()}
    per_seed = [glue_average({name: runs[i]["score"] for name, runs in per_task.items()})
                for i in range(len(seeds))]
    return {"tasks": tasks, "glue": {"tasks": list(per_task), "per_seed": per_seed,
                                     **spread(per_seed)}}


def markdown(summary: dict[str, Any], title: str) -> str:
    """The results as a table: each task's metrics as mean ± std, then the GLUE score."""
    def cell(s: dict[str, Optional[float]]) -> str:
        return f"{s['mean']:.1f}" + (f" ± {s['std']:.1f}" if s["std"] is not None else "")

    lines = [f"## {title}", "", "| task | metric | score |", "|---|---|---|"]
    for name, t in summary["tasks"].items():
        metrics = [m for m in t if m not in ("seeds", "score")]
        lines.append(f"| {name} | {', '.join(metrics)} | "
                     f"{' / '.join(cell(t[m]) for m in metrics)} |")
    g = summary["glue"]
    lines.append(f"| **GLUE** | average of {len(g['tasks'])} task scores | **{cell(g)}** |")
    return "\n".join(lines) + "\n"
