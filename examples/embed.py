"""Embed the lines of a text file with a BERT encoder, and optionally search them.

    python examples/embed.py --model runs/mini/final --input texts.txt --out vectors.npy
    python examples/embed.py --model DIR --input texts.txt --out v.npy --normalize \\
        --query "a cat on a mat" --top-k 5

One text per line. Blank (or whitespace-only) lines are skipped and counted in the log, so
row i of the (N, H) float32 array in --out is the i-th non-blank line; --query prints the
file's own line numbers. --model is any folder minibert loads with its tokenizer (a
pretraining run's final/, a transformers BERT folder); pooling as in sentence-transformers
(see minibert/tasks/sentence.py); a tokenizer that is not the model's is refused
(`minibert.interop.pretrained.check_tokenizer_fits`). --out is replaced whole, through a temporary
file. Bad input ends with one line on stderr and exit status 2 (minibert/cli.py).
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import contextlib
import io
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch

from minibert import cli
from minibert.atomic import atomic_file
from minibert.training.signals import StopOnSignals
from minibert.data.text import iter_lines
from minibert.interop.hf import MODEL_FOLDER
from minibert.paths import check_readable
from minibert.interop.pretrained import check_tokenizer_fits
from minibert.tasks.sentence import POOLINGS, SentenceEncoder, nearest

log = logging.getLogger("embed")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    p.add_argument("--model", type=cli.path_flag, required=True,
                   help="model folder with its tokenizer")
    p.add_argument("--input", type=cli.path_flag, required=True,
                   help="UTF-8 text, one text per line")
    p.add_argument("--out", type=cli.path_flag, required=True, help="the .npy file to write")
    p.add_argument("--pooling", choices=POOLINGS, default="mean", help="how a text's token "
                   "vectors become one: their mean, the [CLS] vector, or their element-wise "
                   "maximum")
    p.add_argument("--normalize", action="store_true", help="L2-normalise every vector")
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass")
    p.add_argument("--max-length", type=int, help="tokens per text; default the model's limit")
    p.add_argument("--query", help="print the lines nearest to this text by cosine similarity")
    p.add_argument("--top-k", type=int, default=5, help="with --query: how many of the "
                   "nearest lines to print")
    cli.add_flags(p, None, ["--device", "--allow-vocab-mismatch"])
    return p.parse_args(argv)


def read_texts(path: Path) -> tuple[list[str], list[int]]:
    """The non-blank lines of `path` and their line numbers (from 1)."""
    check_readable(path, "--input")  # there to read, or said why not
    if path.is_dir():
        raise ValueError(f"--input {path} is a folder; give a text file, one text per line")
    texts, numbers, blank = [], [], 0
    for number, line in enumerate(iter_lines(path), start=1):
        if line.strip():
            texts.append(line)
            numbers.append(number)
        else:
            blank += 1
    if not texts:
        raise ValueError(f"{path} holds no text; expected one text per line")
    log.info("%d texts from %s%s", len(texts), path,
             f" ({blank} blank lines skipped)" if blank else "")
    return texts, numbers


def save_npy(path: Path, array: np.ndarray) -> None:
    """Write `path` whole or not at all (minibert.atomic, which says why where it cannot);
    folders made for it go again if it is not written."""
    made = [p for p in (path.parent, *path.parent.parents) if not os.path.lexists(p)]
    try:
        # Made in memory, then written in one call: numpy's own short write says only
        # "N requested and M written", where the file's write names what stopped it.
        buffer = io.BytesIO()
        np.save(buffer, array)
        with atomic_file(path) as f:
            f.write(buffer.getbuffer())
    except BaseException:
        for folder in made:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device here")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def main(argv=None) -> int:
    # Ctrl-C: one line, exit status 130 (minibert/training/signals.py)
    with StopOnSignals() as signals:
        args = parse_args(argv)
        cli.console.set_up()  # paths said as typed; a stdout that closes goes quiet
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
        written = False
        try:
            signals.let_through()
            if args.top_k < 1 or args.batch_size < 1:
                raise ValueError("--top-k and --batch-size must be at least 1")
            if args.query is not None and not args.query.strip():
                # An empty text encodes to [CLS] [SEP] alone: a ranking by nothing asked.
                raise ValueError(f"--query is empty ({args.query!r}); give the text to search "
                                 f"for, or leave --query out to only write the vectors")
            if args.out.is_dir():
                raise ValueError(f"--out {args.out} is a folder; give the .npy file to write")
            texts, numbers = read_texts(args.input)  # read before the model: the cheaper check
            check_readable(args.model, "--model", MODEL_FOLDER)
            # The folder's vocabulary is checked next, with the rest of the fit and in the
            # flag's terms, so the loader's own check (which names the argument) is waived.
            encoder = SentenceEncoder.from_pretrained(args.model, pooling=args.pooling,
                                                      normalize=args.normalize,
                                                      allow_vocab_mismatch=True)
            check_tokenizer_fits(encoder.model.config, encoder.tokenizer, source=args.model,
                                 allow_vocab_mismatch=args.allow_vocab_mismatch)
            encoder.to(device(args.device))
            # The model whose positions bound --max-length is the one --model gave.
            flags = {"max_length": "--max-length", "batch_size": "--batch-size",
                     "the model's": f"--model {args.model}'s"}
            vectors = cli.in_flag_names(lambda: encoder.encode(
                texts, batch_size=args.batch_size, max_length=args.max_length), flags)
            # The query too before --out is written: whatever refuses it, refuses it first.
            query = (None if args.query is None else
                     encoder.encode([args.query], max_length=args.max_length))
            save_npy(args.out, vectors.numpy())
            written = True
            log.info("wrote %s: %d x %d float32 (%s pooling%s)", args.out, *vectors.shape,
                     args.pooling, ", normalised" if args.normalize else "")
            if query is not None:
                scores, rows = nearest(query, vectors, args.top_k)
                print(f"nearest to {args.query!r}:")
                for score, row in zip(scores[0].tolist(), rows[0].tolist()):
                    print(f"{score:.4f}\tline {numbers[row]}\t{texts[row]}")
        except BaseException as e:
            signals.settle()
            return cli.one_output_status(e, signals.received, args.out, written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
