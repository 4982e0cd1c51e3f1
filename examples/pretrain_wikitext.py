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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

import minibert
from minibert.checkpoint import CheckpointError, latest_checkpoint
from minibert.config import PRESETS
from minibert.data import (DownloadError, MLMCollator, PackedMLMDataset, TokenFile,
                           TokenFileError, download_wikitext, load_text_folder, load_wikitext,
                           tokenize_to_memmap)
from minibert.data.wikitext import WIKITEXT_VARIANTS
from minibert.distributed import barrier, cleanup, init_distributed
from minibert.engine import TrainConfig, TrainingError, train
from minibert.tokenizer import default_cache_dir

log = logging.getLogger("pretrain")


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
    d.add_argument("--dataset", default="wikitext-2-raw-v1", choices=sorted(WIKITEXT_VARIANTS))
    d.add_argument("--cache-dir", type=Path, help="default $MINIBERT_CACHE or ~/.cache/minibert")
    d.add_argument("--train-split", default="train")
    d.add_argument("--eval-split", default="valid")
    d.add_argument("--seq-len", type=int, default=128)
    d.add_argument("--mask-prob", type=float, default=0.15)
    return d


def add_training_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, default=32, help="global: sequences per step")
    t.add_argument("--micro-batch-size", type=int, help="per rank; default batch / world size")
    t.add_argument("--max-steps", type=int, default=1000)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--min-lr", type=float, default=1e-5)
    t.add_argument("--warmup-steps", type=int, help="default 10%% of --max-steps")
    t.add_argument("--schedule", choices=["linear", "cosine"], default="linear")
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--adam-eps", type=float, default=1e-6)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on a CUDA GPU that has it, fp32 on CPU")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--deterministic", action="store_true")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t.add_argument("--keep-freed-memory", action="store_true",
                   help="reuse freed memory instead of returning it to the kernel (glibc): "
                   "1.13x faster CPU training steps with a 30,522-word vocabulary, 1.01x with "
                   "the default 8,192; the resident set then never shrinks "
                   "(benchmarks/bench_process.py)")
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
    """(tokenizer, train set, eval set). Rank 0 prepares; the other ranks read its files."""
    if ctx.is_main:
        _prepare_files(args)
    barrier(ctx)
    tok = minibert.Tokenizer.from_pretrained(args.out / "tokenizer")
    sets = [PackedMLMDataset(TokenFile.open(_token_file(args, tok, s), tok), args.seq_len)
            for s in (args.train_split, args.eval_split)]
    return tok, sets[0], sets[1]


def _prepare_files(args) -> None:
    data_dir = args.data_dir or download_wikitext(args.dataset, cache_dir=args.cache_dir)
    splits = load_corpus(data_dir)
    for s in (args.train_split, args.eval_split):
        if s not in splits:
            raise FileNotFoundError(f"split {s!r} not found in {data_dir} (found: "
                                    f"{', '.join(sorted(splits))}); choose --train-split / "
                                    f"--eval-split among those")
    tok_dir = args.out / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():  # a resumed or repeated run keeps its vocabulary
        tok = minibert.Tokenizer.from_pretrained(tok_dir)
    elif args.init_from:
        tok = minibert.Tokenizer.from_pretrained(args.init_from)
    else:
        tok = minibert.Tokenizer.train_from_iterator(splits[args.train_split],
                                                     vocab_size=args.vocab_size,
                                                     cache_dir=args.cache_dir)
    tok.save(tok_dir)
    for s in (args.train_split, args.eval_split):
        path = _token_file(args, tok, s, splits[s])
        if not path.is_file():
            log.info("tokenizing the %s split into %s", s, path)
            tokenize_to_memmap(splits[s], tok, path)


def load_corpus(data_dir: Path) -> dict:
    """WikiText in either layout, or else any folder of .txt files (continued pretraining)."""
    try:
        return load_wikitext(data_dir)
    except FileNotFoundError:
        if not (Path(data_dir).is_dir() and any(Path(data_dir).glob("*.txt"))):
            raise
    return load_text_folder(data_dir)  # splits "train" and "valid" (every 20th document)


