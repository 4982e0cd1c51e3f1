"""What every command-line script of examples/ shares: its parser, its start, how it ends.

    __init__.py  the parser, the shared flags, a script's start and its exit status (here)
    console.py   stdout and stderr under any locale, and a stdout whose reader has left
    pretrain.py  the masked-LM jobs' flags, checks and data (pretrain_wikitext.py, distill.py)
    finetune.py  the fine-tuning scripts' flags, model, settings and evaluation
    glue.py      GLUE's one recipe, a task fine-tuned and scored, the results gathered

The scripts' layer sits on top: it may import every other package, and none imports it. It
logs the scripts' one-line errors to stderr and says the settings' fields as flag names.

A script's life is one `with cli.Script(args) as script:` block that checks, then writes,
and ends in an exit status (docs/runs.md, "Checked before anything is written" and "Exit
statuses"): 0 finished; 1 diverged or out of memory; 2 bad input, refused before --out is
touched; 3 could not write; 128 + N stopped by signal N, in one line, not a traceback.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import math
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

import torch
import torch.nn as nn

from ..machine import memory
from . import console
from ..atomic import NO_ROOM, WriteError, could_not_write, write_failure
from ..training.checkpoint import CheckpointError
from ..model.config import ALL_PRESETS, BertConfig
from ..model.model import BertModel
from ..interop.hf import (check_weights, config_from_hf, listed, match_hf_state_dict,
                          read_config, read_weights)
from ..model.heads import BertForMaskedLM
from ..data.tokens import TokenFileError
from ..data.wikitext import DownloadError
from ..training.distributed import DistContext, all_gather_objects, cleanup, init_distributed
from ..training.recovery import TrainingError
from ..training.resume import check_resume
from ..training.rundir import RunFolder, open_run
from ..training.runlog import last_training_loss
from ..training.signals import Interrupted, StopOnSignals, Stopped
from ..training.state import SettingsMismatch, TrainConfig
from ..data.tokenizer_train import default_cache_dir

log = logging.getLogger(__name__)

# Bad input: exit status 2. TokenFileError and CheckpointError are ValueErrors, named for
# the reader; DownloadError (a RuntimeError) is bad input too: no corpus, no run.
BAD_INPUT = (ValueError, OSError, ImportError, DownloadError, TokenFileError, CheckpointError)

T = TypeVar("T")


# ---- the parser ------------------------------------------------------------------------------

class _DefaultsHelp(argparse.HelpFormatter):
    """--help with every flag's default: argparse's ArgumentDefaultsHelpFormatter shows it
    only for flags that have help text, and shows "(default: None)" where a script computes
    the default (its help says how). Switches (store_true) default to off and say nothing."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self._default(action) is not None:
            action = copy.copy(action)  # argparse writes no help line without help text
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").strip()
        if self._default(action) is None or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)".strip()

    @staticmethod
    def _default(action: argparse.Action) -> Any:
        if (not action.option_strings or action.nargs == 0
                or action.default is argparse.SUPPRESS):
            return None
        return action.default


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with the defaults in --help, and a negative number after a flag
    taken as its value: argparse reads `--lr -1e-4` as two flags and says only "expected one
    argument"; joined into `--lr=-1e-4`, the value reaches the flag's own check. The parsed
    namespace's `given_flags` holds the flags the command line gave (`given`)."""

    def __init__(self, description: str) -> None:
        super().__init__(description=description, formatter_class=_DefaultsHelp)

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace=None):
        takes_number = {s for a in self._actions if a.type in (int, float) and a.nargs is None
                        for s in a.option_strings}
        argv: list[str] = []
        for arg in sys.argv[1:] if args is None else args:
            if argv and argv[-1] in takes_number and _negative_number(arg):
                argv[-1] += "=" + arg
            else:
                argv.append(arg)
        parsed = super().parse_args(argv, namespace)
        # A default reads the same as that value typed (`--preset mini`), so the flags given
        # are found by parsing again with every default suppressed: argparse then sets the
        # fields of the flags given alone, in every spelling it takes (`--flag=v`,
        # `--no-flag`, a prefix of the flag).
        defaults = [(a, a.default) for a in self._actions]
        try:
            for action, _ in defaults:
                action.default = argparse.SUPPRESS
            probe = super().parse_args(argv)
        finally:
            for action, default in defaults:
                action.default = default
        parsed.given_flags = frozenset(a.option_strings[0] for a in self._actions
                                       if a.option_strings and hasattr(probe, a.dest))
        return parsed


