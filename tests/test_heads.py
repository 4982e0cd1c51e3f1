"""Token classification and question answering against transformers on the same random
weights, checkpoints in both directions, training-checkpoint export, and bad input."""

import json
from dataclasses import asdict

import pytest
import torch

import minibert
from conftest import hf_config, random_batch, tiny_config
from facts import raises
from minibert.training.checkpoint import save_checkpoint
from minibert.interop.export import export_checkpoint

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

BACKENDS = ["math", "sdpa", "chunked"]
TOL = 1e-5
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
T = 37  # random_batch's sequence length


def _randomise(model, seed):
    """Random, non-trivial values everywhere, so a swapped or skipped tensor cannot hide."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


def _hf_model(cls_name, tmp_path, id2label=None):
    """A random transformers model saved to disk, and the directory."""
    hc = hf_config(tiny_config())
    if id2label is not None:
        hc.id2label = dict(enumerate(id2label))
        hc.label2id = {name: i for i, name in enumerate(id2label)}
    model = _randomise(getattr(transformers, cls_name)(hc), seed=0)
    model.save_pretrained(tmp_path)
    return model, tmp_path


def _max_diff(a, b, mask=None):
    if mask is not None:  # compare real tokens only: padding positions are never used
        a, b = a[mask.bool()], b[mask.bool()]
    return (a - b).abs().max().item()


def _tags(ids):
    """Labels on every third token, IGNORE_INDEX elsewhere (the non-first pieces of words)."""
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, len(TAGS), ids.shape, generator=g)
    labels[:, 1::3] = labels[:, 2::3] = -100
    return labels


# ---- token classification ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_token_classification_matches_transformers(backend, tmp_path):
    theirs, path = _hf_model("BertForTokenClassification", tmp_path, id2label=TAGS)
    ours = minibert.BertForTokenClassification.from_pretrained(
        path, attention=backend, attention_chunk_size=8).eval()
    assert ours.num_labels == 5 and ours.id2label == TAGS  # from the checkpoint's label map
    ids, mask = random_batch(pad_from=20)
    types = (torch.arange(T) > 15).long().expand(3, T)
    labels = _tags(ids)
    hf_labels = labels.masked_fill(mask == 0, -100)  # what a collator gives transformers
    with torch.no_grad():
        a = ours(ids, mask, types, labels=labels)  # labels on padding too: ignored
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=hf_labels)
        c = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert a.logits.shape == (3, T, 5)
    assert _max_diff(a.logits, b.logits, mask) <= TOL
    assert abs(a.loss.item() - b.loss.item()) <= TOL
    # transformers scores the labels on padding, from vectors minibert never computes
    assert abs(a.loss.item() - c.loss.item()) > 1e-3


# ---- question answering -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start, end", [
    ([3, 0, 30], [5, 0, 36]),  # inside; 0 is [CLS], "no answer"
    ([-2, T + 10, 4], [T, 5, 40]),  # negative -> [CLS]; at or past the end -> ignored
    ([T, 50, 99], [2, 3, 4]),  # every start ignored: transformers' loss is NaN, and so is ours
])
def test_question_answering_matches_transformers(backend, start, end, tmp_path):
    theirs, path = _hf_model("BertForQuestionAnswering", tmp_path)
    ours = minibert.BertForQuestionAnswering.from_pretrained(
        path, attention=backend, attention_chunk_size=8).eval()
    ids, _ = random_batch()  # no padding: transformers' softmax over positions includes it
    types = (torch.arange(T) > 10).long().expand(3, T)
    s, e = torch.tensor(start), torch.tensor(end)
    with torch.no_grad():
        a = ours(ids, torch.ones_like(ids), types, start_positions=s, end_positions=e)
        b = theirs(input_ids=ids, token_type_ids=types, start_positions=s, end_positions=e)
    assert a.start_logits.shape == a.end_logits.shape == (3, T)
    assert _max_diff(a.start_logits, b.start_logits) <= TOL
    assert _max_diff(a.end_logits, b.end_logits) <= TOL
    if b.loss.isnan():
        assert a.loss.isnan()
    else:
        assert abs(a.loss.item() - b.loss.item()) <= TOL


def test_question_answering_with_padding_is_each_sequence_alone(tmp_path):
    """Padding is outside the sequence: the loss of a padded batch is the mean of the
    transformers losses of its sequences run alone, without padding."""
    theirs, path = _hf_model("BertForQuestionAnswering", tmp_path)
    ours = minibert.BertForQuestionAnswering.from_pretrained(path).eval()
    ids, mask = random_batch(pad_from=20)
    start, end = torch.tensor([3, 17, 30]), torch.tensor([5, 19, 36])
    with torch.no_grad():
        a = ours(ids, mask, start_positions=start, end_positions=end)
        alone = []
        for b in range(3):
            n = int(mask[b].sum())
            out = theirs(input_ids=ids[b:b + 1, :n], start_positions=start[b:b + 1],
                         end_positions=end[b:b + 1])
            assert _max_diff(a.start_logits[b, :n], out.start_logits[0]) <= TOL
            assert _max_diff(a.end_logits[b, :n], out.end_logits[0]) <= TOL
            alone.append(out.loss)
        padded = theirs(input_ids=ids, attention_mask=mask, start_positions=start,
                        end_positions=end)
    assert abs(a.loss.item() - torch.stack(alone).mean().item()) <= TOL
    assert (a.start_logits[1, 20:] == torch.finfo(torch.float32).min).all()
    # transformers' own padded loss differs: its softmax runs over the padding as well
    assert abs(a.loss.item() - padded.loss.item()) > 1e-3


def test_question_answering_position_on_padding_is_ignored():
    model = _randomise(minibert.BertForQuestionAnswering(tiny_config()), seed=2)
    ids, mask = random_batch(pad_from=20)
    end = torch.tensor([5, 8, 36])
    with torch.no_grad():
        losses = [model(ids, mask, start_positions=torch.tensor([3, s, 30]),
                        end_positions=end).loss.item() for s in (25, T, 1000)]
        inside = model(ids, mask, start_positions=torch.tensor([3, 19, 30]),
                       end_positions=end).loss.item()
    assert losses[0] == losses[1] == losses[2]  # on padding == past the end: ignored
    assert abs(losses[0]) < 1e3 and losses[0] != inside


def test_masked_lm_label_on_padding_is_ignored():
    """The encoder does not compute padding, so a label there was scored against a zero
    hidden state: a loss neither transformers' nor the real tokens'."""
    model = _randomise(minibert.BertForMaskedLM(tiny_config()), seed=2)
    ids, mask = random_batch(pad_from=20)
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7] = 11, 12
    with torch.no_grad():
        real = model(ids, mask, labels=labels)
        labels[1, 25] = 13  # on padding
        padded = model(ids, mask, labels=labels)
    assert padded.loss.item() == real.loss.item() and padded.logits.shape == (2, 99)
    # Every other count of targets agrees with the head: the evaluation, the distillation
    # loss and the accumulation weights (evaluate and the Distiller failed on a shape).
    from minibert.labels import count_targets
    from minibert.tasks.distill import Distiller
    from minibert.training.evaluation import evaluate

    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    assert count_targets(batch) == 2
    scores = evaluate(model, [batch], "fp32", torch.device("cpu"))
    assert abs(scores["eval_loss"] - real.loss.item()) < 1e-6
    distiller = Distiller(model, _randomise(minibert.BertForMaskedLM(tiny_config()), seed=3),
                          alpha=0.5, temperature=2.0)
    with torch.no_grad():
        assert distiller(**batch).logits.shape == (2, 99)


# ---- checkpoints both ways ----------------------------------------------------------------------

@pytest.mark.parametrize("cls_name, kwargs", [
    ("BertForTokenClassification", {"num_labels": 5, "id2label": TAGS}),
    ("BertForQuestionAnswering", {}),
])
def test_save_pretrained_loads_in_transformers(cls_name, kwargs, tmp_path):
    ours = _randomise(getattr(minibert, cls_name)(tiny_config(), **kwargs), seed=3)
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [cls_name]
    theirs, info = getattr(transformers, cls_name).from_pretrained(tmp_path,
                                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    theirs.eval()
    ids, mask = random_batch(pad_from=30)
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    if cls_name == "BertForTokenClassification":
        assert saved["id2label"] == {str(i): n for i, n in enumerate(TAGS)}
        assert theirs.config.id2label == dict(enumerate(TAGS))
        assert _max_diff(a.logits, b.logits, mask) <= TOL
    else:
        assert _max_diff(a.start_logits, b.start_logits, mask) <= TOL
        assert _max_diff(a.end_logits, b.end_logits, mask) <= TOL
    again = getattr(minibert, cls_name).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert all(torch.equal(x, y) for x, y in zip(again(ids, mask).to_tuple(), a.to_tuple()))


@pytest.mark.parametrize("source", ["BertForSequenceClassification", "BertModel"])
def test_checkpoint_with_a_pooler_loads_into_the_pooler_free_heads(source, tmp_path, caplog):
    """The usual start of fine-tuning: an encoder (with pooler) under a fresh head."""
    theirs, path = _hf_model(source, tmp_path, id2label=["a", "b", "c"])
    encoder = theirs if source == "BertModel" else theirs.bert
    ids, mask = random_batch(pad_from=20)
    with torch.no_grad():
        want = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    for model in (minibert.BertForTokenClassification.from_pretrained(path, num_labels=7),
                  minibert.BertForQuestionAnswering.from_pretrained(path)):
        assert model.bert.pooler is None
        with torch.no_grad():
            got = model.eval().bert(ids, mask).last_hidden_state
        assert _max_diff(got, want, mask) <= TOL
    assert "qa_outputs" in caplog.text and "classifier" in caplog.text  # newly initialised
    tagger = minibert.BertForTokenClassification.from_pretrained(path)
    assert tagger.id2label == ["a", "b", "c"]
    if source == "BertForSequenceClassification":
        # Same name, same shape, another task: a sentence classifier is no token classifier.
        assert not torch.equal(tagger.classifier.weight, theirs.classifier.weight)
        again = minibert.BertForSequenceClassification.from_pretrained(path)
        assert torch.equal(again.classifier.weight, theirs.classifier.weight)


def test_outputs_carry_transformers_field_names():
    outputs = transformers.modeling_outputs
    for ours, theirs in [(minibert.TokenClassifierOutput, outputs.TokenClassifierOutput),
                         (minibert.QuestionAnsweringModelOutput,
                          outputs.QuestionAnsweringModelOutput),
                         (minibert.SequenceClassifierOutput, outputs.SequenceClassifierOutput),
                         (minibert.MaskedLMOutput, outputs.MaskedLMOutput)]:
        assert list(ours.__dataclass_fields__) == \
            list(theirs.__dataclass_fields__)[:len(ours.__dataclass_fields__)]


# ---- training checkpoints -> model folders ----------------------------------------------------

def test_a_head_added_to_heads_py_exports_with_nothing_added_elsewhere(tmp_path, monkeypatch):
    """docs/walkthrough.md's recipe, "Adding a head": a class in heads.py (with its name in
    minibert/__init__.py, and a row in hf.py for a layer of a new name) is all it takes. Here
    one whose layer is named as the classifiers' is: export rebuilds it from a checkpoint by
    the name the checkpoint records, and the folder loads back the same weights."""
    from torch import nn

    from minibert.interop.pretrained import PretrainedMixin
    from minibert.model import heads

    class BertForPairScore(PretrainedMixin, nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.bert = minibert.BertModel(config)
            self.classifier = nn.Linear(config.hidden_size, 1)

        def forward(self, input_ids, attention_mask=None):
            return self.classifier(self.bert(input_ids, attention_mask).pooler_output)

    BertForPairScore.__module__ = heads.__name__
    monkeypatch.setattr(heads, "BertForPairScore", BertForPairScore, raising=False)
    model = _randomise(BertForPairScore(tiny_config()), seed=6)
    state = {"model": model.state_dict(), "model_config": asdict(model.config),
             "model_class": "BertForPairScore", "step": 3}
    ckpt = save_checkpoint(tmp_path / "checkpoints", 3, state)
    export_checkpoint(ckpt, tmp_path / "export")
    back = BertForPairScore.from_pretrained(tmp_path / "export")
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("cls_name, kwargs", [
    ("BertForTokenClassification", {"num_labels": 4}),
    ("BertForQuestionAnswering", {}),
])
def test_export_checkpoint_of_the_new_heads(cls_name, kwargs, tmp_path):
    model = _randomise(getattr(minibert, cls_name)(tiny_config(), **kwargs), seed=4)
    # A checkpoint saved outside the training loop records no class: export asks for it.
    state = {"model": model.state_dict(), "model_config": asdict(model.config), "step": 7}
    ckpt = save_checkpoint(tmp_path / "checkpoints", 7, state)
    with pytest.raises(ValueError, match="model_class="):
        export_checkpoint(ckpt, tmp_path / "export")
    export_checkpoint(ckpt, tmp_path / "export", model_class=cls_name)
    assert json.loads((tmp_path / "export" / "config.json").read_text())["architectures"] == \
        [cls_name]
    ours = getattr(minibert, cls_name).from_pretrained(tmp_path / "export").eval()
    theirs = getattr(transformers, cls_name).from_pretrained(tmp_path / "export").eval()
    ids, mask = random_batch()
    with torch.no_grad():
        want, got, ref = model(ids, mask), ours(ids, mask), theirs(input_ids=ids,
                                                                   attention_mask=mask)
    for name in want.keys():  # logits, or start_logits and end_logits
        assert torch.equal(getattr(got, name), getattr(want, name))
        assert _max_diff(getattr(ref, name), getattr(want, name)) <= TOL


def test_export_keeps_a_classifier_s_class_names(tmp_path):
    """A training checkpoint records the classifier's id2label: exported without it, the
    folder read every prediction back as LABEL_i, in minibert and in transformers."""
    from minibert.data.tasks import TaskCollator
    from minibert.training.engine import TrainConfig, train

    model = minibert.BertForSequenceClassification(tiny_config(), 3,
                                                   id2label=["neg", "neu", "pos"])
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(5, 99, (12,), generator=g).numpy(), "label": i % 3}
            for i in range(16)]
    train(model, data, TaskCollator(0), TrainConfig(batch_size=8, max_steps=1, warmup=0,
                                                    progress=False, precision="fp32",
                                                    peak_flops=1e11), tmp_path / "run")
    export_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001", tmp_path / "export")
    assert minibert.BertForSequenceClassification.from_pretrained(
        tmp_path / "export").id2label == ["neg", "neu", "pos"]
    assert transformers.AutoConfig.from_pretrained(tmp_path / "export").id2label == \
        {0: "neg", 1: "neu", 2: "pos"}


@pytest.mark.parametrize("id2label, said", [
    ({"neg": "neg", "neu": "neu", "pos": "pos"}, "'neg'"),  # label2id's shape, by mistake
    ({"0": "neg", "1": "neu", "5": "pos"}, "'5'"),  # ids with a gap: whose class is 2?
    (["neg", "neu", "pos"], "list"),
])
def test_an_id2label_that_is_not_class_ids_names_the_field_and_the_file(id2label, said,
                                                                         tmp_path):
    """Keys that are not integers failed in int() with a bare ValueError, naming nothing."""
    minibert.BertForSequenceClassification(tiny_config(), 3).save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**stored, "id2label": id2label}))
    for cls in (minibert.BertForSequenceClassification, minibert.BertModel):
        with raises(ValueError, "id2label", said, str(tmp_path / "config.json")):
            cls.from_pretrained(tmp_path)


def test_export_will_not_guess_between_classifiers_without_a_pooler(tmp_path):
    """A checkpoint that records no class (saved outside the training loop) is not guessed
    from its weight names: with task_head="transform" a sequence and a token classifier
    have the same ones. Export asks for the class."""
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=99,
                                        max_position_embeddings=64)
    model = minibert.BertForSequenceClassification(config, 3)
    state = {"model": model.state_dict(), "model_config": asdict(model.config), "step": 7}
    ckpt = save_checkpoint(tmp_path / "checkpoints", 7, state)
    with raises(ValueError, "model_class=", "'BertForSequenceClassification'",
                "'BertForTokenClassification'"):
        export_checkpoint(ckpt, tmp_path / "export")
    export_checkpoint(ckpt, tmp_path / "export", model_class="BertForSequenceClassification")
    again = minibert.BertForSequenceClassification.from_pretrained(tmp_path / "export")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(),
                                                 model.state_dict().values()))


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_labels_and_positions():
    ids = torch.ones(2, 5, dtype=torch.long)
    tagger = minibert.BertForTokenClassification(tiny_config(), 3)
    # each names the argument, what it got, and what it needs
    with raises(ValueError, "labels", "(2,)", "(2, 5)"):
        tagger(ids, labels=torch.zeros(2, dtype=torch.long))
    with raises(TypeError, "labels", "integer", "torch.float32"):
        tagger(ids, labels=torch.zeros(2, 5))
    with raises(ValueError, "num_labels=1", ">= 2"):
        minibert.BertForTokenClassification(tiny_config(), 1)
    with raises(ValueError, "id2label", "num_labels=3", "['a', 'b']"):
        minibert.BertForTokenClassification(tiny_config(), 3, id2label=["a", "b"])
    qa = minibert.BertForQuestionAnswering(tiny_config())
    with raises(ValueError, "start_positions", "end_positions"):
        qa(ids, start_positions=torch.tensor([1, 2]))
    with raises(ValueError, "end_positions", "(2, 1)", "(2,)"):
        qa(ids, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([[1], [2]]))
    with raises(TypeError, "start_positions", "integer", "torch.float32"):
        qa(ids, start_positions=torch.tensor([1.0, 2.0]), end_positions=torch.tensor([1, 2]))


def test_labels_outside_the_classes_are_named_not_indexed():
    """A label id past num_labels (a label map from another file, a -1 for "none") is an
    IndexError deep in cross_entropy on a CPU and a device-side assert on a GPU."""
    ids = torch.ones(2, 5, dtype=torch.long)
    vocab = tiny_config().vocab_size
    cases = [  # the model, its labels, and the facts: the value refused, the range it is not in
        (minibert.BertForSequenceClassification(tiny_config(), 3),
         torch.tensor([0, 3]), ["labels", "3", "[0, 3)"]),
        (minibert.BertForSequenceClassification(tiny_config(), 3),
         torch.tensor([-1, 0]), ["labels", "-1", "[0, 3)"]),
        (minibert.BertForTokenClassification(tiny_config(), 3),
         torch.tensor([[0, 1, 5, -100, -100]] * 2), ["labels", "5", "[0, 3)"]),
        (minibert.BertForMaskedLM(tiny_config()),
         torch.full((2, 5), -100).index_fill_(1, torch.tensor([1]), vocab),
         ["labels", "vocabulary", f"[0, {vocab})"]),
    ]
    for model, labels, facts in cases:
        with raises(ValueError, *facts):
            model(ids, labels=labels)
    # IGNORE_INDEX is not a class, and is not refused
    minibert.BertForTokenClassification(tiny_config(), 3)(
        ids, labels=torch.tensor([[0, 1, 2, -100, -100]] * 2))


def test_mean_pooling_of_a_row_without_real_tokens_is_finite():
    from minibert.model.heads import pool

    h = torch.randn(2, 4, 8)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    out = pool(h, mask, "mean")
    assert torch.isfinite(out).all()
    assert torch.allclose(out[0], h[0, :2].mean(0))


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("n_predicted", [20, 0])
def test_mlm_word_embedding_gradient_matches_transformers(n_predicted, fast, tmp_path):
    """The tied word embedding's .grad, plain and with the fast model's hand-off (the lookup
    adds its rows into the gradient the decoder handed over, kernels.TiedWordGradient), is
    dense and equals transformers' on the same weights, [PAD] row included (the lookup gives
    it none), and fused AdamW takes it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(tiny_config(hidden_dropout=0.0, attention_dropout=0.0))
    model.save_pretrained(tmp_path)
    if fast:
        minibert.fast(model)
    ref = transformers.BertForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager")
    ids, mask = random_batch(pad_from=20)
    ids[0, 3] = 0  # [PAD] at an attended position: the lookup gives its row no gradient
    labels = torch.full_like(ids, -100)
    real = mask.view(-1).nonzero().view(-1)
    picked = real[torch.randperm(len(real))[:n_predicted]]
    labels.view(-1)[picked] = ids.view(-1)[picked]

    for m in (model, ref):
        if n_predicted:
            m(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        else:
            (m(input_ids=ids, attention_mask=mask).logits * mask[..., None]).sum().backward()
    got = model.bert.embeddings.word.weight.grad
    assert got.layout == torch.strided and not got.is_sparse
    want = ref.bert.embeddings.word_embeddings.weight.grad
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True).step()


