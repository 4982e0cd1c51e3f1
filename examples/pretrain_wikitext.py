"""Pretrain BERT with masked-language modelling on WikiText: minibert's main job.

    python examples/pretrain_wikitext.py --out runs/mini            # downloads WikiText-2
    python examples/pretrain_wikitext.py --data-dir DIR --out runs/mini --precision bf16
    python examples/pretrain_wikitext.py --out runs/mini --resume   # continue a stopped run
    torchrun --nproc_per_node 2 examples/pretrain_wikitext.py --out runs/ddp

The path the data takes: text -> WordPiece tokenizer (trained once, cached) -> memory-mapped
token file (written once, cached) -> packed [CLS] ... [SEP] blocks -> dynamically masked
batches -> `minibert.engine.train`. Outputs in --out: metrics.jsonl, eval.json,
checkpoints/, final/ (loadable by transformers, with the tokenizer) and loss.png.
Bad input ends with one line on stderr and exit status 2; nothing already in --out is lost.
One run at a time uses an --out folder (a lock held for the run's life), a finished or
started run there is never overwritten without --resume, and --resume continues only the
same run: the data, tokenizer and settings are compared with the checkpoint's.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import minibert
from minibert.atomic import write_files_atomically
from minibert.checkpoint import CheckpointError
from minibert.config import PRESETS
from minibert.data import (DownloadError, MLMCollator, PackedMLMDataset, TokenFile,
                           TokenFileError, download_wikitext, load_corpus, tokenize_to_memmap)
from minibert.rundir import open_run
from minibert.data.wikitext import WIKITEXT_VARIANTS
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.hf import read_config, require_safetensors
from minibert.engine import TrainConfig, TrainingError, eval_batches, evaluate, train
from minibert.precision import resolve_precision
from minibert.tokenizer import default_cache_dir

log = logging.getLogger("pretrain")

# The tokenizer is trained on at most this many characters of the train split, a sample
# spread over all of it, as SentencePiece samples its input (`input_sentence_size`): the
# vocabulary has long converged by then, while training time grows with the text.
TOKENIZER_SAMPLE_CHARS = 100_000_000


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = add_data_args(p)
    d.add_argument("--vocab-size", type=int, default=8192)
    m = p.add_argument_group("model")
    m.add_argument("--preset", default="mini", help=f"one of {', '.join(PRESETS)}")
    m.add_argument("--norm", choices=["pre", "post"], help="default post (original BERT)")
    m.add_argument("--attention", choices=["sdpa", "math", "chunked"])
    m.add_argument("--dropout", type=float, help="hidden and attention dropout; default 0 from "
                   "scratch (as in Cramming and ModernBERT: in a short pretraining run there "
                   "is no overfitting to prevent, and dropout slows learning), the "
                   "checkpoint's own with --init-from")
    m.add_argument("--init-from", type=Path, help="continue pretraining a minibert or "
                   "transformers checkpoint (a folder with config.json, weights and tokenizer)")
    m.add_argument("--compile", action="store_true", help="torch.compile the model")
    add_training_args(p)
    add_run_args(p, default_out=Path("runs/pretrain"))
    return p.parse_args(argv)


# The flag groups below are shared with examples/distill.py, which reads the same data and
# trains with the same engine.

def add_data_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    d = p.add_argument_group("data")
    d.add_argument("--data-dir", type=Path, help="WikiText folder (raw or tokenized layout), "
                   "or any folder of .txt files (documents separated by blank lines; every "
                   "20th held out as the valid split); default: download --dataset")
    d.add_argument("--dataset", default="wikitext-2-raw-v1", choices=sorted(WIKITEXT_VARIANTS),
                   help="downloaded once into --cache-dir; $MINIBERT_WIKITEXT_URL names a mirror")
    d.add_argument("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    d.add_argument("--train-split", default="train")
    d.add_argument("--eval-split", default="valid")
    d.add_argument("--seq-len", type=int, default=128)
    d.add_argument("--mask-prob", type=float, default=0.3, help="share of tokens masked "
                   "for training; 30%% reaches a given loss in about 1.46x fewer steps than "
                   "BERT's 15%% here (benchmarks/RESULTS.md, Wettig et al. 2023)")
    d.add_argument("--eval-mask-prob", type=float, default=0.15, help="share masked for "
                   "evaluation; fixed apart from --mask-prob so that eval losses compare "
                   "across training rates")
    d.add_argument("--whole-word-mask", action="store_true", help="mask whole words (a piece "
                   "and the ## pieces after it) instead of single tokens")
    d.add_argument("--seq-len-warmup", type=int, help="sequence-length warmup: training "
                   "batches grow from --seq-len-start positions to --seq-len over this many "
                   "steps (Li et al. 2022); default 30%% of the schedule (--decay-steps, else "
                   "--max-steps), 0 = off. Together with 30%% masking, it reaches a given loss "
                   "sooner (benchmarks/RESULTS.md)")
    d.add_argument("--seq-len-start", type=int, help="positions per sequence at the first "
                   "step of the sequence-length warmup; default 32 (no warmup for a --seq-len "
                   "of 32 or less)")
    return d


def add_training_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, default=32, help="global: sequences per step")
    t.add_argument("--micro-batch-size", type=int, help="per rank; default batch / world size")
    t.add_argument("--max-steps", type=int, default=1000, help="where this run stops; may "
                   "change on --resume to stop earlier or go further")
    t.add_argument("--decay-steps", type=int, help="the learning-rate schedule's horizon, fixed "
                   "for the whole run; steps past it run at --min-lr (default: --max-steps of "
                   "the run's first start)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--min-lr", type=float, default=1e-5)
    t.add_argument("--warmup-steps", type=int, help="default 10%% of --decay-steps")
    t.add_argument("--schedule", choices=["linear", "cosine"], default="linear")
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--adam-eps", type=float, default=1e-6)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on a CUDA GPU that has it and on a CPU with native, "
                   "faster bf16 matmuls; fp32 elsewhere")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--deterministic", action="store_true")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction,
                   help="reuse freed memory instead of returning it to the kernel (glibc), "
                   "from the first training step: on by default on a CPU, where it made "
                   "the default job's steps 1.02 - 1.19x faster, as the host's page faults "
                   "were cheap or dear (its 30%% masking gives the sparse head blocks above "
                   "glibc's 32 MiB mmap ceiling), and a BERT-base step 1.13x; the resident "
                   "set then never shrinks (benchmarks/RESULTS.md)")
    return t


def add_run_args(p: argparse.ArgumentParser, default_out: Path) -> argparse._ArgumentGroup:
    r = p.add_argument_group("logging and checkpoints")
    r.add_argument("--out", type=Path, default=default_out)
    r.add_argument("--log-every", type=int, default=10)
    r.add_argument("--eval-every", type=int, default=0, help="0 = only at the end")
    r.add_argument("--eval-batches", type=int, default=20)
    r.add_argument("--save-every", type=int, default=100)
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    r.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return r


def prepare_data(args, ctx):
    """(tokenizer, train set, eval set, data identity). Rank 0 prepares; the other ranks
    read its files. The identity is what the engine compares on --resume."""
    if ctx.is_main:
        _prepare_files(args)
    barrier(ctx)
    tok = minibert.Tokenizer.from_pretrained(args.out / "tokenizer")
    splits = (args.train_split, args.eval_split)
    sets = [PackedMLMDataset(TokenFile.open(_token_file(args, tok, s), tok), args.seq_len)
            for s in splits]
    identity = {"corpus": {s: _corpus_key(args, s) for s in splits},
                "--train-split": args.train_split, "--eval-split": args.eval_split,
                "--seq-len": args.seq_len, "--mask-prob": args.mask_prob,
                "--whole-word-mask": args.whole_word_mask,
                "tokenizer": tok.fingerprint}
    # Checkpoints from before --eval-mask-prob existed evaluated at --mask-prob; leaving the
    # key out when the two agree keeps those resumable.
    if args.eval_mask_prob != args.mask_prob:
        identity["--eval-mask-prob"] = args.eval_mask_prob
    return tok, sets[0], sets[1], identity


def _prepare_files(args) -> None:
    data_dir = args.data_dir or download_wikitext(args.dataset, cache_dir=args.cache_dir)
    corpus = load_corpus(data_dir)  # refuses a folder whose text files it would not all read
    for line in corpus.report():
        log.info(line)
    splits = corpus.splits
    for s in (args.train_split, args.eval_split):
        if s not in splits:
            raise FileNotFoundError(f"split {s!r} not found in {data_dir} (found: "
                                    f"{', '.join(sorted(splits))}); choose --train-split / "
                                    f"--eval-split among those")
    tok = run_tokenizer(args, splits[args.train_split])
    for s in (args.train_split, args.eval_split):
        path = _token_file(args, tok, s, splits[s])
        if path.is_file():
            try:
                TokenFile.open(path, tok)
            except TokenFileError as e:  # a cache entry is only a copy: make it again
                log.warning("rebuilding the damaged cache file %s (%s)", path, e)
                path.unlink()
        if not path.is_file():
            log.info("tokenizing the %s split into %s", s, path)
            tokenize_to_memmap(splits[s], tok, path)
        tokens = TokenFile.open(path, tok)
        log.info("split %s: %d documents, %d tokens", s, tokens.n_docs, tokens.n_tokens)


def run_tokenizer(args, train_texts) -> minibert.Tokenizer:
    """The run's tokenizer, kept in --out/tokenizer: the one a resumed run was started with,
    else --init-from's, else a new one trained on the training split.

    A tokenizer left in --out by a start that failed before training is used only if it is
    the one this start would produce; otherwise the start is refused, so that a stale
    vocabulary never silently replaces --init-from's or a new --vocab-size.
    """
    tok_dir = args.out / "tokenizer"
    kept = tok_dir / "tokenizer.json"
    if args.resume and kept.is_file():  # compared with the checkpoint's by the engine
        return minibert.Tokenizer.from_pretrained(tok_dir)
    if args.init_from:
        tok, source = minibert.Tokenizer.from_pretrained(args.init_from), str(args.init_from)
    else:
        sample = train_texts.sample(TOKENIZER_SAMPLE_CHARS)
        if sample.k > 1:
            log.info("training the tokenizer on every %s document of %s (about %d MB of "
                     "%d): a vocabulary of %d needs no more text", _nth(sample.k),
                     args.train_split, TOKENIZER_SAMPLE_CHARS // 10**6,
                     train_texts.n_chars // 10**6, args.vocab_size)
        tok = minibert.Tokenizer.train_from_iterator(sample, vocab_size=args.vocab_size,
                                                     cache_dir=args.cache_dir)
        source = f"trained with --vocab-size {args.vocab_size}"
    if kept.is_file():
        old = minibert.Tokenizer.from_pretrained(tok_dir)
        if old.fingerprint != tok.fingerprint:
            raise FileExistsError(
                f"{tok_dir} holds a tokenizer (fingerprint {old.fingerprint[:16]}, "
                f"{old.vocab_size} tokens) that is not this run's ({tok.fingerprint[:16]}, "
                f"{tok.vocab_size} tokens, {source}); it was left by an earlier start: "
                f"delete {tok_dir} or choose another --out")
    else:
        tok.save(tok_dir)
    return tok


def _nth(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _token_file(args, tok, split: str, docs=None) -> Path:
    """Token files are cached by tokenizer and text, so each corpus is tokenized once."""
    if docs is not None:  # rank 0, preparing: the split's text fingerprint, for every rank
        (args.out / "tokenizer" / f"{split}.key").write_text(docs.fingerprint)
    cache = args.cache_dir or default_cache_dir()
    return Path(cache) / "tokens" / f"{tok.fingerprint[:16]}-{_corpus_key(args, split)}.tok"


def _corpus_key(args, split: str) -> str:
    return (args.out / "tokenizer" / f"{split}.key").read_text()


def build_model(args, tok) -> minibert.BertForMaskedLM:
    overrides = {}
    if args.attention:
        overrides["attention"] = args.attention
    dropout = 0.0 if args.dropout is None and not args.init_from else args.dropout
    if dropout is not None:
        overrides.update(hidden_dropout=dropout, attention_dropout=dropout)
    if args.init_from:
        model = minibert.BertForMaskedLM.from_pretrained(args.init_from, **overrides)
        if args.norm and args.norm != model.config.norm_position:
            raise ValueError(f"--norm {args.norm} contradicts {args.init_from}, a "
                             f"{model.config.norm_position}-LN checkpoint")
    else:
        model = minibert.BertForMaskedLM(minibert.BertConfig.preset(
            args.preset, vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
            norm_position=args.norm or "post", **overrides))
    model.config.check_fits(args.seq_len, tok.vocab_size)
    return model


# Every numeric flag, checked before any tokenizing or model building, in the flag's name.
NUMBER_RULES = [
    ("seq_len", lambda v: v >= 3, "at least 3 ([CLS], one token, [SEP])"),
    ("vocab_size", lambda v: v >= 16, "at least 16 (the special tokens and some words)"),
    ("seq_len_warmup", lambda v: v >= 0, "0 (off) or more"),
    ("seq_len_start", lambda v: v >= 8, "at least 8"),
    ("mask_prob", lambda v: 0 < v < 1, "between 0 and 1, e.g. 0.15"),
    ("eval_mask_prob", lambda v: 0 < v < 1, "between 0 and 1, e.g. 0.15"),
    ("batch_size", lambda v: v >= 1, "at least 1"),
    ("micro_batch_size", lambda v: v >= 1, "at least 1"),
    ("max_steps", lambda v: v >= 1, "at least 1"),
    ("decay_steps", lambda v: v >= 1, "at least 1"),
    ("warmup_steps", lambda v: v >= 0, "0 or more"),
    ("lr", lambda v: v > 0, "above 0"),
    ("min_lr", lambda v: v >= 0, "0 or more"),
    ("weight_decay", lambda v: v >= 0, "0 or more"),
    ("adam_eps", lambda v: v > 0, "above 0, e.g. 1e-6"),
    ("max_grad_norm", lambda v: v > 0, "above 0 (0 would train nothing, a negative value "
     "would climb the loss)"),
    ("dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("seed", lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
    ("log_every", lambda v: v >= 1, "at least 1"),
    ("eval_every", lambda v: v >= 0, "0 (only at the end) or more"),
    ("eval_batches", lambda v: v >= 1, "at least 1"),
    ("save_every", lambda v: v >= 0, "0 (only at the end) or more"),
]


def check_numbers(args, rules) -> None:
    """Refuse the first numeric flag outside its range, in the flag's own name."""
    for name, ok, allowed in rules:
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ValueError(f"--{name.replace('_', '-')} {value} must be {allowed}")