def dropout_fields(rate: Optional[float]) -> dict[str, float]:
    """--dropout as config fields: the hidden and the attention rate both, or none where
    `rate` is None, so that the config's own rates stand."""
    return {} if rate is None else {"hidden_dropout": rate, "attention_dropout": rate}


def given(args: Any, flag: str) -> bool:
    """Whether the command line gave `flag` (its first option string, e.g. "--bias" for
    --no-bias too), rather than argparse filling in its default."""
    return flag in args.given_flags


def path_flag(text: str) -> Path:
    """A path flag's value (`type=path_flag`), one way in every script: `~` expanded, as the
    shell does not after `=` (`--out=~/run` would be the folder ./~/run), and an empty path
    refused, which would be the current folder and is never meant."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; give a file or folder (\".\" for "
                                         "the current folder)")
    return Path(text).expanduser()


def _negative_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.startswith("-")


# ---- the shared flags ------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """A kind of run's defaults, which `flag_specs` gives its flags (`pretrain.MAIN_JOB`,
    `finetune.FINETUNE`). A run in `epochs` warms up by a share (--warmup-ratio), one in
    steps (`epochs` None) by a count. `lr_init_from`: --lr's default with --init-from;
    `dropout_init_from`: --dropout's (None: the checkpoint's own). `init_from`: whether the
    script can start from a checkpoint (--init-from), which some defaults then depend on."""

    train: TrainConfig
    preset: str = "mini"
    vocab_size: int = 8192
    seq_len: int = 128
    dropout: Optional[float] = None  # from random weights; None: the preset's own
    epochs: Optional[int] = None
    lr_init_from: Optional[float] = None
    dropout_init_from: Optional[float] = None
    keep_freed_memory: Optional[bool] = None  # None: on a CPU (apply_keep_freed_memory)
    init_from: bool = True

    def flags(self) -> dict[str, str]:
        """TrainConfig's fields as the flags that set them, for its messages."""
        return {f: "--" + f.replace("_", "-") for f in self.train.flat()} | {
            "warmup": "--warmup-steps" if self.epochs is None else "--warmup-ratio"}


_KEEP_FREED_MEMORY = (
    "reuse freed memory instead of returning it to the kernel (glibc), from the first "
    "training step; {when}. The trade: faster steps where the host's page faults are dear "
    "(no gain where they are cheap), and a resident set that stays at its peak instead of "
    "shrinking after one; it does not make the set grow over a long run "
    "(benchmarks/RESULTS.md, 'Memory over a long run' and 'Process settings')")


_DETERMINISTIC = (
    "deterministic kernels: on a GPU, the same command then gives the same bits (slower); on "
    "a CPU it already does at a fixed thread count, and this adds nothing (docs/runs.md, "
    "'The same result')")


# The flags whose meaning and default are the same in every script, training or not.
PLAIN_FLAGS: dict[str, dict] = {
    "--device": dict(choices=["auto", "cpu", "cuda"], default="auto",
                     help="where the model runs; auto: cuda when available"),
    "--cache-dir": dict(type=path_flag, help="where downloads, trained tokenizers and token files "
                        "are kept for later runs to reuse; default $MINIBERT_CACHE or "
                        "~/.cache/minibert"),
    "--allow-vocab-mismatch": dict(action="store_true", help="with a checkpoint: accept a "
                                   "tokenizer whose ids or special tokens are not the model's "
                                   "(deliberate vocabulary surgery); refused by default"),
}


