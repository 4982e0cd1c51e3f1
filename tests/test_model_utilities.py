"""transformers' model methods on minibert's classes, each against transformers' method of the
same name on the same weights, classic BERT and ModernBERT: device and dtype, parameter
counts, the embeddings and their resizing, gradient checkpointing's switch, and
`from_pretrained(dtype=...)` by name and "auto"."""

import json

import pytest
import torch

import minibert
from hf_models import FLAVOURS, same_weights

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TOL = 1e-5
CLASSES = [("BertModel", {}), ("BertForMaskedLM", {}),
           ("BertForSequenceClassification", {"num_labels": 3})]
NO_DROPOUT = {"classic": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
              "modern": {}}  # ModernBERT's dropouts are 0 by default


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(class name, flavour) -> a function giving a fresh pair (minibert, transformers) with
    the same random weights, and the folder they came from."""
    folders = {}
    for name, kwargs in CLASSES:
        for flavour in FLAVOURS:
            folder = tmp_path_factory.mktemp(f"{name}-{flavour}")
            same_weights(flavour, name, folder, **kwargs, **NO_DROPOUT[flavour])
            folders[name, flavour] = folder

    def fresh(name, flavour):
        folder = folders[name, flavour]
        theirs = getattr(transformers, _theirs(name, flavour)).from_pretrained(folder)
        return getattr(minibert, name).from_pretrained(folder), theirs.eval(), folder
    return fresh


def _theirs(name, flavour):
    return name if flavour == "classic" else "ModernBert" + name.removeprefix("Bert")


def _batch(vocab=99):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (2, 9), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _close(a, b, tol=TOL):
    return a.shape == b.shape and (a.float() - b.float()).abs().max().item() <= tol


PAIRS = [(name, flavour) for name, _ in CLASSES for flavour in FLAVOURS]


@pytest.mark.parametrize("name,flavour", PAIRS)
def test_device_dtype_and_parameter_counts_are_transformers(models, name, flavour):
    ours, theirs, _ = models(name, flavour)
    assert (ours.device, ours.dtype) == (theirs.device, theirs.dtype) == \
        (torch.device("cpu"), torch.float32)
    for model in (ours, theirs):  # frozen embeddings, as in a probe or partial fine-tuning
        model.get_input_embeddings().weight.requires_grad_(False)
    for only_trainable in (False, True):
        for exclude_embeddings in (False, True):
            counts = [m.num_parameters(only_trainable=only_trainable,
                                       exclude_embeddings=exclude_embeddings)
                      for m in (ours, theirs)]
            assert counts[0] == counts[1], (only_trainable, exclude_embeddings, counts)
    assert ours.supports_gradient_checkpointing and theirs.supports_gradient_checkpointing


@pytest.mark.parametrize("name,flavour", PAIRS)
def test_the_embeddings_are_transformers(models, name, flavour):
    ours, theirs, _ = models(name, flavour)
    assert torch.equal(ours.get_input_embeddings().weight, theirs.get_input_embeddings().weight)
    if name != "BertForMaskedLM":
        assert ours.get_output_embeddings() is None and theirs.get_output_embeddings() is None
        with pytest.raises(TypeError, match="no output embeddings"):
            ours.set_output_embeddings(ours.get_input_embeddings())
        return
    # The decoder is the embedding matrix itself, as transformers' tied decoder's weight is.
    decoder = ours.get_output_embeddings()
    assert decoder is ours.get_input_embeddings()
    assert torch.equal(decoder.weight, theirs.get_output_embeddings().weight)
    # A new table of the same shape, swapped in both: the same logits again.
    g = torch.Generator().manual_seed(2)
    table = 0.3 * torch.randn(ours.get_input_embeddings().weight.shape, generator=g)
    for model in (ours, theirs):
        new = torch.nn.Embedding(*table.shape, padding_idx=0)
        with torch.no_grad():
            new.weight.copy_(table)
        model.set_input_embeddings(new)
    theirs.tie_weights()  # transformers re-ties its decoder to the new table here
    with torch.no_grad():
        assert _close(ours(**_batch()).logits, theirs(**_batch()).logits)
    with pytest.raises(ValueError, match="resize_token_embeddings"):
        ours.set_input_embeddings(torch.nn.Embedding(7, 32))


@pytest.mark.parametrize("name,flavour", PAIRS)
def test_resize_token_embeddings_is_transformers(models, name, flavour, tmp_path):
    """Grown (rounded up to a multiple) and shrunk: the same table, decoder bias, config
    and logits as transformers; the decoder stays tied; the folder saved loads in both."""
    ours, theirs, _ = models(name, flavour)
    for size, multiple in ((101, 8), (93, None)):  # 99 -> 104 -> 93
        torch.manual_seed(0)  # transformers draws its new rows around their mean
        got = ours.resize_token_embeddings(size, pad_to_multiple_of=multiple)
        want = theirs.resize_token_embeddings(size, pad_to_multiple_of=multiple)
        assert got is ours.get_input_embeddings() and got.weight.shape == want.weight.shape
        assert ours.config.vocab_size == theirs.config.vocab_size == want.weight.shape[0]
        assert _close(got.weight, want.weight, 1e-4)
        with torch.no_grad():
            a, b = ours(**_batch(size)), theirs(**_batch(size))
        assert _close(a[0], b[0], 1e-4)
        if name == "BertForMaskedLM":
            assert ours.get_output_embeddings() is got  # still the decoder
            bias = theirs.get_output_embeddings().bias
            assert _close(ours.head.bias, bias, 1e-4)
    ours.save_pretrained(tmp_path)
    back = getattr(transformers, _theirs(name, flavour)).from_pretrained(tmp_path).eval()
    again = getattr(minibert, name).from_pretrained(tmp_path)
    assert back.config.vocab_size == again.config.vocab_size == 93
    with torch.no_grad():
        assert _close(back(**_batch(93))[0], ours(**_batch(93))[0])
        assert _close(again(**_batch(93))[0], ours(**_batch(93))[0])


def test_resizing_without_the_mean_and_below_the_special_ids():
    torch.manual_seed(0)
    config = minibert.BertConfig.preset("tiny", vocab_size=99, pad_token_id=5)
    mlm = minibert.BertForMaskedLM(config)
    old = mlm.get_input_embeddings().weight.detach().clone()
    mlm.head.bias.requires_grad_(False)
    mlm.resize_token_embeddings(120, mean_resizing=False)
    new = mlm.get_input_embeddings().weight
    assert torch.equal(new[:99], old) and new.requires_grad and not mlm.head.bias.requires_grad
    assert 0.01 < new[99:].std().item() < 0.03  # N(0, initializer_range = 0.02), as a new model
    assert not mlm.head.bias[99:].any()
    with pytest.raises(ValueError, match="pad_token_id"):
        mlm.resize_token_embeddings(5)  # [PAD] must keep its row
    assert mlm.config.vocab_size == 120 and mlm.get_input_embeddings() is mlm.bert.embeddings.word


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_gradient_checkpointing_takes_transformers_arguments(models, flavour):
    """What TrainingArguments(gradient_checkpointing=True) calls, with the kwargs it passes:
    the same loss and gradients as transformers' checkpointed model, reentrant or not."""
    for kwargs in ({"use_reentrant": False}, {"use_reentrant": True}):
        ours, theirs, _ = models("BertForSequenceClassification", flavour)
        ours.train(), theirs.train()
        ours.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        theirs.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        assert ours.is_gradient_checkpointing and ours.bert.checkpoint_kwargs == kwargs
        labels = torch.tensor([0, 2])
        a, b = ours(**_batch(), labels=labels), theirs(**_batch(), labels=labels)
        a.loss.backward()
        b.loss.backward()
        assert _close(a.loss, b.loss)
        for mine, yours in ((ours.get_input_embeddings(), theirs.get_input_embeddings()),
                            (ours.classifier, theirs.classifier)):
            assert _close(mine.weight.grad, yours.weight.grad), kwargs
    ours.activation_checkpointing_disable()  # transformers' newer name for the switch
    assert not ours.is_gradient_checkpointing and not ours.is_activation_checkpointing
    with pytest.raises(ValueError, match="every_n_layers"):
        ours.activation_checkpointing_enable(every_n_layers=2)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_from_pretrained_takes_a_dtype_by_name_and_auto(models, flavour, tmp_path):
    _, theirs, _ = models("BertForMaskedLM", flavour)
    theirs.to(torch.bfloat16).save_pretrained(tmp_path)  # config.json records "bfloat16"
    load = minibert.BertForMaskedLM.from_pretrained
    hf_load = getattr(transformers, _theirs("BertForMaskedLM", flavour)).from_pretrained
    for dtype in ("auto", "bfloat16", "float32", torch.float16):
        ours, want = load(tmp_path, dtype=dtype), hf_load(tmp_path, dtype=dtype)
        assert ours.dtype == want.dtype, dtype
        assert torch.equal(ours.get_input_embeddings().weight,
                           want.get_input_embeddings().weight), dtype
    assert load(tmp_path, torch_dtype="auto").dtype == torch.bfloat16  # the older name
    assert load(tmp_path).dtype == torch.float32  # minibert's default: its training precision
    # Without the config's entry, "auto" is the dtype of the stored weights.
    config = json.loads((tmp_path / "config.json").read_text())
    assert config.pop("dtype", None) or config.pop("torch_dtype")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load(tmp_path, dtype="auto").dtype == hf_load(tmp_path, dtype="auto").dtype == \
        torch.bfloat16
    for bad, error in (("int8", ValueError), ("bfloat", TypeError), (16, TypeError)):
        with pytest.raises(error, match="dtype"):
            load(tmp_path, dtype=bad)
