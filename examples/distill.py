"""Distil a pretrained BERT (the teacher) into a smaller one (the student) with masked-LM.

    python examples/distill.py --teacher runs/mini/final --out runs/distill
    python examples/distill.py --teacher bert-base-uncased-folder --student-preset mini \\
        --alpha 0.5 --temperature 2 --data-dir DIR --out runs/distill
    python examples/distill.py --teacher runs/mini/final --out runs/distill --resume

Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network";
for BERT, Sanh et al. 2019, DistilBERT): the student learns from the teacher's whole output
distribution, not only from the one correct token, on the masked positions of WikiText.
The loss is  alpha * T^2 * KL(p_teacher^T || p_student^T) + (1 - alpha) * CE(student, labels).

The teacher's data path is pretrain_wikitext.py's (same flags, same cached files), with the
teacher's tokenizer: teacher and student share one vocabulary. The same student is then
trained again without the teacher (plain MLM, same seed, same steps), and the three are
evaluated on the same masked evaluation blocks. Outputs in --out: eval.json (teacher,
distilled, baseline), metrics.jsonl and checkpoints/ of the distillation, baseline/ (the same
for the run without the teacher) and final/ (the distilled student, loadable by
transformers, with the tokenizer). Bad input ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

import minibert
from minibert.checkpoint import latest_checkpoint
from minibert.config import PRESETS
from minibert.data import IGNORE_INDEX, MLMCollator
from minibert.distributed import cleanup
from minibert.engine import eval_batches, evaluate, train
from minibert.hf import read_config
from minibert.rundir import open_run
from minibert.precision import resolve_precision
from minibert import MaskedLMOutput

# The data preparation and training settings are pretrain_wikitext.py's, imported rather
# than copied. Run as a script, its folder is already on sys.path; imported by file path
# (as the tests do), it is not, hence the insert.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pretrain_wikitext as pretrain  # noqa: E402

log = logging.getLogger("distill")


# ---- the loss and the module the engine trains ----------------------------------------------

def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, targets: Tensor,
                      alpha: float, temperature: float) -> Tensor:
    """alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE.

    student_logits, teacher_logits: (N, V), one row per predicted token; targets: (N,).
    Both terms are means over the N tokens (the KL is summed over the vocabulary first), so
    the engine's exact accumulation, which weights a micro-batch's mean by its share of the
    global batch's tokens, applies unchanged.

    Why T^2 (Hinton et al. 2015, section 2): the gradient of the softened KL with respect to
    the student's logits is (p_student^T - p_teacher^T) / T, and those probabilities differ
    by O(1/T) for large T, so the gradient shrinks as 1/T^2. Multiplying by T^2 keeps the
    soft term's weight relative to the hard term the same whatever temperature is chosen.
    Computed in fp32: under autocast the logits may be bf16, too coarse for a log-softmax
    over the vocabulary.
    """
    student_logits, teacher_logits = student_logits.float(), teacher_logits.float()
    hard = F.cross_entropy(student_logits, targets)
    log_p_student = F.log_softmax(student_logits / temperature, dim=-1)  # (N, V)
    log_p_teacher = F.log_softmax(teacher_logits / temperature, dim=-1)  # (N, V)
    # kl_div(input, target) is KL(target || input); "batchmean" sums over V and divides by N.
    soft = F.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="batchmean")
    return alpha * temperature ** 2 * soft + (1.0 - alpha) * hard


class Distiller(nn.Module):
    """The student plus a frozen teacher, as one model that `minibert.engine.train` drives.

    Only the student is a registered submodule: `parameters()`, `state_dict()` (hence the
    optimizer and every checkpoint) and `train()` see the student alone. The teacher is kept
    as a plain attribute, frozen (`requires_grad=False`), in eval mode (no dropout: its
    targets are deterministic) and run under `no_grad`; `to()` moves it along with the
    student. `config` is the student's, which is what the engine reads (FLOPs, resume check).
    """

    def __init__(self, student: minibert.BertForMaskedLM, teacher: minibert.BertForMaskedLM,
                 alpha: float = 0.5, temperature: float = 2.0):
        super().__init__()
        check_alpha_temperature(alpha, temperature)
        if student.config.vocab_size != teacher.config.vocab_size:
            raise ValueError(f"the student has {student.config.vocab_size} output tokens and "
                             f"the teacher {teacher.config.vocab_size}: distillation compares "
                             f"their distributions token by token, so they must share one "
                             f"vocabulary")
        self.student = student
        self.config = student.config
        self.alpha, self.temperature = float(alpha), float(temperature)
        teacher.eval().requires_grad_(False)
        # object.__setattr__ bypasses nn.Module's registration of submodules.
        object.__setattr__(self, "teacher", teacher)

    def to(self, *args, **kwargs) -> "Distiller":
        self.teacher.to(*args, **kwargs)  # not a registered submodule, so moved by hand
        return super().to(*args, **kwargs)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None) -> MaskedLMOutput:
        """Inputs (B, T) as for `BertForMaskedLM`. With labels: the distillation loss and the
        student's (N, V) logits on the predicted positions; without: the student's output."""
        student = self.student(input_ids, attention_mask, token_type_ids, labels)
        if labels is None:
            return student
        with torch.no_grad():
            # Same labels, so the same N positions in the same (row-major) order.
            teacher_logits = self.teacher(input_ids, attention_mask, token_type_ids,
                                          labels).logits  # (N, V)
        targets = labels[labels != IGNORE_INDEX]  # (N,)
        loss = distillation_loss(student.logits, teacher_logits, targets, self.alpha,
                                 self.temperature)
        return MaskedLMOutput(loss, student.logits)


def check_alpha_temperature(alpha: float, temperature: float) -> None:
    if not 0.0 <= alpha <= 1.0:  # also refuses NaN
        raise ValueError(f"--alpha {alpha} must lie in [0, 1] (1 = the teacher's soft targets "
                         f"only, 0 = the hard MLM labels only)")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"--temperature {temperature} must be a finite number > 0 (1 = the "
                         f"teacher's own distribution; Hinton et al. use 1 to 20)")


# ---- command line -------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    k = p.add_argument_group("distillation")
    k.add_argument("--teacher", type=Path, required=True, help="a minibert or transformers "
                   "checkpoint folder (config.json, weights, tokenizer)")
    k.add_argument("--student-preset", default="tiny", help=f"one of {', '.join(PRESETS)}")
    k.add_argument("--alpha", type=float, default=0.5, help="weight of the soft (teacher) loss")
    k.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T")
    # The data, training and run flags are pretrain_wikitext.py's, with the same defaults;
    # the training flags apply to each of the two student runs.
    pretrain.add_data_args(p)
    m = p.add_argument_group("student")
    m.add_argument("--norm", choices=["pre", "post"], help="default post (original BERT)")
    m.add_argument("--attention", choices=["sdpa", "math", "chunked"])
    m.add_argument("--dropout", type=float, help="overrides hidden and attention dropout")
    m.add_argument("--compile", action="store_true", help="torch.compile the student + teacher")
    pretrain.add_training_args(p)
    pretrain.add_run_args(p, default_out=Path("runs/distill"))
    args = p.parse_args(argv)
    # What pretrain_wikitext's helpers read: the teacher's folder supplies the tokenizer
    # (`init_from`), and the student preset is their `preset`.
    args.init_from, args.preset, args.vocab_size = args.teacher, args.student_preset, None
    return args


def check_args(args, world_size: int) -> None:
    """The mistakes worth one clear line, before any work is done."""
    check_alpha_temperature(args.alpha, args.temperature)
    if not args.teacher.is_dir():
        raise FileNotFoundError(f"--teacher {args.teacher}: no such checkpoint folder")
    if args.student_preset not in PRESETS:
        raise ValueError(f"unknown --student-preset {args.student_preset!r}; choose one of "
                         f"{', '.join(PRESETS)}")
    pretrain.check_args(args, world_size)  # every numeric flag, the batch split


def load_teacher(args) -> tuple[minibert.BertForMaskedLM, minibert.Tokenizer]:
    """The teacher and its tokenizer, refused when they cannot serve this run's data."""
    architectures = read_config(args.teacher).get("architectures") or []
    if architectures and not any(a.endswith(("ForMaskedLM", "ForPreTraining"))
                                 for a in architectures):
        raise ValueError(f"--teacher {args.teacher} is a {', '.join(architectures)}, not a "
                         f"masked-language model: it has no MLM head to distil from (one "
                         f"would be initialised at random); pass a *ForMaskedLM checkpoint")
    teacher = minibert.BertForMaskedLM.from_pretrained(args.teacher)
    tok = minibert.Tokenizer.from_pretrained(args.teacher)
    teacher.config.check_fits(args.seq_len, tok.vocab_size, what="the teacher")
    return teacher, tok