def flag_specs(job: Job, unit: str = "sequences", out: str = "runs",
               epoch: str = "passes over the training data") -> dict[str, dict]:
    """Every shared flag, declared once: option string -> `add_argument` arguments, defaults
    from `job`. `unit`: what a batch holds; `out`: the default --out; `epoch`: --epochs'."""
    t, by_epochs = job.train, job.epochs is not None
    scratch_dropout = ("the preset's" if job.dropout is None else f"{job.dropout:g}" + (
        " (as in Cramming and ModernBERT: in a short pretraining run there is no overfitting "
        "to prevent, and dropout slows learning)" if job.dropout == 0 else ""))
    return {
        **PLAIN_FLAGS,
        # model
        "--init-from": dict(type=path_flag, help="start from a minibert or transformers checkpoint "
                            "(a folder with config.json, weights and tokenizer); default: "
                            "random weights and a new tokenizer"),
        "--random-weights": dict(action="store_true", help="with --init-from: a new model of "
                                 "its config, with its tokenizer and every other setting as "
                                 "given; the untrained baseline that differs from the "
                                 "pretrained start in the weights alone"),
        "--preset": dict(default=job.preset,
                         help=f"without --init-from: one of {', '.join(ALL_PRESETS)}"),
        "--vocab-size": dict(type=int, default=job.vocab_size, help="the size of the "
                             "WordPiece vocabulary trained for the run, without --init-from"),
        "--dropout": dict(type=float, help="hidden and attention dropout; default " + (
            scratch_dropout if not job.init_from else
            f"from random weights {scratch_dropout}, from a checkpoint its own"
            if job.dropout_init_from is None else
            f"{job.dropout_init_from:g} from a checkpoint too, as BERT fine-tunes: a "
            "checkpoint's own rate is its pretraining's (0 after the main job)")),
        "--attention": dict(choices=["sdpa", "math", "chunked"], help="how attention is "
                            "computed, the same numbers each way: sdpa, torch's fused kernel; "
                            "math, the formula written out, to read; chunked, exact attention "
                            "in memory linear in the length; default the model's own (sdpa "
                            "for a new one)"),
        "--compile": dict(action="store_true", help="torch.compile the model (distillation: "
                          "the student and the teacher); on the CPUs measured it did not pay: "
                          "no faster on packed batches, slower on padded ones, after a compile "
                          "of tens of seconds (benchmarks/RESULTS.md, 'torch.compile on this "
                          "CPU')"),
        "--gradient-checkpointing": dict(action="store_true", help="recompute each encoder "
                                         "block's activations in the backward pass instead of "
                                         "keeping them: the same gradients in less memory, "
                                         "for one more forward of the blocks"),
        # training: the run's length and its schedule
        "--epochs": dict(type=int, default=job.epochs, help=epoch),
        "--max-steps": dict(type=int, default=None if by_epochs else t.max_steps,
                            help=("stop after this many steps (overrides --epochs)"
                                  if by_epochs else "where this run stops")
                            + "; may change on --resume to stop earlier or go further"),
        "--decay-steps": dict(type=int, help="the learning-rate schedule's horizon, fixed for "
                              "the whole run; steps past it run at --min-lr (default: the "
                              "steps of the run's first start)"),
        "--batch-size": dict(type=int, default=t.batch_size, help=f"global: {unit} per step"),
        "--micro-batch-size": dict(type=int, help=f"{unit} per forward pass on each rank, "
                                   "whose gradients add up to the global batch's; default "
                                   "batch / world size"),
        "--lr": (dict(type=float, help="the peak learning rate, reached at the end of the "
                      f"warmup; default {_number(job.lr_init_from)} with --init-from (a "
                      "small encoder's rate; BERT-base and larger fine-tune at 2e-5 to 5e-5), "
                      f"{_number(t.lr)} without") if job.lr_init_from is not None
                 else dict(type=float, default=t.lr, help="the peak learning rate, reached "
                           "at the end of the warmup")),
        "--min-lr": dict(type=float, default=t.min_lr, help="the rate at the horizon and after"),
        # A share of a schedule whose length is not known yet, or a step count.
        "--warmup-ratio": dict(type=float, default=t.warmup, help="the learning rate's "
                               "linear warmup, as a fraction of the steps it decays over"),
        "--warmup-steps": dict(type=int, help="steps of the learning rate's linear warmup; "
                               f"default {t.warmup * 100:.0f}%% of --decay-steps"),
        "--schedule": dict(choices=["linear", "cosine"], default=t.schedule,
                           help="the learning rate's decay after the warmup, down to --min-lr "
                           "at the horizon"),
        "--weight-decay": dict(type=float, default=t.weight_decay, help="AdamW's decoupled "
                               "weight decay, on the weight matrices only (not on biases and "
                               "LayerNorm gains)"),
        "--adam-eps": dict(type=float, default=t.adam_eps, help="AdamW's epsilon, which bounds "
                           "an update where the gradient's second moment is tiny (RoBERTa's "
                           "1e-6; PyTorch's 1e-8 lets such updates explode)"),
        "--max-grad-norm": dict(type=float, default=t.max_grad_norm, help="clip the gradient's "
                                "global norm to this before each step"),
        "--precision": dict(choices=["auto", "fp32", "bf16", "fp16"], default=t.precision,
                            help="auto: bf16 on a CUDA GPU that has it and on a CPU whose "
                            "flags name bf16 matrix instructions (AMX, AVX512-BF16, Arm "
                            "BF16); fp32 elsewhere"),
        "--seed": dict(type=int, default=t.seed, help="seeds every random choice of the "
                       "run: new weights, the data's order, dropout, and a masked LM's "
                       "masking"),
        "--deterministic": dict(action="store_true", help=_DETERMINISTIC),
        # Both forms in every script, whatever its default: a command line that turns the
        # setting off explicitly works the same in pretraining and fine-tuning.
        "--keep-freed-memory": dict(
            action=argparse.BooleanOptionalAction, default=job.keep_freed_memory,
            help=_KEEP_FREED_MEMORY.format(
                when="on by default on a CPU" if job.keep_freed_memory is None else
                "off by default here: fine-tuning heads refill smaller buffers than "
                "pretraining's vocabulary-wide logits")),
        # logging and checkpoints
        "--out": dict(type=path_flag, default=Path(out), help="the run's folder: its "
                      "checkpoints, metrics.jsonl and outputs"),
        "--log-every": dict(type=int, default=t.log_every, help="steps between two rows of "
                            "metrics.jsonl and of the log (loss, learning rate, gradient norm, "
                            "tokens/s, MFU, peak memory)"),
        "--eval-every": dict(type=int, default=t.eval_every, help="steps between two "
                             "evaluations; 0 = only at the end"),
        "--eval-batches": dict(type=int, default=t.eval_batches, help="global batches of the "
                               "evaluation split scored at each evaluation; fixed for the run, "
                               "as the split is (a resume with another value is refused), so "
                               "that every eval_loss is on the same text"),
        "--save-every": dict(type=int, default=t.save_every, help="steps between two "
                             f"checkpoints (the newest {t.keep_checkpoints} are kept); 0 = "
                             "only at the end"),
        "--resume": dict(action="store_true", help="continue from the last checkpoint"),
        "--no-progress": dict(action="store_true", help="no progress bar; the rows of "
                              "--log-every are logged all the same (a run whose stderr is not "
                              "a terminal draws no bar either)"),
    }


