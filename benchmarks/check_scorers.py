"""The GLUE command's and the BLiMP scorer's numbers against independent computations of the
same metrics, on real data and real models (the tests use made-up sentences and tasks).

    python benchmarks/check_scorers.py glue OUT [OUT ...]
    python benchmarks/check_scorers.py blimp --model FOLDER --blimp-dir DIR [--pairs 20]

`glue`: every task run that `examples/glue.py --out OUT` scored, its `scores.json` against
its `predictions_SPLIT.tsv` scored again here: accuracy, F1 and the Matthews correlation
from the confusion counts, Pearson and Spearman with scipy (`scipy.stats`); then each
seed's GLUE score in `results.json` against the benchmark's rule applied here (a task's
metrics averaged, MNLI's matched and mismatched averaged, then the mean over the tasks).

`blimp`: for each sentence of --pairs pairs of each paradigm in --blimp-dir, minibert's
pseudo-log-likelihood (`minibert.tasks.blimp`, batched across sentences) against one
computed with transformers' own masked LM of the same folder, one masked copy per forward
(Salazar et al. 2020), in fp32; and whether each pair's verdict is the same.

Each prints the largest difference it found and exits 1 where one is above --tolerance.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np


def confusion_metrics(gold: list[str], pred: list[str], positive: str = "1") -> dict:
    """Accuracy, and for two classes F1 of `positive` and Matthews' correlation, from the
    confusion counts, in percent."""
    tp = sum(g == p == positive for g, p in zip(gold, pred))
    tn = sum(g != positive and p != positive for g, p in zip(gold, pred))
    fp = sum(g != positive and p == positive for g, p in zip(gold, pred))
    fn = sum(g == positive and p != positive for g, p in zip(gold, pred))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return {"accuracy": 100 * sum(g == p for g, p in zip(gold, pred)) / len(gold),
            "f1": 100 * 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
            "matthews": 100 * (tp * tn - fp * fn) / denominator if denominator else 0.0}


def correlations(gold: list[float], pred: list[float]) -> dict:
    """Pearson and Spearman by scipy, in percent; 0 for a constant side, where scipy says
    NaN (minibert's rule, which its docstring states)."""
    from scipy import stats

    if len(set(pred)) == 1 or len(set(gold)) == 1:
        return {"pearson": 0.0, "spearman": 0.0}
    return {"pearson": 100 * stats.pearsonr(gold, pred)[0],
            "spearman": 100 * stats.spearmanr(gold, pred)[0]}


def rescored(run: Path, task) -> dict:
    """A task run's metrics from its prediction files, named as scores.json names them."""
    found = {}
    for split in task.evals:
        with open(run / f"predictions_{split}.tsv", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        gold, pred = [r["label"] for r in rows], [r["prediction"] for r in rows]
        if task.labels is None:
            metrics = correlations([float(x) for x in gold], [float(x) for x in pred])
        else:
            metrics = confusion_metrics(gold, pred)
        prefix = f"{split}_" if len(task.evals) > 1 else ""
        found.update({prefix + m: metrics[m] for m in task.metrics})
    found["score"] = float(np.mean(list(found.values())))
    return found


def check_glue(args) -> float:
    from minibert.tasks.glue import GLUE_TASKS

    worst = 0.0
    for out in args.outs:
        results = json.loads((out / "results.json").read_text())
        task_scores: dict[str, list[float]] = {}
        for name, recorded in results["tasks"].items():
            diffs = []
            for i, seed in enumerate(results["seeds"]):
                mine = rescored(out / name / f"seed-{seed}", GLUE_TASKS[name])
                kept = json.loads((out / name / f"seed-{seed}" / "scores.json").read_text())
                diffs += [abs(mine[m] - kept[m]) for m in mine]
                task_scores.setdefault(name, []).append(mine["score"])
                assert kept == recorded["seeds"][i]
            print(f"{out.name} {name}: {len(results['seeds'])} seed(s), metrics "
                  f"{', '.join(m for m in mine if m != 'score')}: largest difference "
                  f"{max(diffs):.2e}")
            worst = max(worst, max(diffs))
        per_seed = [float(np.mean([s[i] for s in task_scores.values()]))
                    for i in range(len(results["seeds"]))]
        gap = max(abs(a - b) for a, b in zip(per_seed, results["glue"]["per_seed"]))
        print(f"{out.name} GLUE score per seed {[round(x, 3) for x in per_seed]}: largest "
              f"difference {gap:.2e}")
        worst = max(worst, gap)
    return worst


def transformers_pll(model, ids: list[int], mask_id: int) -> float:
    """Salazar et al.'s PLL, written plainly: each piece but [CLS] and [SEP] masked in turn,
    one forward each, the log-probability of the original piece summed."""
    import torch

    total = 0.0
    for i in range(1, len(ids) - 1):
        masked = torch.tensor([ids])
        masked[0, i] = mask_id
        with torch.no_grad():
            logits = model(input_ids=masked).logits[0, i].double()
        total += float(torch.log_softmax(logits, -1)[ids[i]])
    return total


def check_blimp(args) -> float:
    import transformers

    import minibert
    from minibert.tasks.blimp import read_blimp, sample_pairs, score_pairs

    model = minibert.BertForMaskedLM.from_pretrained(args.model).eval()
    tok = minibert.Tokenizer.from_pretrained(args.model)
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(args.model).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(args.model)
    scores = score_pairs(model, tok, sample_pairs(read_blimp(args.blimp_dir), args.pairs),
                         precision="fp32")
    worst, disagree = 0.0, 0
    for s in scores:
        plls = []
        for sentence in (s.pair.good, s.pair.bad):
            ids = their_tok(sentence)["input_ids"]
            assert ids == tok(sentence)["input_ids"], sentence  # the same pieces
            plls.append(transformers_pll(theirs, ids, their_tok.mask_token_id))
        worst = max(worst, abs(plls[0] - s.good), abs(plls[1] - s.bad))
        disagree += (plls[0] > plls[1]) != s.correct
    print(f"{args.model}: {len(scores)} pairs of {len({s.pair.paradigm for s in scores})} "
          f"paradigms, {2 * len(scores)} sentences: largest PLL difference {worst:.2e} "
          f"nats; verdicts that differ: {disagree}")
    return worst if not disagree else math.inf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("glue")
    g.add_argument("outs", type=Path, nargs="+", help="examples/glue.py --out folders")
    g.add_argument("--tolerance", type=float, default=1e-6, help="in points of percent")
    b = sub.add_parser("blimp")
    b.add_argument("--model", type=Path, required=True, help="a masked LM's folder that "
                   "both minibert and transformers load")
    b.add_argument("--blimp-dir", type=Path, required=True)
    b.add_argument("--pairs", type=int, default=20, help="pairs of each paradigm")
    b.add_argument("--tolerance", type=float, default=1e-4, help="in nats")
    args = p.parse_args()
    worst = check_glue(args) if args.what == "glue" else check_blimp(args)
    sys.exit(0 if worst <= args.tolerance else 1)


if __name__ == "__main__":
    main()