def build_student(args, teacher: minibert.BertForMaskedLM,
                  tok: minibert.Tokenizer) -> minibert.BertForMaskedLM:
    """A fresh student of --student-preset with exactly the teacher's output vocabulary."""
    overrides = {}
    if args.attention:
        overrides["attention"] = args.attention
    if args.dropout is not None:
        overrides.update(hidden_dropout=args.dropout, attention_dropout=args.dropout)
    return minibert.BertForMaskedLM(minibert.BertConfig.preset(
        args.student_preset, vocab_size=teacher.config.vocab_size, pad_token_id=tok.pad_id,
        norm_position=args.norm or "post", **overrides))


def teacher_digest(teacher: nn.Module) -> str:
    """A hash of the teacher's weights: a resumed run must distil from the same teacher."""
    h = hashlib.blake2b(digest_size=8)
    for name, t in sorted(teacher.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def report(rows: dict[str, dict]) -> str:
    lines = ["| model | parameters | eval loss | accuracy | perplexity |",
             "|---|---|---|---|---|"]
    for r in rows.values():
        lines.append(f"| {r['model']} | {r['parameters'] / 1e6:.2f}M | {r['eval_loss']:.4f} | "
                     f"{r['eval_accuracy']:.4f} | {r['perplexity']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = None
    try:
        ctx = pretrain.start_run(args)
        check_args(args, ctx.world_size)
        with open_run(args.out, args.resume, main=ctx.is_main):
            run(args, ctx)
    except pretrain.RUN_ERRORS as e:
        return pretrain.report_error(e, ctx)
    cleanup(ctx, wait=True)
    return 0


def run(args, ctx) -> None:
    teacher, _ = load_teacher(args)
    precision = resolve_precision(args.precision, ctx.device)
    # The teacher's tokenizer (--init-from is the teacher), read after rank 0 has written it.
    tok, train_set, eval_set, identity = pretrain.prepare_data(args, ctx)
    collate = MLMCollator(tok, mlm_probability=args.mask_prob, seed=args.seed,
                          whole_word_mask=args.whole_word_mask)
    # Scored as the main job scores: single tokens at --eval-mask-prob, whatever trains.
    eval_collate = MLMCollator(tok, mlm_probability=args.eval_mask_prob, seed=args.seed)
    cfg = pretrain.train_config(args)
    # The distillation's own settings join the run identity that --resume compares.
    distill_identity = {**identity, "--alpha": args.alpha, "--temperature": args.temperature,
                        "teacher": teacher_digest(teacher)}

    def mlm_metrics(model: nn.Module) -> dict[str, float]:
        return evaluate(model, eval_batches(eval_set, eval_collate, cfg, ctx), precision,
                        ctx.device, ctx)

    teacher.to(ctx.device)
    rows = {"teacher": {"model": f"teacher ({args.teacher})",
                        "parameters": sum(p.numel() for p in teacher.parameters()),
                        **mlm_metrics(teacher)}}
    # 1. The student, distilled. The seed is set right before each student is built, so
    #    both students start from the same weights and draw the same dropout masks (the
    #    teacher, in eval mode, draws no random numbers).
    minibert.set_seed(args.seed, deterministic=args.deterministic)
    distiller = Distiller(build_student(args, teacher, tok), teacher, args.alpha,
                          args.temperature)
    n_student = sum(p.numel() for p in distiller.parameters())
    log.info("teacher: %s, %.1fM parameters; student: %s, %.1fM; alpha %g, T %g",
             args.teacher, rows["teacher"]["parameters"] / 1e6, args.student_preset,
             n_student / 1e6, args.alpha, args.temperature)
    pretrain.apply_keep_freed_memory(args, ctx)  # --keep-freed-memory, on by default on a CPU
    distilled = train(distiller, train_set, collate, cfg, args.out, ctx=ctx,
                      resume=args.resume, data_identity=distill_identity,
                      eval_fn=lambda m: mlm_metrics(m.student))
    if distilled["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 distilled["steps"])
        return
    # 2. The same student, same seed and steps, without the teacher: plain MLM.
    minibert.set_seed(args.seed, deterministic=args.deterministic)
    plain = build_student(args, teacher, tok)
    base_out = args.out / "baseline"
    baseline = train(plain, train_set, collate, cfg, base_out, ctx=ctx,
                     resume=args.resume and latest_checkpoint(base_out / "checkpoints")
                     is not None, data_identity=identity, eval_fn=mlm_metrics)
    if baseline["interrupted"]:
        log.info("interrupted at step %d of the run without the teacher; continue with "
                 "the same command plus --resume", baseline["steps"])
        return
    if ctx.is_main:
        keys = ("eval_loss", "eval_accuracy", "perplexity", "steps", "tokens_seen",
                "wall_seconds", "precision")
        rows["distilled"] = {"model": f"student {args.student_preset}, distilled (alpha "
                                      f"{args.alpha:g}, T {args.temperature:g})",
                             "parameters": n_student, "alpha": args.alpha,
                             "temperature": args.temperature,
                             **{k: distilled[k] for k in keys}}
        rows["baseline"] = {"model": f"student {args.student_preset}, without teacher",
                            "parameters": n_student, **{k: baseline[k] for k in keys}}
        pretrain.write_json(args.out / "eval.json", rows)
        distiller.student.save_pretrained(args.out / "final", tokenizer=tok)
        print(report(rows))
        print(f"\ndistilled student in {args.out / 'final'}; numbers in {args.out / 'eval.json'}")


if __name__ == "__main__":
    sys.exit(main())
