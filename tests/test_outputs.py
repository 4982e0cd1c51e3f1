"""Outputs read as transformers' `ModelOutput` reads them, against transformers' own outputs on
the same weights: attribute, key and index over the fields that are set, `keys()`,
`to_tuple()` and `return_dict=False`, for every model class, classic BERT and ModernBERT."""

import dataclasses
import pickle

import pytest
import torch

import minibert
from conftest import tiny_config
from hf_models import FLAVOURS, same_weights

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TOL = 1e-5
CLASSES = [("BertModel", {}), ("BertForMaskedLM", {}),
           ("BertForSequenceClassification", {"num_labels": 3}),
           ("BertForTokenClassification", {"num_labels": 3}), ("BertForQuestionAnswering", {})]
PAIRS = [(name, flavour) for name, _ in CLASSES for flavour in FLAVOURS]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(class name, "classic" or "modern") -> minibert's and transformers' models, one set
    of random weights."""
    return {(name, flavour): same_weights(flavour, name,
                                          tmp_path_factory.mktemp(f"{name}-{flavour}"), **kw)
            for name, kw in CLASSES for flavour in FLAVOURS}


def _inputs(name, with_labels):
    """A batch without padding (padding positions are zero in minibert, computed in
    transformers), and the labels of `name`'s loss."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (2, 11), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if with_labels and name == "BertForMaskedLM":
        batch["labels"] = torch.where(torch.arange(11) % 3 == 0, ids, -100)
    elif with_labels and name == "BertForSequenceClassification":
        batch["labels"] = torch.tensor([0, 2])
    elif with_labels and name == "BertForTokenClassification":
        batch["labels"] = torch.randint(0, 3, (2, 11), generator=g)
    elif with_labels and name == "BertForQuestionAnswering":
        batch.update(start_positions=torch.tensor([1, 4]), end_positions=torch.tensor([3, 9]))
    return batch


def _assert_close(ours, theirs, where):
    if isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _assert_close(a, b, f"{where}[{i}]")
    else:
        assert ours.shape == theirs.shape, where
        assert (ours - theirs).abs().max().item() <= TOL, where


def _theirs_as_ours(name, batch, theirs):
    """transformers' values as minibert hands them out. With labels, minibert's masked-LM
    logits are the labelled rows only, (N, V), where transformers' are (B, T, V).
    transformers' BertModel, written for decoders too, adds `cross_attentions` last, an
    empty tuple in an encoder; minibert, an encoder alone, has no such field."""
    values = list(theirs)
    if name == "BertForMaskedLM" and "labels" in batch:
        values[1] = values[1][batch["labels"] != -100]
    if name == "BertModel" and isinstance(values[-1], tuple) and not values[-1]:
        values.pop()
    return tuple(values)


@pytest.mark.parametrize("name,flavour", PAIRS)
@pytest.mark.parametrize("with_labels", [False, True])
@pytest.mark.parametrize("extras", [False, True])
def test_outputs_read_as_transformers_outputs(models, name, flavour, with_labels, extras):
    if with_labels and name == "BertModel":
        pytest.skip("the encoder has no loss")
    ours_model, hf = models[name, flavour]
    batch = _inputs(name, with_labels)
    asked = {"output_hidden_states": extras, "output_attentions": extras}
    with torch.no_grad():
        ours, theirs = ours_model(**batch, **asked), hf(**batch, **asked)
        ours_tuple = ours_model(**batch, **asked, return_dict=False)
        theirs_tuple = hf(**batch, **asked, return_dict=False)
    # The keys are the fields that are set, in transformers' order: the loss only with
    # labels, hidden states and attentions only when asked for, no pooler in ModernBERT.
    assert list(ours.keys()) == [k for k in theirs.keys() if k != "cross_attentions"]
    assert isinstance(ours, dict) and ("loss" in ours) == with_labels
    for key in ours.keys():
        assert ours[key] is getattr(ours, key)
    # An integer or a slice indexes the fields that are set: out[0] is the logits (or the
    # last hidden state) without labels, the loss with them.
    assert ours[0] is ours.to_tuple()[0] is ours[list(ours.keys())[0]]
    assert ours[1:] == ours.to_tuple()[1:]
    want = _theirs_as_ours(name, batch, theirs.to_tuple())
    _assert_close(ours.to_tuple(), want, f"{name} {flavour}")
    # return_dict=False: transformers' tuple, the same values as the fields that are set.
    assert type(ours_tuple) is tuple and type(theirs_tuple) is tuple
    _assert_close(ours_tuple, _theirs_as_ours(name, batch, theirs_tuple), "return_dict=False")
    _assert_close(ours_tuple, ours.to_tuple(), "to_tuple")
    # A field that is not set reads None as an attribute, and is no key, as in transformers.
    if not with_labels and name != "BertModel":
        assert ours.loss is None and theirs.loss is None
        with pytest.raises(KeyError):
            ours["loss"]


def test_an_output_survives_pickling_and_replacing():
    """What the engine and torch do with outputs: pickle them (between processes) and
    `dataclasses.replace` a field (the engine's tests). torch.export traces through them
    (tests/test_traced.py)."""
    torch.manual_seed(0)
    model = minibert.BertForSequenceClassification(tiny_config(), num_labels=3).eval()
    ids = torch.randint(5, 99, (2, 7))
    out = model(ids, labels=torch.tensor([0, 1]))
    back = pickle.loads(pickle.dumps(out))
    assert list(back.keys()) == ["loss", "logits"] and torch.equal(back.logits, out.logits)
    halved = dataclasses.replace(out, loss=out.loss / 2)
    assert torch.equal(halved["loss"], out.loss / 2) and halved[1] is out.logits
