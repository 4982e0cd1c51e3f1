"""Calling a Tokenizer as transformers' tokenizers are called: `tok(texts, padding=True,
truncation=True, max_length=..., return_tensors="pt")`, with windows that overflow, offsets
and words split beforehand, checked against transformers' tokenizer loaded from the same
folder and fed to the model as `model(**enc)`; and the rest of its surface by transformers'
names (tokenize, decode, the special tokens, save_pretrained, model_max_length)."""

from pathlib import Path

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
# Question answering's pairs: a short question, a context longer than a window.
QUESTIONS = ["who jumps?", "where?"]
CONTEXTS = ["The quick brown fox jumps over the lazy dog, and the dog sleeps.",
            "Ångström, São Paulo and façade"]
WORDS = [["The", "quick", "brown", "fox"], ["Hello", ",", "World", "!"],
         ["Café", "naïve", "antidisestablishmentarianism"]]

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
    # special tokens, attention mask and padding to a multiple
    ((TEXTS,), dict(add_special_tokens=False)),
    ((TEXTS, PAIRS), dict(add_special_tokens=False, padding=True, truncation=True, max_length=7)),
    ((TEXTS,), dict(padding=True, return_attention_mask=False, return_tensors="pt")),
    ((TEXTS,), dict(padding=True, pad_to_multiple_of=8, return_tensors="pt")),
    ((TEXTS,), dict(padding="max_length", max_length=10, pad_to_multiple_of=4)),  # 12; longer stay
    ((TEXTS,), dict(pad_to_multiple_of=8)),  # no padding asked for: none
    ((TEXTS, PAIRS), dict(padding=True, truncation=True, max_length=8, pad_to_multiple_of=4,
                          return_tensors="np")),
    # offsets
    (("Hello, World!",), dict(return_offsets_mapping=True)),
    ((TEXTS, PAIRS), dict(padding=True, return_offsets_mapping=True)),
    ((TEXTS,), dict(padding=True, return_offsets_mapping=True, return_tensors="pt")),
    # windows that overflow, `stride` tokens shared by neighbours
    ((TEXTS,), dict(truncation=True, max_length=6, stride=2, return_overflowing_tokens=True)),
    ((TEXTS[0],), dict(truncation=True, max_length=5, return_overflowing_tokens=True,
                       padding=True, return_tensors="pt")),
    ((QUESTIONS, CONTEXTS), dict(truncation="only_second", max_length=14, stride=3,
                                 return_overflowing_tokens=True, return_offsets_mapping=True,
                                 padding="max_length")),
    ((CONTEXTS, QUESTIONS), dict(truncation="only_first", max_length=12, stride=1,
                                 return_overflowing_tokens=True, padding=True,
                                 return_tensors="np")),
    ((TEXTS,), dict(return_overflowing_tokens=True)),  # nothing cut: a row per text
    ((TEXTS,), dict(truncation=True, max_length=6, stride=2)),  # no overflow: stride unused
    ((TEXTS,), dict(add_special_tokens=False, truncation=True, max_length=3, stride=1,
                    return_overflowing_tokens=True, return_offsets_mapping=True)),
    # words split beforehand
    ((WORDS[0],), dict(is_split_into_words=True)),
    ((WORDS,), dict(is_split_into_words=True, padding=True, return_offsets_mapping=True)),
    ((WORDS, WORDS[::-1]), dict(is_split_into_words=True, truncation=True, max_length=9)),
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
    """The same keys in the same order, equal values of the same types, each also an
    attribute, and each row's words and sequences."""
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
        assert getattr(ours, key) is a, (call, key)
    for row in range(len(theirs.encodings)):
        assert ours.word_ids(row) == theirs.word_ids(row), (call, row)
        assert ours.sequence_ids(row) == theirs.sequence_ids(row), (call, row)


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
    assert [len(r) for r in ours(TEXTS, padding="max_length", max_length=10,
                                 pad_to_multiple_of=4)["input_ids"]] == [max(n, 12) for n in full]
    # windows: several per context, each holding the question, neighbours sharing 3 tokens
    qa = ours(QUESTIONS, CONTEXTS, truncation="only_second", max_length=14, stride=3,
              return_overflowing_tokens=True)
    first, second = (qa["input_ids"][i] for i in (0, 1))
    assert qa["overflow_to_sample_mapping"].count(0) > 2
    assert first[:first.index(ours.sep_id) + 1] == second[:second.index(ours.sep_id) + 1]
    assert first[-4:-1] == second[len(ours("who jumps?")["input_ids"]):][:3]
    words = ours(WORDS[1], is_split_into_words=True)  # "Hello" is several pieces
    assert max(w for w in words.word_ids() if w is not None) == 3 and len(words.word_ids()) > 6
    enc = ours("Hello, World!", return_offsets_mapping=True)
    assert "".join("Hello, World!"[a:b] for a, b in enc.offset_mapping) == "Hello,World!"


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