def check_args(args, world_size: int) -> None:
    """The mistakes worth one clear line, before any work is done."""
    if args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    check_numbers(args, NUMBER_RULES)
    require_safetensors()  # the model is saved at the end: said now, not after training
    if args.min_lr > args.lr:
        raise ValueError(f"--lr {args.lr} is below --min-lr {args.min_lr}, the rate the "
                         f"schedule decays to; lower --min-lr as well")
    per_rank, rest = divmod(args.batch_size, world_size)
    micro = args.micro_batch_size or per_rank
    if rest or per_rank == 0 or per_rank % micro:
        raise ValueError(f"--batch-size {args.batch_size} must split into {world_size} "
                         f"process(es) x whole micro-batches of --micro-batch-size {micro}")
    if getattr(args, "init_from", None):
        read_config(args.init_from)  # a missing folder, or a training checkpoint, said at once
    horizon = args.decay_steps or args.max_steps
    for flag in ("warmup_steps", "seq_len_warmup"):
        steps = getattr(args, flag)
        if steps is not None and steps > horizon and not args.resume:
            raise ValueError(f"--{flag.replace('_', '-')} {steps} is longer than the schedule "
                             f"({horizon} steps, --decay-steps or else --max-steps)")
    if args.seq_len_warmup != 0 and (args.seq_len_start or 0) > args.seq_len:
        raise ValueError(f"--seq-len-start {args.seq_len_start} is longer than --seq-len "
                         f"{args.seq_len}: the warmup would never shorten a batch; lower it, "
                         f"or turn the warmup off with --seq-len-warmup 0")


