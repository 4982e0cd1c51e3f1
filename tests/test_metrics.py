"""Evaluation metrics against their references: scikit-learn for classification, seqeval for
entity-level span F1 (its documented examples, and seqeval itself on random tags when it is
installed), and hand-worked cases of the official SQuAD v2.0 evaluation script's rules."""

import logging
import random

import pytest

from facts import raises
from minibert.tasks.metrics import (accuracy, classification_scores, exact_match, f1_scores,
                              normalize_answer, span_f1, spans, squad_f1, squad_scores)

# ---- classification --------------------------------------------------------------------------

# Worked by hand. Confusion (truth -> prediction): 0->0, 0->1, 1->1, 1->1, 2->0; class 3 never
# occurs. Class 0: TP 1, FP 1, FN 1 -> P 1/2, R 1/2, F1 1/2. Class 1: TP 2, FP 1, FN 0 ->
# P 2/3, R 1, F1 4/5. Class 2: TP 0 -> all 0. Class 3: absent from both -> 0 by convention.
Y_TRUE, Y_PRED = [0, 0, 1, 1, 2], [0, 1, 1, 1, 0]


def test_accuracy():
    assert accuracy(Y_TRUE, Y_PRED) == pytest.approx(3 / 5)
    assert accuracy([1, 2], [1, 2]) == 1.0
    with pytest.raises(ValueError, match="length"):
        accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="empty"):
        accuracy([], [])


def test_f1_scores_by_hand():
    s = f1_scores(Y_TRUE, Y_PRED, num_labels=4)
    assert s["accuracy"] == pytest.approx(0.6)
    assert s["micro_f1"] == pytest.approx(0.6)  # single-label: micro-F1 is accuracy
    assert s["macro_f1"] == pytest.approx((0.5 + 0.8 + 0 + 0) / 4)  # over labels 0..3
    assert s["macro_f1_observed"] == pytest.approx((0.5 + 0.8 + 0) / 3)  # over labels seen
    per = s["per_class"]
    assert [c["precision"] for c in per] == pytest.approx([1 / 2, 2 / 3, 0, 0])
    assert [c["recall"] for c in per] == pytest.approx([1 / 2, 1, 0, 0])
    assert [c["f1"] for c in per] == pytest.approx([1 / 2, 4 / 5, 0, 0])
    assert [c["support"] for c in per] == [2, 2, 1, 0]


def test_classification_scores_keeps_the_finetune_shape_and_numbers():
    s = classification_scores(Y_TRUE, Y_PRED, 4)
    assert set(s) == {"accuracy", "f1", "per_class"}
    assert s["accuracy"] == pytest.approx(0.6)
    assert s["f1"] == pytest.approx(1.3 / 3)  # macro over the classes that occur
    assert len(s["per_class"]) == 4
    assert all(set(c) == {"precision", "recall", "f1", "support"} for c in s["per_class"])
    assert isinstance(s["per_class"][0]["support"], int)
    assert isinstance(s["f1"], float)


def test_f1_scores_rejects_labels_out_of_range():
    with pytest.raises(ValueError, match="num_labels"):
        f1_scores([0, 3], [0, 1], num_labels=3)
    with pytest.raises(ValueError, match="num_labels"):
        f1_scores([0, 1], [0, -1], num_labels=3)


def test_f1_scores_match_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for trial in range(200):
        k = rng.randint(2, 6)
        n = rng.randint(1, 30)
        # Draw from a random subset of the classes so that some are often absent.
        pool = rng.sample(range(k), rng.randint(1, k))
        y_true = [rng.choice(pool) for _ in range(n)]
        y_pred = [rng.choice(pool) if rng.random() < 0.8 else rng.randrange(k) for _ in range(n)]
        s = f1_scores(y_true, y_pred, k)
        labels = list(range(k))
        assert s["accuracy"] == pytest.approx(metrics.accuracy_score(y_true, y_pred))
        assert s["macro_f1"] == pytest.approx(metrics.f1_score(
            y_true, y_pred, labels=labels, average="macro", zero_division=0))
        assert s["macro_f1_observed"] == pytest.approx(metrics.f1_score(
            y_true, y_pred, average="macro", zero_division=0))
        assert s["micro_f1"] == pytest.approx(metrics.f1_score(
            y_true, y_pred, labels=labels, average="micro", zero_division=0))
        p, r, f, sup = metrics.precision_recall_fscore_support(
            y_true, y_pred, labels=labels, zero_division=0)
        per = s["per_class"]
        assert [c["precision"] for c in per] == pytest.approx(list(p))
        assert [c["recall"] for c in per] == pytest.approx(list(r))
        assert [c["f1"] for c in per] == pytest.approx(list(f))
        assert [c["support"] for c in per] == list(sup)


# ---- entity spans (seqeval's conventions) ----------------------------------------------------

def test_spans_seqeval_docstring_example():
    # seqeval.metrics.sequence_labeling.get_entities's docstring.
    assert spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]