def test_the_vocabulary_by_transformers_names(ours_and_theirs):
    ours, theirs = ours_and_theirs
    for text, pair in [("Hello, World!", None), ("a [MASK] here", "and Ångström"), ("", None)]:
        for special in (False, True):
            assert ours.tokenize(text, pair, add_special_tokens=special) == \
                theirs.tokenize(text, pair, add_special_tokens=special), (text, pair, special)
    ids = ours("a [MASK] in Café", "the pair")["input_ids"]
    for skip in (False, True):
        assert ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) == \
            theirs.convert_ids_to_tokens(ids, skip_special_tokens=skip)
    assert ours.convert_ids_to_tokens(ids[1]) == theirs.convert_ids_to_tokens(ids[1])
    tokens = ["[CLS]", "the", "not-a-token", "##s"]
    assert ours.convert_tokens_to_ids(tokens) == theirs.convert_tokens_to_ids(tokens)
    assert ours.convert_tokens_to_ids("[MASK]") == theirs.convert_tokens_to_ids("[MASK]")
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.vocab_size == theirs.vocab_size and len(ours) == len(theirs)
    for name in ("pad", "unk", "cls", "sep", "mask"):
        assert getattr(ours, f"{name}_token") == getattr(theirs, f"{name}_token"), name
        assert getattr(ours, f"{name}_token_id") == getattr(theirs, f"{name}_token_id"), name
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert ours.all_special_ids == theirs.all_special_ids
    assert ours.model_max_length == theirs.model_max_length  # none known: transformers' 1e30


def test_decode_keeps_the_special_tokens_as_transformers_does(ours_and_theirs):
    ours, theirs = ours_and_theirs
    enc = ours(TEXTS, PAIRS, padding=True, return_tensors="pt")
    rows = [row.tolist() for row in enc["input_ids"]]
    for skip in (False, True):
        assert [ours.decode(r, skip_special_tokens=skip) for r in rows] == \
            [theirs.decode(r, skip_special_tokens=skip) for r in rows], skip
        assert ours.batch_decode(enc["input_ids"], skip_special_tokens=skip) == \
            theirs.batch_decode(rows, skip_special_tokens=skip)
    assert ours.decode(rows[0]).startswith("[CLS] ")  # the default keeps them
    assert ours.decode(enc["input_ids"][4]) == theirs.decode(rows[4])  # a tensor row
    assert ours.decode(rows[0][1]) == theirs.decode(rows[0][1])  # one id
    assert ours.batch_decode(rows) == theirs.batch_decode(rows)