def train_config(args) -> TrainConfig:
    return TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=args.max_steps, decay_steps=args.decay_steps, lr=args.lr, min_lr=args.min_lr,
        warmup=args.warmup_steps if args.warmup_steps is not None else 0.1,
        schedule=args.schedule, weight_decay=args.weight_decay, adam_eps=args.adam_eps,
        max_grad_norm=args.max_grad_norm, precision=args.precision, seed=args.seed,
        log_every=args.log_every, eval_every=args.eval_every, eval_batches=args.eval_batches,
        save_every=args.save_every, compile=args.compile, progress=not args.no_progress,
        seq_len_warmup=args.seq_len_warmup if args.seq_len_warmup is not None else 0.3,
        seq_len_start=args.seq_len_start or 32)


def write_json(path: Path, obj) -> None:
    """Through a temporary file and a rename: a crash keeps the previous file whole."""
    write_files_atomically(path.parent, {path.name: json.dumps(obj, indent=2) + "\n"})


def plot_loss(out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    train_rows = [r for r in rows if "loss" in r]
    eval_rows = [r for r in rows if "eval_loss" in r]
    plt.figure(figsize=(6, 4))
    plt.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], label="train")
    if eval_rows:
        plt.plot([r["step"] for r in eval_rows], [r["eval_loss"] for r in eval_rows], "o-",
                 label="eval")
    plt.xlabel("step")
    plt.ylabel("MLM loss")
    plt.legend()
    plt.tight_layout()
    plt.savefig(out / "loss.png", dpi=110)
    plt.close()