def _token_file(args, tok, split: str, texts=None) -> Path:
    """Token files are cached by tokenizer and text, so each corpus is tokenized once."""
    key_file = args.out / "tokenizer" / f"{split}.key"
    if texts is not None:
        h = hashlib.blake2b(digest_size=8)
        for t in texts:
            h.update(t.encode("utf-8", "surrogatepass"))
        key_file.write_text(h.hexdigest())
    cache = args.cache_dir or default_cache_dir()
    return Path(cache) / "tokens" / f"{tok.fingerprint[:16]}-{key_file.read_text()}.tok"


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
    if args.seq_len > model.config.max_position_embeddings:
        raise ValueError(f"--seq-len {args.seq_len} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}")
    if model.config.vocab_size < tok.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")
    return model


def check_args(args, world_size: int) -> None:
    """The mistakes worth one clear line, before any work is done."""
    if args.preset not in PRESETS:
        raise ValueError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    if args.seq_len < 3:
        raise ValueError("--seq-len must be at least 3 ([CLS], one token, [SEP])")
    per_rank, rest = divmod(args.batch_size, world_size)
    micro = args.micro_batch_size or per_rank
    if rest or per_rank == 0 or micro < 1 or per_rank % micro:
        raise ValueError(f"--micro-batch-size {micro} must divide the per-rank batch "
                         f"(--batch-size {args.batch_size} / {world_size} processes)")
    ckpts = args.out / "checkpoints"
    if args.resume and latest_checkpoint(ckpts) is None:
        raise FileNotFoundError(f"--resume: no intact checkpoint in {ckpts}")
    if not args.resume and ckpts.is_dir() and any(ckpts.iterdir()):
        raise FileExistsError(f"{args.out} already holds a run's checkpoints; pass --resume "
                              f"to continue it, or choose another --out")


def train_config(args) -> TrainConfig:
    return TrainConfig(
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_steps=args.max_steps, lr=args.lr, min_lr=args.min_lr,
        warmup=args.warmup_steps if args.warmup_steps is not None else 0.1,
        schedule=args.schedule, weight_decay=args.weight_decay, adam_eps=args.adam_eps,
        max_grad_norm=args.max_grad_norm, precision=args.precision, seed=args.seed,
        log_every=args.log_every, eval_every=args.eval_every, eval_batches=args.eval_batches,
        save_every=args.save_every, compile=args.compile, progress=not args.no_progress)


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
    print(f"error: {error}", file=sys.stderr)
    cleanup(ctx)
    return 1 if isinstance(error, TrainingError) else 2


def start_run(args):
    """Join the process group (under torchrun), set up logging, apply --keep-freed-memory."""
    ctx = init_distributed(args.device)
    logging.basicConfig(level=logging.INFO if ctx.is_main else logging.WARNING,
                        format="%(message)s", stream=sys.stdout)
    if args.keep_freed_memory and not minibert.runtime.keep_freed_memory():
        log.warning("--keep-freed-memory has no effect here: it needs glibc's malloc")
    return ctx


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = start_run(args)
    try:
        check_args(args, ctx.world_size)
        minibert.set_seed(args.seed, deterministic=args.deterministic)
        tok, train_set, eval_set = prepare_data(args, ctx)
        model = build_model(args, tok)
        n_params = sum(p.numel() for p in model.parameters())
        log.info("model: %s, %.1fM parameters; %d training blocks of %d tokens", args.preset
                 if not args.init_from else args.init_from, n_params / 1e6, len(train_set),
                 args.seq_len)
        collate = MLMCollator(tok, mlm_probability=args.mask_prob, seed=args.seed)
        result = train(model, train_set, collate, train_config(args), args.out, ctx=ctx,
                       eval_set=eval_set, resume=args.resume,
                       run_info={"args": {k: str(v) for k, v in vars(args).items()}})
    except RUN_ERRORS as e:
        return report_error(e, ctx)
    if ctx.is_main and result["interrupted"]:
        log.info("interrupted at step %d; continue with the same command plus --resume",
                 result["steps"])
    elif ctx.is_main:
        model.save_pretrained(args.out / "final")
        tok.save(args.out / "final")
        summary = {k: result[k] for k in ("eval_loss", "eval_accuracy", "perplexity", "steps",
                                          "tokens_seen", "wall_seconds")}
        (args.out / "eval.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot_loss(args.out)
        log.info("eval loss %.4f, accuracy %.4f, perplexity %.1f; model in %s",
                 result["eval_loss"], result["eval_accuracy"], result["perplexity"],
                 args.out / "final")
    cleanup(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