def test_save_pretrained_writes_a_folder_both_libraries_load(ours_and_theirs, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours, theirs = ours_and_theirs
    files = ours.save_pretrained(tmp_path / "tok")
    assert isinstance(files, tuple) and {Path(f).name for f in files} == \
        {"tokenizer.json", "tokenizer_config.json", "vocab.txt"}
    assert all(Path(f).parent == tmp_path / "tok" for f in files)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert again(TEXTS, PAIRS)["input_ids"] == theirs(TEXTS, PAIRS)["input_ids"]
    assert Tokenizer.from_pretrained(tmp_path / "tok").fingerprint == ours.fingerprint


def test_a_known_model_max_length_cuts_and_pads_as_transformers(ours_and_theirs, tmp_path):
    """A folder that records its model's length (a model's, saved with it) gives it to
    `truncation=True` and `padding="max_length"` without max_length, in both libraries,
    and a save keeps it."""
    transformers = pytest.importorskip("transformers")
    ours, _ = ours_and_theirs
    ours.save(tmp_path / "a", model_max_length=8)
    mine = Tokenizer.from_pretrained(tmp_path / "a")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "a")
    assert mine.model_max_length == theirs.model_max_length == 8
    for kwargs in (dict(truncation=True), dict(padding="max_length", truncation=True),
                   dict(padding="max_length", return_tensors="pt", truncation=True),
                   dict(truncation=True, return_overflowing_tokens=True, stride=2)):
        _same(mine(TEXTS, **kwargs), theirs(TEXTS, **kwargs), kwargs)
    mine.save_pretrained(tmp_path / "b")
    assert Tokenizer.from_pretrained(tmp_path / "b").model_max_length == 8
    mine.model_max_length = 16
    assert len(mine(TEXTS[4], truncation=True)["input_ids"]) == 16
    assert Tokenizer.from_pretrained(tmp_path / "a", model_max_length=6).model_max_length == 6
    with raises(ValueError, "model_max_length=0"):
        mine.model_max_length = 0


def test_a_batch_encoding_names_what_it_lacks(ours_and_theirs):
    ours, _ = ours_and_theirs
    enc = ours(TEXTS, padding=True)
    with raises(AttributeError, "offset_mapping", "input_ids", "return_offsets_mapping"):
        enc.offset_mapping
    with raises(IndexError, "batch_index=5", "5 rows"):
        enc.word_ids(5)
    moved = ours(TEXTS, padding=True, return_tensors="pt").to("cpu")
    assert moved.word_ids(1) == enc.word_ids(1) and moved.input_ids is moved["input_ids"]
    with raises(ValueError, "word_ids", "Tokenizer"):
        type(enc)(dict(enc)).word_ids(0)


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
    ((TEXTS,), dict(return_attention_mask=None), TypeError, ["return_attention_mask=None"]),
    ((TEXTS,), dict(add_special_tokens="no"), TypeError, ["add_special_tokens='no'"]),
    ((TEXTS,), dict(padding=True, pad_to_multiple_of=0), ValueError, ["pad_to_multiple_of=0"]),
    ((TEXTS,), dict(padding="max_length", truncation=True, max_length=10, pad_to_multiple_of=4),
     ValueError, ["max_length=10", "pad_to_multiple_of=4"]),
    ((TEXTS,), dict(truncation=True, max_length=6, stride=-1), ValueError, ["stride=-1"]),
    ((TEXTS,), dict(truncation=True, max_length=6, stride=4, return_overflowing_tokens=True),
     ValueError, ["stride=4", "max_length=6", "4 tokens"]),
    ((TEXTS,), dict(truncation=True, max_length=6, stride=4), ValueError, ["stride=4"]),
    ((QUESTIONS, CONTEXTS), dict(truncation="only_second", max_length=12, stride=6),
     ValueError, ["stride=6", "max_length=12", "the other text"]),
    ((TEXTS, PAIRS), dict(truncation=True, max_length=9, return_overflowing_tokens=True),
     ValueError, ["return_overflowing_tokens", "'longest_first'", "'only_second'"]),
    (("a text",), dict(is_split_into_words=True), TypeError,
     ["is_split_into_words=True", "list of words", "str"]),
    (([["a"], "b"],), dict(is_split_into_words=True), TypeError, ["text[1]", "list"]),
    ((WORDS, PAIRS), dict(is_split_into_words=True), TypeError,
     ["text_pair", "one text (a list of words)", "a list of 3 texts"]),
    ((WORDS, [["a"], "b", ["c"]]), dict(is_split_into_words=True), TypeError,
     ["text_pair[1]", "list of words", "str"]),
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