def _number(x: float) -> str:
    """A rate as people write it: 5e-5, not Python's 5e-05 or 0.0005."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def add_flags(group: Any, job: Optional[Job], names: Sequence[str], **wording: str
              ) -> list[argparse.Action]:
    """Add `flag_specs(job, **wording)`'s `names` to `group` (without a job, `PLAIN_FLAGS`);
    their actions, for a script whose flag means a little more (a required --init-from)."""
    specs = flag_specs(job, **wording) if job is not None else PLAIN_FLAGS
    return [group.add_argument(name, **specs[name]) for name in names]


# ---- settings in flag names ------------------------------------------------------------------

SEQ_LEN_FLAG = {"seq_len": "--seq-len"}  # for BertConfig.check_fits, in_flag_names' second argument


def in_flag_names(make: Callable[[], T], flags: Mapping[str, str]) -> T:
    """`make()` (e.g. a TrainConfig), with a ValueError's fields said as their `flags`:
    "TrainConfig.batch_size=0 must be ..." becomes "--batch-size 0 must be ..."."""
    try:
        return make()
    except ValueError as e:
        message = str(e).replace("TrainConfig.", "").replace("BertConfig.", "")
        for field, flag in flags.items():
            # `field=value` -> `flag value`, and a bare `field` -> `flag`; never inside a
            # longer name (`lr` in `min_lr`) or a flag already written (`--lr`).
            message = re.sub(rf"(?<![\w-]){re.escape(field)}(=|\b)",
                             lambda m: flag + (" " if m.group(1) == "=" else ""), message)
        raise ValueError(message) from None


# The flags that shape a new model. From a checkpoint (--init-from), its config.json and its
# tokenizer decide what they would; --dropout and --attention change no weight, and may be
# given beside it.
SHAPING_FLAGS = ("--preset", "--vocab-size")


def refuse_shaping_flags(args: Any, more: Sequence[str] = (), built: str = "") -> None:
    """Refuse the flags of `SHAPING_FLAGS` and `more` that the command line gave beside
    --init-from: they would be ignored, and the run taken for the model they describe.
    `built`: what the checkpoint has instead, said as flags (`--norm post`)."""
    typed = [flag for flag in (*SHAPING_FLAGS, *more) if given(args, flag)]
    if not args.init_from or not typed:
        return
    said = [as_given(args, flag) for flag in typed]
    listed = ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]
    is_, it, them = ("is", "it", "it") if len(said) == 1 else ("are", "they", "them")
    raise ValueError(f"{listed} {is_} given beside --init-from {args.init_from}, whose "
                     f"config.json sets the model{f' (built with {built})' if built else ''} "
                     f"and whose tokenizer the vocabulary, so {it} would be ignored: leave "
                     f"{them} out (--dropout and --attention may be given with --init-from)")


def as_given(args: Any, flag: str) -> str:
    """`flag` with its value in `args`, as a command line gives it: `--preset mini`, `--no-bias`."""
    value = getattr(args, flag[2:].replace("-", "_"))
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {value}"


def model_source(args: Any) -> str:
    """The flag that chose the model, as given: `--init-from DIR` or `--preset NAME`."""
    return f"--init-from {args.init_from}" if args.init_from else f"--preset {args.preset}"


def check_init_weights(folder: Path, config: BertConfig) -> None:
    """--init-from's weights against the encoder its config.json builds, from safetensors'
    headers alone: a tensor missing, left over or of another shape is refused before the data
    is prepared and --out is touched, not when the model is loaded. The encoder is built on
    the meta device (shapes, no memory); a head the weights lack is each class's to start."""
    with torch.device("meta"):
        encoder = BertModel(config, add_pooler=False)
    check_weights(folder, encoder)


