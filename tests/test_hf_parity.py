"""minibert against transformers on the same random weights, and checkpoints in both directions."""

import json

import pytest
import torch

import minibert
from conftest import hf_config, random_batch, tiny_config
from facts import raises

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

BACKENDS = ["math", "sdpa", "chunked"]
TOL = 1e-5


def _hf_model(cls_name, config, tmp_path, num_labels=None):
    """A random transformers model saved to disk, and the directory."""
    torch.manual_seed(0)
    hc = hf_config(config)
    if num_labels is not None:
        hc.num_labels = num_labels
    model = getattr(transformers, cls_name)(hc).eval()
    # Random, non-trivial values everywhere, so a swapped or skipped tensor cannot hide.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(tmp_path)
    return model, tmp_path


def _max_diff(a, b, mask=None):
    if mask is not None:  # compare real tokens only: padding positions are never used
        a, b = a[mask.bool()], b[mask.bool()]
    return (a - b).abs().max().item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bert_model_hidden_states(backend, tmp_path):
    config = tiny_config()
    hf, path = _hf_model("BertModel", config, tmp_path)
    ours = minibert.BertModel.from_pretrained(path, attention=backend,
                                              attention_chunk_size=8).eval()
    ids, mask = random_batch(pad_from=20)
    types = (torch.arange(37) > 15).long().expand(3, 37)
    with torch.no_grad():
        a = ours(ids, mask, types)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert _max_diff(a.last_hidden_state, b.last_hidden_state, mask) <= TOL
    assert _max_diff(a.pooler_output, b.pooler_output) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_lm_logits_and_loss(backend, tmp_path):
    config = tiny_config()
    hf, path = _hf_model("BertForMaskedLM", config, tmp_path)
    ours = minibert.BertForMaskedLM.from_pretrained(path, attention=backend,
                                                    attention_chunk_size=8).eval()
    ids, mask = random_batch(pad_from=25)
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]
    labels[1, 25:] = -100
    with torch.no_grad():
        dense = ours(ids, mask)
        sparse = ours(ids, mask, labels=labels)
        ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
    assert dense.loss is None and dense.logits.shape == (3, 37, 99)
    assert _max_diff(dense.logits, ref.logits, mask) <= TOL
    assert abs(sparse.loss.item() - ref.loss.item()) <= TOL
    # sparse logits are exactly the dense logits at the labelled positions
    assert sparse.logits.shape == ((labels != -100).sum().item(), 99)
    assert _max_diff(sparse.logits, ref.logits[labels != -100]) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_labels", [3, 1])
def test_sequence_classification(backend, num_labels, tmp_path):
    config = tiny_config()
    hf, path = _hf_model("BertForSequenceClassification", config, tmp_path,
                         num_labels=num_labels)
    ours = minibert.BertForSequenceClassification.from_pretrained(
        path, attention=backend, attention_chunk_size=8).eval()
    assert ours.num_labels == num_labels  # read from the checkpoint's label map
    ids, mask = random_batch(pad_from=10)
    labels = torch.tensor([0, 2, 1]) if num_labels == 3 else torch.tensor([0.5, -1.0, 2.0])
    with torch.no_grad():
        a = ours(ids, mask, labels=labels)
        b = hf(input_ids=ids, attention_mask=mask, labels=labels)
    assert _max_diff(a.logits, b.logits) <= TOL
    assert abs(a.loss.item() - b.loss.item()) <= TOL


@pytest.mark.parametrize("cls_name", ["BertModel", "BertForMaskedLM",
                                      "BertForSequenceClassification"])
def test_save_pretrained_loads_in_transformers(cls_name, tmp_path):
    torch.manual_seed(1)
    ours = getattr(minibert, cls_name)(tiny_config()).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.2)
    ours.save_pretrained(tmp_path)
    hf = getattr(transformers, cls_name).from_pretrained(tmp_path).eval()
    ids, mask = random_batch(pad_from=30)
    with torch.no_grad():
        a, b = ours(ids, mask), hf(input_ids=ids, attention_mask=mask)
    if cls_name == "BertModel":
        assert _max_diff(a.last_hidden_state, b.last_hidden_state, mask) <= TOL
        assert _max_diff(a.pooler_output, b.pooler_output) <= TOL
    elif cls_name == "BertForMaskedLM":
        assert _max_diff(a.logits, b.logits, mask) <= TOL
    else:
        assert _max_diff(a.logits, b.logits) <= TOL