def test_bert_model_alone_keeps_a_dense_lookup_gradient():
    model = minibert.BertModel(tiny_config())
    ids, mask = random_batch()
    model(ids, mask).last_hidden_state.sum().backward()
    assert not model.embeddings.word.weight.grad.is_sparse


def test_a_classifier_refuses_a_batch_padded_on_the_left():
    """[CLS] at position 0 is what a sequence classifier reads; padded on the left, that
    position is padding, which the encoder leaves at zero: the class came from nothing."""
    ids, mask = random_batch(pad_from=20)
    left = torch.cat([mask[:, 20:], mask[:, :20]], dim=1)  # row 1's padding first
    multi = minibert.BertMultiTask(tiny_config(), {"s": ("sequence", 3)})
    calls = [lambda m: minibert.BertForSequenceClassification(tiny_config(), 3)(ids, m),
             lambda m: minibert.BertForSequenceClassification(
                 tiny_config(task_head="transform"), 3)(ids, m),
             lambda m: multi(ids, m, task="s")]
    for call in calls:
        with raises(ValueError, "attention_mask", "position 0", "[1]", "right"):

            call(left)
        call(mask)  # padded on the right: fine


def test_the_pooler_refuses_a_batch_padded_on_the_left_as_the_classifiers_do():
    """`pooler_output` reads position 0 too: padded on the left, it came from the zero
    vector the encoder leaves at padding. A model without a pooler reads no [CLS]."""
    ids, mask = random_batch(pad_from=20)
    left = torch.cat([mask[:, 20:], mask[:, :20]], dim=1)  # row 1's padding first
    with raises(ValueError, "attention_mask", "position 0", "[1]", "pooler", "right"):
        minibert.BertModel(tiny_config())(ids, left)
    assert minibert.BertModel(tiny_config())(ids, mask).pooler_output.shape == (3, 32)
    out = minibert.BertModel(tiny_config(), add_pooler=False)(ids, left)
    assert out.pooler_output is None and out.last_hidden_state[1, :17].abs().sum() == 0
