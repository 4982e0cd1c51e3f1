"""Evaluation metrics for the fine-tuning tasks, each computed the way its benchmark does.

Numbers are only comparable with published ones if they are computed by the same rules, so
every function here follows a named reference, cited in its docstring:

* classification (GLUE-style): `accuracy`, `f1_scores` (macro, micro and per-class F1 as
  scikit-learn's `precision_recall_fscore_support(..., zero_division=0)`), and
  `classification_scores`, the accuracy / macro-F1 / per-class summary the fine-tuning
  example reports;
* sequence labelling (CoNLL-style NER): `spans` and `span_f1`, entity-level scores with
  seqeval's default (lenient, not `mode="strict"`) reading of the tags;
* extractive QA: `normalize_answer`, `exact_match`, `squad_f1` and `squad_scores`, with the
  answer normalisation and no-answer rule of the official SQuAD v2.0 evaluation script;
* what the fine-tuning scripts report, by name: `sequence_scores` and `token_scores`, and
  `numbers`, the part of a report that a log row holds.

Only numpy and the standard library are needed; scikit-learn and seqeval serve as references
in the tests, not as dependencies.
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

    For class k with TP true positives, FP false positives and FN false negatives, precision
    is TP / (TP + FP), recall TP / (TP + FN), and F1 their harmonic mean, 2TP / (2TP + FP + FN).
    A ratio whose denominator is 0 is 0 (scikit-learn's `zero_division=0`): a class never
    predicted has precision 0, a class never in the gold labels has recall 0, and a class
    absent from both has precision, recall and F1 all 0.

    * `macro_f1`: the plain mean of the per-class F1 over the labels 0..num_labels-1, the
      absent ones included as 0, i.e. scikit-learn's
      `f1_score(y_true, y_pred, labels=range(num_labels), average="macro", zero_division=0)`.
      It does not change with which classes an evaluation set happens to contain.
    * `macro_f1_observed`: the mean over the classes that occur in the gold labels or the
      predictions only, scikit-learn's `f1_score(..., average="macro", zero_division=0)`
      without `labels`. The two agree whenever every class occurs.
    * `micro_f1`: F1 of the TP, FP and FN summed over the classes. With one label per example
      every error is one FP and one FN, so it equals accuracy.

    Macro-F1 weighs a rare class as much as a common one, which accuracy hides.
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
    return {"accuracy": total_tp / len(y_true),
            "macro_f1": float(f1.mean()),
            "macro_f1_observed": float(f1[observed].mean()),
            "micro_f1": 2 * total_tp / (2 * total_tp + total_fp + total_fn),
            "per_class": [{"precision": float(precision[k]), "recall": float(recall[k]),
                           "f1": float(f1[k]), "support": int(support[k])}
                          for k in range(num_labels)]}


def classification_scores(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int) -> dict:
    """`{"accuracy", "f1", "per_class"}`: the summary the fine-tuning example reports.

    `f1` is `macro_f1_observed` of `f1_scores` (the mean over the classes that occur, as
    scikit-learn's `f1_score(average="macro")`), the number that example has always logged;
    `per_class` lists precision, recall, F1 and support for every class 0..num_labels-1.
    """
    s = f1_scores(y_true, y_pred, num_labels)
    return {"accuracy": s["accuracy"], "f1": s["macro_f1_observed"], "per_class": s["per_class"]}


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
    """The entities in one sentence's tags, as (type, first token, last token), inclusive.

    This reads tags as seqeval's `get_entities` does in its default mode, which CoNLL's
    conlleval also follows: an entity starts at B-X, and also at I-X when the previous tag
    is O or of another type (so IOB1 text, and a model's ill-formed IOB2 output, are read
    rather than rejected); it goes on over the I-X tags of the same type and ends before
    the next O, B- tag or change of type. For "IO", where every entity token is I-X, a run
    of I-X of one type is one entity, the same rule with no B- tags.

        spans(["B-PER", "I-PER", "O", "B-LOC"])  ->  [("PER", 0, 1), ("LOC", 3, 3)]

    A tag the scheme does not have (E-/S- of IOBES, B- under "IO", a prefix without a type)
    or an unknown scheme raises ValueError rather than being guessed at.
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
    """Entity-level precision, recall and F1, micro-averaged over the entities of all types.

    An entity counts as found only if a predicted entity has the same type and the same first
    and last token (`spans`); a partly right span is one false positive plus one false
    negative. Entities never cross sentences. This is seqeval's default
    `classification_report` / `f1_score` (micro average, default mode), the CoNLL-2003 NER
    score. With P = found / predicted entities and R = found / gold entities, F1 = 2PR/(P+R);
    a 0/0 ratio is 0 (seqeval's `zero_division=0`), so with no entities at all every score
    is 0.

    Returns `{"precision", "recall", "f1", "per_type"}`, where `per_type` maps each entity
    type (sorted, as seqeval lists them) to its own precision, recall, F1 and support (the
    number of gold entities of that type).
    """
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

    def prf(g: set, p: set) -> tuple[float, float, float]:
        found = len(g & p)
        return (found / max(len(p), 1), found / max(len(g), 1),
                2 * found / max(len(g) + len(p), 1))  # = 2PR/(P+R), 0 when found is 0

    per_type = {}
    for type_ in sorted({e[0] for e in gold_set | pred_set}):
        g = {e for e in gold_set if e[0] == type_}
        p = {e for e in pred_set if e[0] == type_}
        precision, recall, f1 = prf(g, p)
        per_type[type_] = {"precision": precision, "recall": recall, "f1": f1,
                           "support": len(g)}
    precision, recall, f1 = prf(gold_set, pred_set)
    return {"precision": precision, "recall": recall, "f1": f1, "per_type": per_type}


# ---- the fine-tuning reports ----------------------------------------------------------------

def sequence_scores(gold: Sequence[int], pred: Sequence[int], names: Sequence[str],
                    eval_loss: Optional[float] = None) -> dict:
    """A sequence-classification report: `accuracy`, macro `f1` (`classification_scores`),
    `eval_loss` as given, and `per_class`, each class's scores under its name. `gold` and
    `pred` are class ids into `names`."""
    s = classification_scores(gold, pred, len(names))
    return {"accuracy": s["accuracy"], "f1": s["f1"], "eval_loss": eval_loss,
            "per_class": dict(zip(names, s["per_class"]))}


def token_scores(gold: Sequence[Sequence[int]], pred: Sequence[Sequence[int]],
                 names: Sequence[str], scheme: str = "IOB2",
                 eval_loss: Optional[float] = None) -> dict:
    """A token-classification report: entity `f1`, `entity_precision` and `entity_recall`
    (`span_f1`, as seqeval), word `accuracy`, `eval_loss` as given, and `per_type`. `gold`
    and `pred` hold, per sentence, one tag id (into `names`) per word."""
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
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    The official SQuAD v1.1 and v2.0 evaluation scripts' `normalize_answer`, steps in their
    order. The order matters: punctuation goes first, so "a.b" becomes "ab" (no article left)
    and "the-end" becomes "theend".
    """
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
    """Bag-of-tokens F1 between two answers (the official script's `compute_f1`)."""
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
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0.

    Gold answers are read as in SQuAD v2.0 (`_gold_answers`): none, or only ones that
    normalise to "", make the question unanswerable, and then only a prediction that
    normalises to "" is right.
    """
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(a) == pred for a in _gold_answers(ground_truths)))


def squad_f1(prediction: str, ground_truths: Sequence[str]) -> float:
    """Token-level F1 of the prediction against its best-matching gold answer.

    Both answers are normalised (`normalize_answer`) and split on whitespace; with S the
    tokens they share (as multisets), P = S / prediction tokens, R = S / gold tokens and
    F1 = 2PR/(P+R). SQuAD v2.0's rule for no-answers: if the prediction or the gold answer is
    empty, F1 is 1 when both are and 0 otherwise. Gold answers are read as in `exact_match`.
    """
    return max(_token_f1(a, prediction) for a in _gold_answers(ground_truths))


def squad_scores(predictions: dict[str, str], answers: dict[str, Sequence[str]]) -> dict:
    """`{"exact_match", "f1"}` in percent, averaged over every question in `answers`.

    As the official script: each question scores the max over its gold answers, and the mean
    is multiplied by 100. A question with no prediction scores 0 and is logged, as in the v1.1
    script (the v2.0 script skips it, which would raise the average by leaving it out).
    Predictions for ids not in `answers` are ignored.
    """
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