def check_masked_lm(folder: Path, flag: str) -> None:
    """Refuse a model folder whose weights hold no masked-LM head (an encoder's, a
    classifier's): loaded as a masked LM it would get a new, random head, and what that head
    scores is noise. From safetensors' headers alone, before anything is written."""
    config = config_from_hf(read_config(folder))
    with torch.device("meta"):
        model = BertForMaskedLM(config)
    missing = match_hf_state_dict(model, read_weights(folder, header_only=True), folder)[1]
    if missing:
        raise ValueError(f"{flag} {folder} has no masked-LM head ({listed(missing)} not in its "
                         f"weights): it is an encoder or another task's model; give a masked "
                         f"LM's folder, such as a pretraining run's final/")


def model_flag_names(model: str, flags: Mapping[str, str] = {}) -> dict[str, str]:
    """What a refused resume calls `model FIELD` (`state.SettingsMismatch`): its flag in
    `flags`, else the field of what the flag `model` chose (`num_layers of --preset`)."""
    return {f"model {f.name}": flags.get(f.name, f"{f.name} of {model}")
            for f in dataclasses.fields(BertConfig)}


def check_numbers(args: Any, rules: Sequence[tuple[str, Callable[[float], bool], str]]) -> None:
    """Refuse the first numeric flag outside its range, or infinite or NaN, in the flag's
    name. `rules`: (attribute, test, what is allowed); an unset flag (None) passes."""
    for name, ok, allowed in rules:
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ValueError(f"--{name.replace('_', '-')} {value} must be {allowed}")


def finite_flags(args: Any, names: Sequence[str]) -> None:
    """Refuse an infinite or NaN value of the float flags `names` (valid, but never meant)."""
    check_numbers(args, [(name, lambda v: True, "a finite number") for name in names])