# What a run can fail with and how it ends: one line on stderr, no traceback. Bad input
# (a flag, a folder, a damaged checkpoint, a missing package) exits with status 2; a run that
# started and could not go on (TrainingError) with status 1.
RUN_ERRORS = (ValueError, OSError, DownloadError, TokenFileError, CheckpointError, ImportError,
              TrainingError)


def report_error(error: Exception, ctx) -> int:
    """Print `error` as one line, leave the process group, return the exit status."""
    print("error: " + " ".join(str(error).split()), file=sys.stderr)
    if ctx is not None:
        cleanup(ctx)
    return 1 if isinstance(error, TrainingError) else 2


def start_run(args):
    """Join the process group (under torchrun) and set up logging."""
    ctx = init_distributed(args.device)
    logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING,
                        format="%(message)s", stream=sys.stdout)
    return ctx


def apply_keep_freed_memory(args, ctx) -> None:
    """--keep-freed-memory, on by default when training on a CPU. Made just before training,
    so that preparing the data, which frees large blocks once rather than every step, still
    hands its memory back."""
    asked = args.keep_freed_memory
    if asked is False or (asked is None and ctx.device.type != "cpu"):
        return
    if not minibert.memory.keep_freed_memory() and asked:
        log.warning("--keep-freed-memory has no effect here: it needs glibc's malloc")


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = None
    try:
        ctx = start_run(args)
        check_args(args, ctx.world_size)
        with open_run(args.out, args.resume, main=ctx.is_main):
            run(args, ctx)
    except RUN_ERRORS as e:
        return report_error(e, ctx)
    cleanup(ctx, wait=True)
    return 0


