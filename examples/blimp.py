"""Score a masked LM zero-shot on BLiMP's minimal pairs, by pseudo-log-likelihood.

    python examples/blimp.py --model runs/mini/final --blimp-dir blimp/data --out runs/blimp
    python examples/blimp.py --model DIR --blimp-dir DIR --out OUT --max-pairs 100

--blimp-dir is BLiMP's data folder (github.com/alexwarstadt/blimp): one *.jsonl file per
paradigm. A pair is right when the model gives the acceptable sentence the higher
pseudo-log-likelihood (Salazar et al. 2020); the method, the sample and how the accuracies are
averaged: minibert/tasks/blimp.py and docs/quality.md. --model is any masked-LM folder minibert
loads with its tokenizer (a pretraining run's final/, a transformers BERT or ModernBERT
folder). --out is a folder; it gets results.json (the accuracies per paradigm, per field and
overall, the pairs whose two sentences tie, and the settings), results.md (the same as
tables) and scores.jsonl (each pair's two scores). Every input is read and checked first:
bad input ends with one line on stderr and exit status 2, before --out is touched
(minibert/cli/__init__.py).
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and hasattr(signal, "pthread_sigmask"):
    # Ctrl-C and SIGTERM wait while the imports below load torch (seconds); then the script
    # stops in one line (minibert.training.signals.StopOnSignals), where Python would print a
    # traceback.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import json
import logging
import sys

import minibert
from minibert import cli
from minibert.atomic import write_files_atomically
from minibert.interop.hf import MODEL_FOLDER
from minibert.interop.pretrained import check_tokenizer_fits
from minibert.machine.precision import PRECISIONS
from minibert.paths import check_readable
from minibert.tasks import blimp
from minibert.training.distributed import resolve_device
from minibert.training.signals import StopOnSignals

log = logging.getLogger("blimp")


def parse_args(argv=None):
    p = cli.ArgumentParser(__doc__.split("\n")[0])
    p.add_argument("--model", type=cli.path_flag, required=True, help="masked-LM folder with its "
                   "tokenizer")
    p.add_argument("--blimp-dir", type=cli.path_flag, required=True, help="folder of *.jsonl "
                   "files, one paradigm each")
    p.add_argument("--out", type=cli.path_flag, required=True, help="the folder to write the "
                   "results to")
    p.add_argument("--max-pairs", type=int, help="score at most this many pairs of each "
                   "paradigm, the same sample every run; default every pair")
    p.add_argument("--batch-size", type=int, default=blimp.DEFAULT_BATCH_SIZE,
                   help="masked copies of the sentences per forward")
    p.add_argument("--precision", choices=["auto", *PRECISIONS], default="fp32",
                   help="fp32 scores exactly; bf16 and fp16 run the forward under autocast")
    cli.add_flags(p, None, ["--device", "--allow-vocab-mismatch"])
    return p.parse_args(argv)


def load_model(args) -> tuple[minibert.BertForMaskedLM, minibert.Tokenizer]:
    """--model's masked LM and tokenizer, refused where the tokenizer is not the model's."""
    check_readable(args.model, "--model", MODEL_FOLDER)
    if not args.model.is_dir():
        raise ValueError(f"--model {args.model} is a file; give {MODEL_FOLDER}")
    cli.check_masked_lm(args.model, "--model")  # not a classifier's, given a random head
    # The folder's vocabulary is checked next, with the rest of the fit and in the flag's
    # terms, so the loader's own check (which names the argument) is waived.
    model = minibert.BertForMaskedLM.from_pretrained(args.model, allow_vocab_mismatch=True)
    tok = minibert.Tokenizer.from_pretrained(args.model)
    check_tokenizer_fits(model.config, tok, source=args.model,
                         allow_vocab_mismatch=args.allow_vocab_mismatch)
    return model, tok


def scores_jsonl(result: blimp.BlimpResult) -> str:
    """One line per pair: its paradigm, id, field, both sentences and their PLLs."""
    return "".join(json.dumps({"paradigm": s.pair.paradigm, "pair_id": s.pair.pair_id,
                               "field": s.pair.field, "sentence_good": s.pair.good,
                               "sentence_bad": s.pair.bad, "pll_good": s.good,
                               "pll_bad": s.bad, "correct": s.correct},
                              ensure_ascii=False) + "\n"
                   for s in result.scores)


def main(argv=None) -> int:
    # Ctrl-C: one line, exit status 130 (minibert/training/signals.py)
    with StopOnSignals() as signals:
        args = parse_args(argv)
        cli.console.set_up()  # paths said as typed; a stdout that closes goes quiet
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
        written = False
        try:
            signals.let_through()
            cli.check_numbers(args, [("max_pairs", lambda v: v >= 1, "at least 1"),
                                     ("batch_size", lambda v: v >= 1, "at least 1")])
            if args.out.exists() and not args.out.is_dir():
                raise ValueError(f"--out {args.out} is a file; give a folder for results.json, "
                                 f"results.md and scores.jsonl")
            # Read before the model: the cheaper check.
            check_readable(args.blimp_dir, "--blimp-dir")
            paradigms = blimp.read_blimp(args.blimp_dir)
            log.info("%d paradigms, %d pairs, from %s", len(paradigms),
                     sum(map(len, paradigms.values())), args.blimp_dir)
            model, tok = load_model(args)
            device = resolve_device(args.device)
            model.to(device)
            flags = {"batch_size": "--batch-size", "max_pairs": "--max-pairs"}
            result = cli.in_flag_names(lambda: blimp.evaluate_blimp(
                model, tok, paradigms, max_pairs=args.max_pairs, batch_size=args.batch_size,
                precision=args.precision), flags)
            summary = {"model": str(args.model), "blimp_dir": str(args.blimp_dir),
                       "max_pairs": args.max_pairs, "precision": args.precision,
                       **result.to_dict()}
            # results.json last: its arrival marks the folder complete.
            write_files_atomically(args.out, {
                "scores.jsonl": scores_jsonl(result), "results.md": result.to_markdown(),
                "results.json": json.dumps(summary, indent=2) + "\n"})
            written = True
            log.info("wrote %s: overall %.1f%% (%d paradigms, %d pairs)", args.out,
                     100 * result.overall, len(result.paradigms), len(result.scores))
        except BaseException as e:
            signals.settle()
            return cli.one_output_status(e, signals.received, args.out, written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