# ---- start, end, exit status -----------------------------------------------------------------

class Script:
    """A script's life as one `with` block: signals stop it in one line, --out is held by
    its lock while the run writes, and the outcome is the exit status, kept in `status`.

        with cli.Script(args, flags) as script:
            ctx = script.start()           # devices, logging; --out not a file
            ...                            # check and read every input, writing nothing
            if not script.claim(runs):     # --out: a fresh start, or the run to resume
                return 0                   # a --resume of a finished run: nothing to do
            ...                            # train and write the outputs
        return script.status

    `flags` (TrainConfig field -> flag) names the settings a refused resume differs in."""

    def __init__(self, args: Any, flags: Mapping[str, str] = {}) -> None:
        self.args, self.flags = args, flags
        self.ctx: Optional[DistContext] = None
        self.status = 0
        self._signals = StopOnSignals()
        self._folder: Optional[RunFolder] = None  # --out, once claimed
        self._holding = False  # whether the block runs inside the folder's lock

    def __enter__(self) -> "Script":
        console.set_up()  # paths said as typed; a stdout that closes goes quiet
        self._signals.__enter__()
        return self

    def start(self) -> DistContext:
        """The devices and logging; a signal held back while torch loaded stops it here."""
        self._signals.let_through()
        # Before anything multiplies a bf16 matrix: oneDNN reads its bound once, at its first.
        memory.limit_kernel_cache()
        self.ctx = init_distributed(self.args.device)
        logging.basicConfig(level=logging.INFO if self.ctx.is_main else logging.WARNING,
                            format="%(message)s", stream=sys.stdout)
        out = Path(self.args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; give a folder for the run (its "
                             f"checkpoints, logs and final model)")
        return self.ctx

    def claim(self, runs: Sequence[Any], resume: Optional[bool] = None) -> bool:
        """Check --out and each run's checkpoint against its `resume.RunPlan`, then hold --out
        by its lock: True; False for a --resume of a finished run (nothing written).
        `resume`: the folder's rule, --resume's unless given; a script whose runs each live
        in a subfolder of --out (examples/glue.py) checks them itself and passes False."""
        args, ctx = self.args, self.ctx
        resume = args.resume if resume is None else resume
        self._folder = open_run(args.out, resume, main=ctx.is_main)
        self._folder.check()  # what --out holds (the rank that writes it)
        steps = [(check_resume(plan, ctx.device), plan.cfg.max_steps) for plan in runs]
        if resume and all_gather_objects(self._folder.finished(steps), ctx)[0]:
            if ctx.is_main:  # [0]: rank 0's word, which every rank follows
                # A budget's steps are the run's own: --max-steps beside it is refused.
                budgeted = any("--time-budget" in plan.data_identity for plan in runs)
                _said.info("--resume: the run in %s is complete, at step %d, where it stops, "
                           "with its outputs written; nothing is done and nothing is written%s",
                           args.out, steps[0][1], "" if budgeted else
                           " (a larger --max-steps trains it further)")
            return False
        self._folder.__enter__()
        self._holding = True
        return True

    def __exit__(self, exc_type: Any, error: Optional[BaseException], tb: Any) -> bool:
        ok = error is None
        try:
            if self._holding:  # a start that ends before it trained leaves --out as it was
                self._holding = False
                try:
                    self._folder.__exit__(exc_type, error, tb)
                except BaseException as e:
                    error, ok = e, False  # as a `with` would: the folder's own error
            if error is not None:
                self._signals.settle()  # the outcome is decided: a signal would cut it short
                ok = isinstance(error, Stopped)  # every rank stopped at the same step, saved
                raised = error  # the write's own error, which a could-not-write line reads
                self.status = exit_status(
                    name_outputs(error, script_outputs(self.args)), self._signals.received,
                    self.flags, lambda: _left(self.args.out, self._folder),
                    lambda e: _could_not_write(raised, self.args.out, self._folder))
        finally:
            self._signals.settle()
            if self.ctx is not None:
                cleanup(self.ctx, wait=ok)
            self._signals.__exit__(None, None, None)
        return True  # the exit status says it; exit_status raises a bug again


def script_outputs(args: Any) -> dict[str, Path]:
    """Where a script's run writes, by the flag that chose it: --out and the cache."""
    cache = getattr(args, "cache_dir", None)
    if cache:
        return {"--out": Path(args.out), "--cache-dir": Path(cache).expanduser()}
    return {"--out": Path(args.out), "the default --cache-dir": default_cache_dir()}


def name_outputs(error: BaseException, outputs: Mapping[str, Path]) -> BaseException:
    """`error`, a `WriteError` in one of `outputs` (flag -> path), led by that flag and path."""
    if isinstance(error, WriteError):
        for flag, path in outputs.items():
            if (named := error.as_output(flag, path)) is not None:
                return named
    return error


def one_output_status(error: BaseException, received: Optional[int], out: Path,
                      written: bool) -> int:
    """The exit status of a script that trains nothing and writes one output, --out
    (embed.py, blimp.py), after `error`: where no room was left for the output (a full disk,
    a quota, a file-size limit), status 3 and --out as it was; an --out that cannot be
    written (under a file, read-only) is bad input, status 2."""
    said = name_outputs(error, {"--out": out})  # a write error, in the flag's terms
    return exit_status(said, received, left=lambda: (
        f"; {out} is written" if written else f" before {out} was written"),
        unwritten=lambda e: (f"{said}; {out} is as it was"
                             if isinstance(said, WriteError) and said.errno in NO_ROOM
                             else None))


def exit_status(error: BaseException, received: Optional[int], flags: Mapping[str, str] = {},
                left: Callable[[], str] = lambda: "",
                unwritten: Callable[[BaseException], Optional[str]] = lambda e: None) -> int:
    """How a script that raised `error` ends: one line on stderr and its exit status. A
    signal (`received`) stops it whatever it surfaced as; a bug is raised again."""
    if isinstance(error, Stopped):
        _errors.warning("stopped by %s at step %d, its checkpoint saved: continue with the "
                        "same command plus --resume", signal.Signals(error.signal).name, error.step)
        return 128 + error.signal
    if received is not None or isinstance(error, (Interrupted, KeyboardInterrupt)):
        signum = received or getattr(error, "signal", signal.SIGINT)
        _errors.warning("stopped by %s%s", signal.Signals(signum).name, left())
        return 128 + signum
    line = unwritten(error)
    if line is not None:
        _errors.error("error: %s", line)
        return 3
    if isinstance(error, SettingsMismatch):
        return failed(ValueError(error.said(flags)))
    if isinstance(error, (TrainingError, *BAD_INPUT)):
        return failed(error)
    raise error


def _could_not_write(error: BaseException, out: Path, folder: Optional[RunFolder]
                     ) -> Optional[str]:
    """The line of a run that could not write into --out once it held it (else None): what
    stopped which write, its fix, the way on. (Python ignores SIGXFSZ: a limit is EFBIG.)"""
    if folder is None or folder.trained is None or not (
            could_not_write(error) or isinstance(error, WriteError)):
        return None
    target = error.target if isinstance(error, WriteError) else None
    what = getattr(error, "writing", None) or (str(target) if target else f"into {out}")
    if isinstance(error, WriteError) and error.error is not None:
        error = error.error  # its cause, said once here, with this line's way on alone
    on_disk = next(p for p in (out, *out.parents) if p.exists())  # whose free space it says
    return f"--out {out}: " + write_failure(_what_stopped(error), what, on_disk,
                                            _way_on(out, folder))


def _what_stopped(error: BaseException) -> BaseException:
    """The OSError with an errno in `error`'s chain, else the deepest (safetensors')."""
    for _ in range(8):  # the chain is short; the bound guards against a cycle
        if isinstance(error, OSError) and error.errno is not None:
            break
        deeper = error.__cause__ or error.__context__
        if deeper is None:
            break
        error = deeper
    return error


def _way_on(out: Path, folder: RunFolder) -> str:
    """What a run that could not write left in --out, and the way on that works from it."""
    if folder.resume_from is not None:
        return (f"run the same command with --resume: it goes on from {folder.resume_from}, "
                f"the newest intact checkpoint in {out}")
    nothing = f"there is no intact checkpoint in {out} to resume from"
    if folder.left:
        return (f"delete {', '.join(folder.left)} in {out}, then run the same command again: "
                f"{nothing}, and this start took back the rest of what it wrote")
    if folder.made:
        return (f"run the same command again: {nothing}, so this start removed the folder, "
                f"which it had made")
    return (f"run the same command again: {nothing}, so this start took back what it had "
            f"written there")


def _left(out: Path, folder: Optional[RunFolder]) -> str:
    """What a start stopped by a signal leaves in --out, said after "stopped by SIGINT"."""
    if folder is not None and not folder.main:  # rank 0 writes --out, and says what it left
        return ""
    if folder is None or folder.trained is None:  # stopped before --out was touched
        return f" before anything was written to {out}"
    if folder.trained:
        return (f"; the run's checkpoints in {out} are kept: continue with the same command "
                f"plus --resume")
    if folder.left:
        return f" before the first step; this start left {', '.join(folder.left)} in {out}"
    if folder.made:
        return f" before the first step; {out}, which this start made, is removed"
    return f" before the first step; {out} is as this start found it"


class _LiveHandler(logging.StreamHandler):
    """Writes to `sys.stderr` (or `sys.stdout`) as it is at each record (redirected, captured)."""

    def __init__(self, name: str = "stderr") -> None:
        self._which = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, value) -> None:  # logging sets it once; the property reads it live
        pass