def test_spans_lenient_starts():
    # An I- after O, or after another type, opens an entity (IOB1-style text is read too).
    assert spans(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == [
        ("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4)]
    assert spans(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
    assert spans(["O", "I-MISC", "B-MISC", "I-MISC"]) == [("MISC", 1, 1), ("MISC", 2, 3)]
    assert spans(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert spans(["B-ORG-X", "I-ORG-X"]) == [("ORG-X", 0, 1)]  # types may hold "-"
    assert spans([]) == []
    assert spans(["O", "O"]) == []
    assert spans(["B-PER", "I-PER"], scheme="BIO") == spans(["B-PER", "I-PER"], scheme="IOB2")


def test_spans_io():
    assert spans(["I-PER", "I-PER", "I-LOC", "O", "I-PER"], scheme="IO") == [
        ("PER", 0, 1), ("LOC", 2, 2), ("PER", 4, 4)]


@pytest.mark.parametrize("tags, scheme", [
    (["B-PER"], "IO"),         # B- has no place in IO
    (["E-PER"], "IOB2"),       # IOBES is not among the schemes
    (["S-PER"], "BIO"),
    (["X-PER"], "IOB2"),
    (["B"], "IOB2"),           # a prefix with no type
    (["B-"], "IOB2"),
    (["O-PER"], "IOB2"),
    (["PER"], "IO"),
])
def test_spans_rejects_unknown_tags(tags, scheme):
    with pytest.raises(ValueError) as err:
        spans(tags, scheme=scheme)
    assert repr(tags[0]) in str(err.value) and scheme in str(err.value)


def test_spans_rejects_unknown_scheme():
    with raises(ValueError, "'IOBES'", "IOB2", "BIO", "IO"):  # the name, and the schemes there are

        spans(["O"], scheme="IOBES")


def test_span_f1_seqeval_readme_example():
    y_true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    y_pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    s = span_f1(y_true, y_pred)
    assert (s["precision"], s["recall"], s["f1"]) == pytest.approx((0.5, 0.5, 0.5))
    assert s["per_type"]["MISC"] == pytest.approx(
        {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1})
    assert s["per_type"]["PER"] == pytest.approx(
        {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1})
    assert list(s["per_type"]) == ["MISC", "PER"]


def test_span_f1_entities_end_at_sentence_boundaries():
    # Same tags run together would make one PER entity; split into sentences they are two.
    s = span_f1([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["I-PER", "O"]])
    assert s["per_type"]["PER"]["support"] == 2 and s["f1"] == 1.0
    s = span_f1([["B-PER"], ["B-PER"]], [["B-PER"], ["O"]])
    assert (s["precision"], s["recall"]) == pytest.approx((1.0, 0.5))
    assert s["f1"] == pytest.approx(2 / 3)


def test_span_f1_without_entities_is_zero():
    assert span_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                        "per_type": {}}


def test_span_f1_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="sentence"):
        span_f1([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sentence 1"):
        span_f1([["O"], ["O", "O"]], [["O"], ["O"]])


def _random_tags(rng: random.Random, prefixes: str) -> list[str]:
    return [rng.choice(["O"] * 3 + [f"{p}-{t}" for p in prefixes for t in ("PER", "LOC")])
            for _ in range(rng.randint(0, 12))]


@pytest.mark.parametrize("scheme, prefixes", [("IOB2", "BI"), ("IO", "I")])
def test_span_f1_matches_seqeval_on_random_tags(scheme, prefixes):
    seqeval = pytest.importorskip("seqeval.metrics")
    from seqeval.metrics.sequence_labeling import get_entities
    rng = random.Random(1)
    for trial in range(300):
        n = rng.randint(1, 4)
        gold = [_random_tags(rng, prefixes) for _ in range(n)]
        pred = [[t if rng.random() < 0.7 else rng.choice(_random_tags(rng, prefixes) or ["O"])
                 for t in sent] for sent in gold]
        for sent in gold:
            assert spans(sent, scheme) == get_entities(sent)
        ours = span_f1(gold, pred, scheme)
        assert ours["precision"] == pytest.approx(
            seqeval.precision_score(gold, pred, zero_division=0))
        assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred, zero_division=0))
        assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred, zero_division=0))
        p, r, f, sup = seqeval.sequence_labeling.precision_recall_fscore_support(
            gold, pred, zero_division=0)
        assert list(ours["per_type"]) == sorted(ours["per_type"])  # seqeval's order
        per = ours["per_type"].values()
        assert [c["precision"] for c in per] == pytest.approx(list(p))
        assert [c["recall"] for c in per] == pytest.approx(list(r))
        assert [c["f1"] for c in per] == pytest.approx(list(f))
        assert [c["support"] for c in per] == list(sup)


# ---- SQuAD -----------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, normal", [
    ("The Cat's  hat!", "cats hat"),
    ("An apple, a day", "apple day"),
    ("  Denver\tBroncos\n", "denver broncos"),
    ("a.b", "ab"),            # punctuation goes before articles, so "a" is no longer a word
    ("the-end", "theend"),
    ("theatre", "theatre"),   # an article only as a whole word
    ("24–10", "24–10"),       # only ASCII punctuation (string.punctuation) is removed
    ("The", ""),
    ("", ""),
])
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


