"""Evaluation metrics for the fine-tuning tasks, each computed the way its benchmark does.

Scores compare with published ones only under the same rules, so each follows a named
reference: scikit-learn (classification, Matthews correlation), scipy (Pearson and
Spearman), seqeval's default mode (entity spans), the official SQuAD v2.0 script (QA). Only
numpy is needed; those are the tests' references.
"""

from __future__ import annotations

import collections
import logging
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

logger = logging.getLogger(__name__)

# ---- classification --------------------------------------------------------------------------

def _labels(y_true: Sequence[int], y_pred: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Both label sequences as integer arrays, after checking they pair up."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true and y_pred differ in length: {len(y_true)} != {len(y_pred)}")
    if len(y_true) == 0:
        raise ValueError("y_true and y_pred are empty; a score of no examples is undefined")
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    for name, y in (("y_true", y_true), ("y_pred", y_pred)):
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{name} must be a flat sequence of integer class ids, "
                             f"got dtype {y.dtype} and shape {y.shape}")
    return y_true, y_pred


def accuracy(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """The fraction of examples whose predicted class equals the gold class."""
    y_true, y_pred = _labels(y_true, y_pred)
    return float((y_true == y_pred).mean())


def f1_scores(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int) -> dict:
    """Accuracy, macro- and micro-F1, and per-class precision, recall, F1 and support.

    Per class: precision TP / (TP + FP), recall TP / (TP + FN), F1 2TP / (2TP + FP + FN), a
    ratio over 0 being 0, as scikit-learn's `zero_division=0`. `macro_f1` is the mean over
    labels 0..num_labels-1 (scikit-learn's `labels=range(num_labels), average="macro"`),
    `macro_f1_observed` over the classes that occur (without `labels`); `micro_f1` equals
    accuracy, each error being one FP and one FN. Macro-F1 weighs a rare class as a common one.
    """
    y_true, y_pred = _labels(y_true, y_pred)
    for name, y in (("y_true", y_true), ("y_pred", y_pred)):
        if y.min() < 0 or y.max() >= num_labels:
            raise ValueError(f"{name} holds class ids outside 0..num_labels-1 "
                             f"(num_labels={num_labels}): {sorted(set(y.tolist()))}")
    cm = np.zeros((num_labels, num_labels), dtype=np.int64)  # rows: gold, columns: predicted
    np.add.at(cm, (y_true, y_pred), 1)
    tp = np.diag(cm)
    support, predicted = cm.sum(1), cm.sum(0)  # TP + FN, TP + FP
    # max(., 1) turns 0/0 into 0/1 = 0, the zero_division=0 convention, without a warning.
    precision = tp / np.maximum(predicted, 1)
    recall = tp / np.maximum(support, 1)
    f1 = 2 * tp / np.maximum(support + predicted, 1)
    observed = (support + predicted) > 0
    total_tp = int(tp.sum())
    total_fp = total_fn = len(y_true) - total_tp  # each error: one FP and one FN
    return {"accuracy": total_tp / len(y_true), "macro_f1": float(f1.mean()),
            "macro_f1_observed": float(f1[observed].mean()),
            "micro_f1": 2 * total_tp / (2 * total_tp + total_fp + total_fn),
            "per_class": [{"precision": float(precision[k]), "recall": float(recall[k]),
                           "f1": float(f1[k]), "support": int(support[k])}
                          for k in range(num_labels)]}


def classification_scores(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int) -> dict:
    """`{"accuracy", "f1", "per_class"}`, `f1` being `f1_scores`' `macro_f1_observed` (as
    scikit-learn's `f1_score(average="macro")`), the number the fine-tuning example logs."""
    s = f1_scores(y_true, y_pred, num_labels)
    return {"accuracy": s["accuracy"], "f1": s["macro_f1_observed"], "per_class": s["per_class"]}


def binary_f1(y_true: Sequence[int], y_pred: Sequence[int], positive: int = 1) -> float:
    """F1 of the `positive` class alone, 2TP / (2TP + FP + FN), 0 when the class is neither
    gold nor predicted: scikit-learn's `f1_score(average="binary")`, the F1 GLUE reports for
    MRPC and QQP (a paraphrase being the positive class)."""
    y_true, y_pred = _labels(y_true, y_pred)
    tp = int(((y_true == positive) & (y_pred == positive)).sum())
    fp_fn = int(((y_true == positive) != (y_pred == positive)).sum())  # FP + FN
    return 2 * tp / max(2 * tp + fp_fn, 1)


def matthews_corrcoef(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """The Matthews correlation between gold and predicted classes, CoLA's metric: in [-1, 1],
    0 for a constant or chance prediction, however unbalanced the classes (accuracy is not).

    For two classes, (TP·TN - FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)). The form here is
    Gorodkin's (2004) for K classes, which reduces to it and is scikit-learn's
    `matthews_corrcoef`: with C the confusion matrix, t_k the gold and p_k the predicted count
    of class k, c the correct count and s the number of examples,
    MCC = (c·s - Σ t_k p_k) / sqrt((s² - Σ p_k²)(s² - Σ t_k²)); 0 where the denominator is 0.
    """
    y_true, y_pred = _labels(y_true, y_pred)
    classes = np.union1d(y_true, y_pred)
    t = (y_true[:, None] == classes).sum(0).astype(np.float64)  # (K,) gold count per class
    p = (y_pred[:, None] == classes).sum(0).astype(np.float64)  # (K,) predicted count
    c, s = float((y_true == y_pred).sum()), float(len(y_true))
    denominator = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / denominator) if denominator > 0 else 0.0


def _scores(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Both score sequences as float64 arrays, after checking they pair up and are finite."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"expected two flat sequences of the same length, got shapes "
                         f"{x.shape} and {y.shape}")
    if len(x) < 2:
        raise ValueError(f"a correlation needs at least 2 pairs, got {len(x)}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("the scores hold NaN or infinity; a correlation of them is undefined")
    return x, y


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r, cov(x, y) / (std(x) std(y)): how well a line through the points fits;
    STS-B's first metric. 0 where either side is constant (scipy returns NaN there)."""
    x, y = _scores(x, y)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx @ dx) * (dy @ dy))
    return float(np.clip(dx @ dy / denominator, -1.0, 1.0)) if denominator > 0 else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span (scipy's `rankdata`)."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Each run of equal values [start, end) gets the mean rank (start + 1 + end) / 2.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + 1 + ends) / 2, ends - starts)
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of the ranks (ties ranked by their mean), how well any
    increasing curve fits; STS-B's second metric."""
    x, y = _scores(x, y)
    return pearson(_ranks(x), _ranks(y))


# ---- entity spans for sequence labelling ------------------------------------------------------
# Tag prefixes each scheme allows, besides the bare "O". "BIO" is another name for IOB2.
SCHEMES: dict[str, tuple[str, ...]] = {"IOB2": ("B", "I"), "BIO": ("B", "I"), "IO": ("I",)}


def canonical_scheme(scheme: str) -> str:
    """One name per scheme: BIO is another name for IOB2 (a run's identity compares it)."""
    return "IOB2" if scheme == "BIO" else scheme


def _parse(tag: str, scheme: str) -> tuple[str, str]:
    """(prefix, type) of one tag: "B-PER" -> ("B", "PER"), "O" -> ("O", "")."""
    if tag == "O":
        return "O", ""
    prefix, _, type_ = tag.partition("-")
    if prefix not in SCHEMES[scheme] or not type_:
        allowed = ", ".join(f"{p}-TYPE" for p in SCHEMES[scheme])
        raise ValueError(f"tag {tag!r} is not valid in scheme {scheme!r}, whose tags are O "
                         f"and {allowed}; schemes: {', '.join(SCHEMES)}")
    return prefix, type_


def spans(tags: Sequence[str], scheme: str = "IOB2") -> list[tuple[str, int, int]]:
    """The entities in one sentence's tags, as (type, first token, last token), inclusive:
    `spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]`.

    As seqeval's default mode (and conlleval): an entity starts at B-X, or at I-X after O or
    another type (so IOB1 and ill-formed IOB2 are read), and goes on over I-X of its type. A
    tag the scheme does not have (E-/S- of IOBES, B- under "IO") raises ValueError.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tagging scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
    entities: list[tuple[str, int, int]] = []
    start, open_type = 0, None  # the entity being read, if any
    for i, tag in enumerate(tags):
        prefix, type_ = _parse(tag, scheme)
        continues = prefix == "I" and type_ == open_type
        if open_type is not None and not continues:
            entities.append((open_type, start, i - 1))
            open_type = None
        if prefix != "O" and not continues:
            start, open_type = i, type_
    if open_type is not None:
        entities.append((open_type, start, len(tags) - 1))
    return entities


def span_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
            scheme: str = "IOB2") -> dict:
    """Entity-level precision, recall and F1 micro-averaged over types (seqeval's default,
    the CoNLL-2003 score), and `per_type` (sorted), each with its support (gold count). An
    entity is found only with its exact type and span; P = found / predicted, R = found /
    gold, F1 = 2PR/(P+R), 0/0 being 0."""
    if len(gold) != len(pred):
        raise ValueError(f"gold and pred differ in number of sentences: "
                         f"{len(gold)} != {len(pred)}")
    gold_set: set[tuple[str, int, int, int]] = set()  # (type, sentence, first, last)
    pred_set: set[tuple[str, int, int, int]] = set()
    for n, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: gold has {len(g)} tags, pred has {len(p)}")
        gold_set.update((t, n, a, b) for t, a, b in spans(g, scheme))
        pred_set.update((t, n, a, b) for t, a, b in spans(p, scheme))

    def prf(g: set, p: set) -> dict[str, float]:
        found = len(g & p)
        return {"precision": found / max(len(p), 1), "recall": found / max(len(g), 1),
                "f1": 2 * found / max(len(g) + len(p), 1)}  # = 2PR/(P+R), 0 when found is 0

    per_type = {}
    for type_ in sorted({e[0] for e in gold_set | pred_set}):
        g = {e for e in gold_set if e[0] == type_}
        per_type[type_] = {**prf(g, {e for e in pred_set if e[0] == type_}), "support": len(g)}
    return {**prf(gold_set, pred_set), "per_type": per_type}


# ---- the fine-tuning reports ----------------------------------------------------------------

def sequence_scores(gold: Sequence[int], pred: Sequence[int], names: Sequence[str],
                    eval_loss: Optional[float] = None) -> dict:
    """`classification_scores` of class ids into `names`, per class by name, and `eval_loss`."""
    s = classification_scores(gold, pred, len(names))
    return {"accuracy": s["accuracy"], "f1": s["f1"], "eval_loss": eval_loss,
            "per_class": dict(zip(names, s["per_class"]))}


def token_scores(gold: Sequence[Sequence[int]], pred: Sequence[Sequence[int]],
                 names: Sequence[str], scheme: str = "IOB2",
                 eval_loss: Optional[float] = None) -> dict:
    """A token-classification report: `span_f1`'s scores, word `accuracy` and `eval_loss`
    as given. `gold` and `pred` hold, per sentence, one tag id (into `names`) per word."""
    s = span_f1([[names[i] for i in g] for g in gold], [[names[i] for i in p] for p in pred],
                scheme)
    # Not "precision": the training loop's result already holds the dtype under that key.
    return {"f1": s["f1"], "entity_precision": s["precision"], "entity_recall": s["recall"],
            "accuracy": accuracy([i for g in gold for i in g], [i for p in pred for i in p]),
            "eval_loss": eval_loss, "per_type": s["per_type"]}


def numbers(scores: Mapping[str, Any]) -> dict[str, float]:
    """The scores an evaluation logs: the floats, not the tables, predictions or counts."""
    return {k: v for k, v in scores.items() if isinstance(v, float)}


# ---- SQuAD exact match and F1 ----------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)  # ASCII only, as in the official script


def normalize_answer(s: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace:
    the official SQuAD scripts' `normalize_answer`, in their order ("the-end" -> "theend")."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _gold_answers(ground_truths: Sequence[str]) -> list[str]:
    """The gold answers as the v2.0 script scores them: those that normalise to nothing are
    dropped, and a question left without any is unanswerable, whose one answer is ""."""
    answers = [a for a in ground_truths if normalize_answer(a)]
    return answers or [""]


def _token_f1(gold: str, prediction: str) -> float:
    """Bag-of-tokens F1 between two answers (the official script's `compute_f1`):
    P = shared / prediction tokens, R = shared / gold tokens, F1 = 2PR/(P+R)."""
    gold_tokens, pred_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if not gold_tokens or not pred_tokens:
        # SQuAD v2.0's no-answer rule: an empty answer only matches an empty answer.
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    same = sum(common.values())  # shared tokens, counted with multiplicity
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, ground_truths: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0; with
    no gold answer (`_gold_answers`), only a prediction normalising to "" is right."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(a) == pred for a in _gold_answers(ground_truths)))


def squad_f1(prediction: str, ground_truths: Sequence[str]) -> float:
    """Token F1 (`_token_f1`) against the best gold answer, read as in `exact_match`."""
    return max(_token_f1(a, prediction) for a in _gold_answers(ground_truths))


def squad_scores(predictions: dict[str, str], answers: dict[str, Sequence[str]]) -> dict:
    """`{"exact_match", "f1"}` in percent, averaged over every question in `answers`, each
    its best over its gold answers. A question with no prediction scores 0 and is logged, as
    in the v1.1 script (v2.0 skips it, raising the average); other ids are ignored."""
    if not answers:
        raise ValueError("answers holds no questions to score")
    missing = [qid for qid in answers if qid not in predictions]
    if missing:
        logger.warning("%d of %d questions have no prediction and score 0: %s",
                       len(missing), len(answers), ", ".join(missing[:10]))
    em = f1 = 0.0
    for qid, golds in answers.items():
        if qid in predictions:
            em += exact_match(predictions[qid], golds)
            f1 += squad_f1(predictions[qid], golds)
    return {"exact_match": 100.0 * em / len(answers), "f1": 100.0 * f1 / len(answers)}