# The scripts' one-line errors: on stderr whatever the logging setup, never on stdout.
_errors = logging.getLogger(__name__ + ".errors")
_errors.addHandler(_LiveHandler())
_errors.propagate = False
# A script's one line where its run has nothing to do: on stdout, whatever the logging setup.
_said = logging.getLogger(__name__ + ".said")
_said.addHandler(_LiveHandler("stdout"))
_said.setLevel(logging.INFO)
_said.propagate = False


def failed(error: Exception) -> int:
    """Say `error` in one line on stderr; exit status 1 for a TrainingError, 2 for bad input."""
    _errors.error("error: %s", " ".join(str(error).split()))
    return 1 if isinstance(error, TrainingError) else 2


def finished(result: Mapping[str, Any], ctx: DistContext, lr: float,
             model: Optional[nn.Module] = None, out: Optional[Path] = None,
             what: str = "the run") -> bool:
    """After `engine.train`: True on rank 0 of a run whose outputs may be written. Raises
    `Stopped` for a signal, and `TrainingError` (naming `lr`) where a final eval loss, the
    weights or the last training loss in `out`/metrics.jsonl is not finite."""
    if result["interrupted"]:  # Script says so, in one line on stderr
        raise Stopped(result["stop_signal"], result["steps"])
    bad = [f"the final {k} is {v}" for k, v in result.items()
           if (k == "eval_loss" or k.endswith("/eval_loss")) and isinstance(v, float)
           and not math.isfinite(v)]
    if model is not None and not all(bool(p.isfinite().all()) for p in model.parameters()):
        bad.append("the weights are not finite")
    if ctx.is_main and out is not None:
        loss = last_training_loss(Path(out) / "metrics.jsonl")
        if loss is not None and not math.isfinite(loss):
            bad.append(f"the last training step's loss is {loss}")
    bad = list(dict.fromkeys(b for rank in all_gather_objects(bad, ctx) for b in rank))
    if bad:
        raise TrainingError(
            f"{what} diverged after {result['steps']} steps ({result['skipped_steps']} skipped "
            f"as non-finite): {'; '.join(bad)}. No model is saved in final/ (the checkpoints "
            f"are kept). The usual cause is a learning rate too high for the model: lower "
            f"--lr (it was {lr:g}), or warm up longer")
    return ctx.is_main


def apply_keep_freed_memory(asked: Optional[bool], ctx: DistContext) -> None:
    """--keep-freed-memory (None: on a CPU), just before training (memory.keep_freed_memory)."""
    if asked is False or (asked is None and ctx.device.type != "cpu"):
        return
    if not memory.keep_freed_memory() and asked:
        log.warning("--keep-freed-memory has no effect here: it needs glibc's malloc")