def run(args, ctx) -> None:
    minibert.set_seed(args.seed, deterministic=args.deterministic)
    tok, train_set, eval_set, identity = prepare_data(args, ctx)
    model = build_model(args, tok)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s, %.1fM parameters; %d training blocks of %d tokens", args.preset
             if not args.init_from else args.init_from, n_params / 1e6, len(train_set),
             args.seq_len)
    collate = MLMCollator(tok, mlm_probability=args.mask_prob, seed=args.seed,
                          whole_word_mask=args.whole_word_mask)
    # Evaluation always masks single tokens at --eval-mask-prob, so that eval losses compare
    # across runs with and without --whole-word-mask (predicting a whole word is the harder
    # task) and across training masking rates (a 40% rate leaves less context per
    # prediction, so its own loss is higher at equal quality; Wettig et al. 2023).
    eval_collate = MLMCollator(tok, mlm_probability=args.eval_mask_prob, seed=args.seed)
    cfg, precision = train_config(args), resolve_precision(args.precision, ctx.device)

    def mlm_metrics(m) -> dict:
        return evaluate(m, eval_batches(eval_set, eval_collate, cfg, ctx), precision,
                        ctx.device, ctx)

    apply_keep_freed_memory(args, ctx)
    result = train(model, train_set, collate, cfg, args.out, ctx=ctx, eval_fn=mlm_metrics,
                   resume=args.resume, data_identity=identity)
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        model.save_pretrained(args.out / "final", tokenizer=tok)
        summary = {k: result[k] for k in ("eval_loss", "eval_accuracy", "perplexity", "steps",
                                          "tokens_seen", "wall_seconds", "train_seconds",
                                          "precision")}
        write_json(args.out / "eval.json", summary)
        plot_loss(args.out)
        log.info("eval loss %.4f, accuracy %.4f, perplexity %.1f; model in %s",
                 result["eval_loss"], result["eval_accuracy"], result["perplexity"],
                 args.out / "final")


if __name__ == "__main__":
    sys.exit(main())