def test_exact_match():
    assert exact_match("Paris", ["the paris", "France"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert exact_match("the Broncos!", ["Denver Broncos", "broncos"]) == 1.0


def test_squad_f1_tokens():
    # pred tokens [cat, sat, on, mat], gold [cat, on, mat]: P 3/4, R 1.
    assert squad_f1("the cat sat on the mat", ["cat on mat"]) == pytest.approx(6 / 7)
    # Tokens count with multiplicity: common {x: 1, y: 1} -> P = R = 2/3.
    assert squad_f1("x x y", ["x y y"]) == pytest.approx(2 / 3)
    assert squad_f1("cat", ["dog"]) == 0.0
    # The best gold answer counts.
    assert squad_f1("Denver Broncos", ["Broncos", "Denver Broncos", "Carolina"]) == 1.0
    assert squad_f1("Denver", ["Broncos", "Denver Broncos"]) == pytest.approx(2 / 3)


def test_unanswerable_questions():
    # No gold answer: only an empty prediction is right, for EM and F1 alike.
    for golds in ([], [""], ["the"]):  # "the" normalises to nothing, so it is no answer
        assert exact_match("", golds) == 1.0 and squad_f1("", golds) == 1.0
        assert exact_match("a", golds) == 1.0 and squad_f1("a", golds) == 1.0
        assert exact_match("Paris", golds) == 0.0 and squad_f1("Paris", golds) == 0.0
    # An answerable question answered with nothing scores 0, even beside an empty gold.
    assert exact_match("", ["Paris"]) == 0.0 and squad_f1("", ["Paris"]) == 0.0
    assert exact_match("", ["the", "Paris"]) == 0.0 and squad_f1("", ["the", "Paris"]) == 0.0


def test_squad_scores(caplog):
    answers = {"q1": ["Denver Broncos", "The Broncos"], "q2": ["cat on mat"], "q3": [],
               "q4": ["Paris"]}
    predictions = {"q1": "broncos", "q2": "the cat sat on the mat", "q3": "", "q4": "Paris",
                   "extra": "ignored"}
    s = squad_scores(predictions, answers)
    assert s == pytest.approx({"exact_match": 100 * 3 / 4, "f1": 100 * (1 + 6 / 7 + 1 + 1) / 4})
    del predictions["q4"]
    with caplog.at_level(logging.WARNING, logger="minibert.tasks.metrics"):
        s = squad_scores(predictions, answers)
    assert "q4" in caplog.text
    assert s == pytest.approx({"exact_match": 100 * 2 / 4, "f1": 100 * (1 + 6 / 7 + 1) / 4})
    with pytest.raises(ValueError, match="no questions"):
        squad_scores({}, {})


# ---- the fine-tuning reports -------------------------------------------------------------------

def test_sequence_scores_name_each_class_and_carry_the_loss():
    from minibert.tasks.metrics import sequence_scores

    # By hand, on Y_TRUE / Y_PRED above: accuracy 3/5, F1 1/2 (a), 4/5 (b), 0 (c) over the
    # three classes that occur; "d" never occurs and is listed with support 0.
    s = sequence_scores(Y_TRUE, Y_PRED, ["a", "b", "c", "d"], eval_loss=0.25)
    assert s["accuracy"] == pytest.approx(0.6) and s["eval_loss"] == 0.25
    assert s["f1"] == pytest.approx((0.5 + 0.8 + 0) / 3)
    assert list(s["per_class"]) == ["a", "b", "c", "d"]
    assert s["per_class"]["b"] == pytest.approx({"precision": 2 / 3, "recall": 1.0, "f1": 0.8,
                                                 "support": 2})
    assert s["per_class"]["d"]["support"] == 0


def test_token_scores_count_entities_and_words_by_hand():
    from minibert.tasks.metrics import numbers, token_scores

    names = ["B-LOC", "B-PER", "I-PER", "O"]
    gold = [[1, 2, 3, 0], [3, 1]]  # PER(0-1) O LOC(3); O PER(1)
    pred = [[1, 3, 3, 0], [3, 1]]  # PER(0) O O LOC(3); O PER(1)
    s = token_scores(gold, pred, names, "IOB2", eval_loss=1.5)
    # Entities: gold {PER 0-1, LOC 3, PER s1}, predicted {PER 0-0, LOC 3, PER s1}: 2 found of
    # 3 each way. Words: 5 of 6 tags right.
    assert (s["entity_precision"], s["entity_recall"], s["f1"]) == pytest.approx((2 / 3,) * 3)
    assert s["accuracy"] == pytest.approx(5 / 6) and s["eval_loss"] == 1.5
    assert s["per_type"]["PER"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5,
                                                  "support": 2})
    assert s["per_type"]["LOC"]["f1"] == 1.0
    # What a log row holds: the floats, not the tables (nor a missing loss).
    assert numbers(s) == {k: s[k] for k in ("f1", "entity_precision", "entity_recall",
                                            "accuracy", "eval_loss")}
    assert "eval_loss" not in numbers(token_scores(gold, pred, names))
