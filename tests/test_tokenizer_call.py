"""Calling a Tokenizer as transformers' tokenizers are called: `tok(texts, padding=True,
truncation=True, max_length=..., return_tensors="pt")`, checked against transformers'
tokenizer loaded from the same folder, and fed to the model as `model(**enc)`."""

import numpy as np
import pytest
import torch

import minibert
from conftest import tiny_config
from facts import raises
from minibert.data.tokenizer import Tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, résumé, façade — accents everywhere: Ångström, São Paulo.",
    "Punctuation!!! (parentheses) [brackets] and \"quotes\" ... ; : ?",
    "Internationalization and antidisestablishmentarianism are long words.",
] * 20
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, World!", "Café naïve",
         "", "a [MASK] in the middle of antidisestablishmentarianism"]
PAIRS = ["the lazy dog", "Ångström, São Paulo and the quick brown fox", "x",
         "long words are long words are long", "?"]

# (positional arguments, keyword arguments): the calls transformers users write.
CALLS = [
    (("Hello, World!",), {}),
    (("Hello, World!",), dict(return_tensors="pt")),
    (("Hello, World!",), dict(padding="max_length", max_length=10, return_tensors="np")),
    ((TEXTS,), {}),
    ((TEXTS,), dict(padding=True)),
    ((TEXTS,), dict(padding="longest", return_tensors="pt")),
    ((TEXTS,), dict(padding="max_length", max_length=24, return_tensors="np")),
    ((TEXTS,), dict(padding="max_length", max_length=8)),  # longer rows stay longer
    ((TEXTS,), dict(padding=True, truncation=True, max_length=6, return_tensors="pt")),
    ((TEXTS,), dict(truncation="longest_first", max_length=5)),
    ((TEXTS,), dict(truncation=False, max_length=5)),
    ((TEXTS,), dict(max_length=5)),  # truncation unset: max_length alone cuts
    ((TEXTS,), dict(padding=True, max_length=5)),  # ... but not beside padding
    ((TEXTS,), dict(padding="do_not_pad", truncation=True, max_length=7)),
    ((TEXTS,), dict(padding=True, return_token_type_ids=False, return_tensors="pt")),
    ((["same length", "same length"],), dict(return_tensors="pt")),  # nothing to pad
    ((("a tuple", "of texts"),), dict(padding=True)),
    (("a question?", "the context, longer than the question by far"), {}),
    (("a question?", "the context, longer than the question by far"),
     dict(truncation=True, max_length=8, return_tensors="pt")),
    ((TEXTS, PAIRS), dict(padding=True, truncation=True, max_length=9, return_tensors="pt")),
    ((TEXTS,), dict(text_pair=PAIRS, padding="max_length", truncation=True, max_length=12)),
    ((TEXTS, PAIRS), dict(padding=True, truncation="only_second", max_length=18)),
    ((TEXTS, PAIRS), dict(padding=True, truncation="only_first", max_length=14,
                          return_tensors="np")),
    ((TEXTS, PAIRS), dict(padding=True)),
]


@pytest.fixture(scope="module")
def ours_and_theirs(tmp_path_factory):
    """A small trained tokenizer, and transformers' AutoTokenizer reading the folder it saved."""
    transformers = pytest.importorskip("transformers")
    tok = Tokenizer.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                                        use_cache=False)
    folder = tok.save(tmp_path_factory.mktemp("tok"))
    return tok, transformers.AutoTokenizer.from_pretrained(folder)


def _same(ours, theirs, call):
    assert isinstance(ours, dict) and list(ours) == list(theirs.keys()), call
    for key in ours:
        a, b = ours[key], theirs[key]
        assert type(a) is type(b), (call, key)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), (call, key)
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), (call, key)
        else:
            assert a == b, (call, key)


@pytest.mark.parametrize("args, kwargs", CALLS, ids=[str(i) for i in range(len(CALLS))])
def test_a_call_equals_transformers(ours_and_theirs, args, kwargs):
    ours, theirs = ours_and_theirs
    _same(ours(*args, **kwargs), theirs(*args, **kwargs), (args, kwargs))


def test_the_calls_cover_what_they_claim(ours_and_theirs):
    """The cases do what their comments say: rows cut, rows padded, rows left longer."""
    ours, _ = ours_and_theirs
    full = [len(ids) for ids in ours(TEXTS)["input_ids"]]
    assert max(full) > 8 and min(full) == 2
    assert [len(r) for r in ours(TEXTS, max_length=5)["input_ids"]] == [min(n, 5) for n in full]
    assert [len(r) for r in ours(TEXTS, padding=True, max_length=5)["input_ids"]] == \
        [max(full)] * len(TEXTS)
    assert [len(r) for r in ours(TEXTS, padding="max_length", max_length=8)["input_ids"]] == \
        [max(n, 8) for n in full]
    pair = ours(TEXTS, PAIRS, padding=True)
    assert pair["token_type_ids"][1].count(1) > 1 and pair["input_ids"][3][-1] == ours.pad_id