def test_load_across_classes(tmp_path):
    """An MLM checkpoint into a classifier (fine-tuning) and a classifier's encoder alone."""
    _, mlm_dir = _hf_model("BertForMaskedLM", tiny_config(), tmp_path / "mlm")
    hf_cls, cls_dir = _hf_model("BertForSequenceClassification", tiny_config(),
                                tmp_path / "cls", num_labels=4)
    clf = minibert.BertForSequenceClassification.from_pretrained(mlm_dir, num_labels=5)
    assert clf.classifier.out_features == 5
    encoder = minibert.BertModel.from_pretrained(cls_dir).eval()
    ids, mask = random_batch()
    with torch.no_grad():
        a = encoder(ids, mask).pooler_output
        b = hf_cls.bert(input_ids=ids, attention_mask=mask).pooler_output
    assert _max_diff(a, b) <= TOL


def test_old_style_pickle_checkpoint(tmp_path):
    """pytorch_model.bin, no `bert.` prefix, LayerNorm gamma/beta: the original BERT release."""
    hf, _ = _hf_model("BertModel", tiny_config(), tmp_path / "src")
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                    "LayerNorm.beta"): v
          for k, v in hf.state_dict().items()}
    out = tmp_path / "old"
    out.mkdir()
    torch.save(sd, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps(hf.config.to_dict()))
    ours = minibert.BertModel.from_pretrained(out).eval()
    ids, mask = random_batch()
    with torch.no_grad():
        a = ours(ids, mask).last_hidden_state
        b = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert _max_diff(a, b) <= TOL


def test_pre_ln_round_trip(tmp_path):
    torch.manual_seed(2)
    model = minibert.BertForMaskedLM(tiny_config(norm_position="pre")).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["norm_position"] == "pre"
    again = minibert.BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert again.config == model.config and again.bert.final_norm is not None
    ids, mask = random_batch()
    with torch.no_grad():
        assert torch.equal(model(ids, mask).logits, again(ids, mask).logits)


def test_pre_ln_export_is_refused_by_transformers(tmp_path):
    """transformers' BERT is Post-LN only: it must refuse a Pre-LN export, not misread it.

    Without this, transformers loaded the Pre-LN weights into its Post-LN blocks with only a
    warning about the unused final LayerNorm, and computed something else.
    """
    torch.manual_seed(3)
    model = minibert.BertForMaskedLM(tiny_config(norm_position="pre")).eval()
    model.save_pretrained(tmp_path)
    for load in (transformers.BertForMaskedLM.from_pretrained,
                 transformers.BertModel.from_pretrained,
                 transformers.AutoModelForMaskedLM.from_pretrained,
                 transformers.AutoModel.from_pretrained):
        # The Auto classes refuse the unknown model_type; the BERT classes find no weights.
        with pytest.raises((OSError, ValueError), match="minibert-preln|model.safetensors"):
            load(tmp_path)
    again = minibert.BertForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = random_batch()
    with torch.no_grad():
        assert torch.equal(model(ids, mask).logits, again(ids, mask).logits)


def test_a_subclass_loads_and_saves_as_its_base_class(tmp_path):
    """A user's subclass of a model class (to add a method, say) is that class to the files:
    checked by name, it lost a classifier's trained head on loading, saved itself under an
    architecture no one knows, and a bare encoder's weights under minibert's own names."""
    class MyClassifier(minibert.BertForSequenceClassification):
        pass

    class MyEncoder(minibert.BertModel):
        pass

    config = tiny_config()
    ids, mask = random_batch(pad_from=20)
    hf, path = _hf_model("BertForSequenceClassification", config, tmp_path / "cls", 3)
    with torch.no_grad():
        ours = MyClassifier.from_pretrained(path).eval()(ids, mask).logits
        assert _max_diff(ours, hf(input_ids=ids, attention_mask=mask).logits) < TOL
    MyClassifier.from_pretrained(path).save_pretrained(tmp_path / "mine")
    saved = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert saved["architectures"] == ["BertForSequenceClassification"]

    torch.manual_seed(0)
    encoder = MyEncoder(config).eval()
    encoder.save_pretrained(tmp_path / "enc")
    loaded, info = transformers.BertModel.from_pretrained(tmp_path / "enc",
                                                          output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        want = encoder(ids, mask).last_hidden_state
        got = loaded.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert _max_diff(got, want, mask) < TOL


def test_a_stored_decoder_other_than_the_embeddings_is_refused(tmp_path):
    """transformers decodes with a stored decoder matrix; minibert decodes with the word
    embeddings. A copy equal to them loads; one that differs used to load silently, with
    logits off by whole units."""
    from safetensors.torch import load_file, save_file

    _, path = _hf_model("BertForMaskedLM", tiny_config(), tmp_path / "m")
    weights = load_file(str(path / "model.safetensors"))
    words = weights["bert.embeddings.word_embeddings.weight"]
    save_file({**weights, "cls.predictions.decoder.weight": words.clone()},
              str(path / "model.safetensors"))
    minibert.BertForMaskedLM.from_pretrained(path)  # the same matrix, stored twice
    save_file({**weights, "cls.predictions.decoder.weight": words + 0.1},
              str(path / "model.safetensors"))
    # both matrices by name, and the classes that load such a folder
    with raises(ValueError, "cls.predictions.decoder.weight",
                "bert.embeddings.word_embeddings.weight", "BertModel"):
        minibert.BertForMaskedLM.from_pretrained(path)
    minibert.BertForSequenceClassification.from_pretrained(path, num_labels=2)  # no decoder


def test_a_classifier_with_unnamed_classes_reads_as_transformers_reads_it(tmp_path):
    """transformers writes no id2label for a default binary classifier. Read as "no names",
    its head could not be replaced for 3 classes (a shape error), nor its classes named."""
    config = tiny_config()
    ids, mask = random_batch(pad_from=20)
    hf, path = _hf_model("BertForSequenceClassification", config, tmp_path / "binary")
    stored = json.loads((path / "config.json").read_text())
    stored.pop("id2label", None), stored.pop("label2id", None)
    (path / "config.json").write_text(json.dumps(stored))
    named = minibert.BertForSequenceClassification.from_pretrained(path, id2label=["no", "yes"])
    assert named.id2label == ["no", "yes"]
    assert torch.equal(named.classifier.weight, hf.classifier.weight)  # its trained head
    with raises(ValueError, str(path), "['LABEL_0', 'LABEL_1']", "on_other_labels='new_head'"):

        minibert.BertForSequenceClassification.from_pretrained(path, num_labels=3)
    fresh = minibert.BertForSequenceClassification.from_pretrained(
        path, num_labels=3, on_other_labels="new_head")
    assert fresh.num_labels == 3 and fresh.classifier.weight.shape[0] == 3
    # num_labels written without names: that many classes, as transformers reads it
    hf3, path3 = _hf_model("BertForSequenceClassification", config, tmp_path / "three", 3)
    stored = json.loads((path3 / "config.json").read_text())
    stored.pop("id2label", None), stored.pop("label2id", None)
    (path3 / "config.json").write_text(json.dumps({**stored, "num_labels": 3}))
    three = minibert.BertForSequenceClassification.from_pretrained(path3).eval()
    with torch.no_grad():
        assert _max_diff(three(ids, mask).logits,
                         hf3(input_ids=ids, attention_mask=mask).logits) < TOL


def test_a_pretraining_folder_loads_into_every_class(tmp_path):
    """What a model leaves unread on purpose is no disagreement: bert-base-uncased's folder
    holds the next-sentence head, the pooler, the decoder's copy of the word embeddings and
    (older transformers) the position_ids buffer, none of which most classes take."""
    theirs, folder = _hf_model("BertForPreTraining", tiny_config(), tmp_path)
    from safetensors.torch import load_file, save_file
    sd = load_file(str(folder / "model.safetensors"))
    sd["bert.embeddings.position_ids"] = torch.arange(64)[None]
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    ids, mask = random_batch()
    with torch.no_grad():
        want = theirs.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    for cls, kwargs in [(minibert.BertModel, {}), (minibert.BertForMaskedLM, {}),
                        (minibert.BertForSequenceClassification, {}),
                        (minibert.BertForTokenClassification, {"num_labels": 3}),
                        (minibert.BertForQuestionAnswering, {})]:
        model = cls.from_pretrained(folder, **kwargs)
        encoder = model if cls is minibert.BertModel else model.bert
        with torch.no_grad():
            assert _max_diff(encoder(ids, mask).last_hidden_state, want, mask) <= TOL