def test_model_takes_the_call_by_name(ours_and_theirs):
    """`model(**tok(...))`, with segments and without (return_token_type_ids)."""
    ours, theirs = ours_and_theirs
    torch.manual_seed(0)
    classifier = minibert.BertForSequenceClassification(
        tiny_config(vocab_size=ours.vocab_size), num_labels=2).eval()
    enc = ours(TEXTS, PAIRS, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        logits = classifier(**enc).logits  # (B, 2)
        want = classifier(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).logits
        assert torch.equal(logits, want) and logits.shape == (len(TEXTS), 2)
        assert torch.equal(classifier(**theirs(TEXTS, PAIRS, padding=True, truncation=True,
                                               max_length=16, return_tensors="pt")).logits,
                           logits)
        modern = minibert.BertModel(minibert.BertConfig.preset(
            "modernbert-tiny", vocab_size=ours.vocab_size, max_position_embeddings=64)).eval()
        enc = ours(TEXTS, padding=True, return_tensors="pt",
                   return_token_type_ids=modern.config.has_segments)
        assert list(enc) == ["input_ids", "attention_mask"]
        assert modern(**enc).last_hidden_state.shape == (*enc["input_ids"].shape, 128)


def test_to_moves_the_tensors(ours_and_theirs):
    ours, _ = ours_and_theirs
    enc = ours(TEXTS, padding=True, return_tensors="pt")
    moved = enc.to("cpu")
    assert type(moved) is type(enc) and all(torch.equal(moved[k], enc[k]) for k in enc)
    with raises(TypeError, "return_tensors='pt'"):
        ours(TEXTS, padding=True).to("cpu")


@pytest.mark.parametrize("args, kwargs, error, facts", [
    ((TEXTS,), dict(padding="maximum"), ValueError, ["padding='maximum'", "'longest'",
                                                      "'max_length'", "'do_not_pad'"]),
    ((TEXTS,), dict(padding=1), ValueError, ["padding=1"]),
    ((TEXTS,), dict(truncation="longest", max_length=5), ValueError,
     ["truncation='longest'", "'longest_first'", "'only_second'"]),
    ((TEXTS,), dict(return_tensors="tf"), ValueError, ["return_tensors='tf'", "'pt'", "'np'"]),
    ((TEXTS,), dict(return_tensors="pt"), ValueError,
     ["return_tensors='pt'", "lengths", "padding=True"]),
    ((TEXTS,), dict(padding="max_length", max_length=8, return_tensors="np"), ValueError,
     ["return_tensors='np'", "truncation=True"]),
    ((TEXTS,), dict(truncation=True), ValueError, ["truncation=True", "max_length"]),
    ((TEXTS,), dict(padding="max_length"), ValueError, ["padding='max_length'", "max_length"]),
    ((TEXTS,), dict(padding=True, truncation=True, max_length=0), ValueError, ["max_length=0"]),
    ((TEXTS,), dict(truncation=True, max_length="8"), ValueError, ["max_length='8'"]),
    ((TEXTS,), dict(truncation=True, max_length=1), ValueError, ["max_length=1", "2"]),
    ((TEXTS, PAIRS), dict(truncation=True, max_length=2), ValueError, ["max_length=2", "3"]),
    ((TEXTS,), dict(truncation="only_second", max_length=5), ValueError,
     ["truncation='only_second'", "text_pair"]),
    ((3,), {}, TypeError, ["text", "str", "int"]),
    (([],), {}, ValueError, ["text", "empty"]),
    ((["a", 2],), {}, TypeError, ["text", "str", "int"]),
    (("a", ["b"]), {}, TypeError, ["text_pair", "str"]),
    ((["a"], "b"), {}, TypeError, ["text_pair", "list"]),
    ((["a", "c"], ["b"]), {}, ValueError, ["2 texts", "1 in text_pair"]),
    ((["a"], [None]), {}, TypeError, ["text_pair", "str", "NoneType"]),
    ((TEXTS,), dict(return_token_type_ids=None), TypeError, ["return_token_type_ids=None"]),
])
def test_a_bad_argument_is_refused_by_name(ours_and_theirs, args, kwargs, error, facts):
    ours, _ = ours_and_theirs
    with raises(error, *facts):
        ours(*args, **kwargs)


def test_a_max_length_that_does_nothing_is_said(ours_and_theirs, caplog):
    ours, _ = ours_and_theirs
    with caplog.at_level("WARNING", logger="minibert.data.tokenizer_call"):
        ours(TEXTS, padding=True, max_length=5)
        ours(TEXTS, truncation=True, max_length=5)
    assert len(caplog.records) == 1
    assert "max_length=5" in caplog.text and "truncation=True" in caplog.text
