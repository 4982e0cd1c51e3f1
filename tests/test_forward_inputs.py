"""`inputs_embeds` and `position_ids`, as transformers' users pass them: equal to
transformers' BertModel and ModernBertModel (and their heads) on the same weights, and the
usual mistakes refused by name."""

import pytest
import torch

import minibert
from facts import raises

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

ARCHS = {"classic": ("tiny", "Bert"), "modern": ("modernbert-tiny", "ModernBert")}
HEADS = [("BertModel", {}), ("BertForMaskedLM", {}),
         ("BertForSequenceClassification", {"num_labels": 3}),
         ("BertForTokenClassification", {"num_labels": 3}), ("BertForQuestionAnswering", {})]
B, T = 3, 11


def _config(arch):
    return minibert.BertConfig.preset(ARCHS[arch][0], vocab_size=99, max_position_embeddings=32,
                                      hidden_dropout=0.0, attention_dropout=0.0)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 7:] = 0
    ids[mask == 0] = 0
    # Each row's positions start elsewhere, as for a window cut from a longer text.
    positions = torch.arange(T) + torch.tensor([[0], [5], [20]])  # (B, T), max 30 < 32
    return ids, mask, positions


FIELDS = {"BertModel": ("last_hidden_state", "pooler_output"),
          "BertForQuestionAnswering": ("start_logits", "end_logits")}


def _fields(name, out):
    """The output tensors of model class `name`, which both libraries name alike."""
    return [getattr(out, f, None) for f in FIELDS.get(name, ("logits",))]


def _close(a, b, mask, tol=1e-4):
    """At real tokens, for per-token outputs; everywhere for per-sequence ones."""
    if a.dim() >= 2 and a.shape[:2] == mask.shape:
        a, b = a[mask.bool()], b[mask.bool()]
    assert (a - b).abs().max().item() <= tol


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name,kwargs", HEADS)
def test_inputs_embeds_and_position_ids_match_transformers(tmp_path, batch, arch, name, kwargs):
    torch.manual_seed(0)
    ours = getattr(minibert, name)(_config(arch), **kwargs).eval()
    ours.save_pretrained(tmp_path)
    theirs_name = name.replace("Bert", ARCHS[arch][1], 1)
    theirs = getattr(transformers, theirs_name).from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    ids, mask, positions = batch
    embeds = getattr(ours, "bert", ours).embeddings.word(ids)  # (B, T, H)
    with torch.no_grad():
        by_ids = ours(ids, mask)
        for args in ({"inputs_embeds": embeds}, {"input_ids": ids, "position_ids": positions},
                     {"inputs_embeds": embeds, "position_ids": positions}):
            got = ours(attention_mask=mask, **args)
            want = theirs(attention_mask=mask, **args)
            for a, b in zip(_fields(name, got), _fields(name, want)):
                if a is not None:  # ModernBERT has no pooler
                    _close(a, b, mask)
            if "position_ids" not in args:  # the word vectors looked up: the same numbers
                for a, b in zip(_fields(name, got), _fields(name, by_ids)):
                    assert a is None or torch.equal(a, b)


def test_position_ids_of_0_to_t_are_the_default(batch):
    ids, mask, _ = batch
    for arch in ARCHS:
        torch.manual_seed(0)
        model = minibert.BertModel(_config(arch)).eval()
        with torch.no_grad():
            want = model(ids, mask).last_hidden_state
            for positions in (torch.arange(T).expand(B, T), torch.arange(T)[None]):
                assert torch.equal(model(ids, mask, position_ids=positions).last_hidden_state,
                                   want)


def test_the_heads_losses_take_inputs_embeds(batch):
    """Labels are checked against the batch's (B, T), which inputs_embeds gives too."""
    ids, mask, positions = batch
    torch.manual_seed(0)
    mlm = minibert.BertForMaskedLM(_config("classic")).train()
    labels = torch.where(torch.arange(T) % 3 == 1, ids, -100)
    embeds = mlm.bert.embeddings.word(ids).detach().requires_grad_()
    out = mlm(inputs_embeds=embeds, attention_mask=mask, labels=labels, position_ids=positions)
    out.loss.backward()  # a gradient reaches the input vectors: integrated gradients' need
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0
    qa = minibert.BertForQuestionAnswering(_config("modern"))
    out = qa(inputs_embeds=embeds.detach(), attention_mask=mask,
             start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 3, 4]))
    assert torch.isfinite(out.loss)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return minibert.BertModel(_config("classic")).eval()


def test_input_ids_and_inputs_embeds_are_exclusive(model, batch):
    ids, mask, _ = batch
    embeds = model.embeddings.word(ids)
    with raises(ValueError, "input_ids", "inputs_embeds", "not both"):
        model(ids, mask, inputs_embeds=embeds)
    with raises(ValueError, "input_ids", "inputs_embeds"):
        model(attention_mask=mask)


@pytest.mark.parametrize("bad,facts", [
    (torch.zeros(B, T, 16), ("inputs_embeds", "(3, 11, 16)", "hidden_size=128")),
    (torch.zeros(B, T), ("inputs_embeds", "(3, 11)", "3-D")),
    (torch.zeros(B, T, 128, dtype=torch.long), ("inputs_embeds", "torch.int64", "float")),
])
def test_inputs_embeds_of_the_wrong_shape_or_dtype_are_refused(model, batch, bad, facts):
    with raises((ValueError, TypeError), *facts):
        model(inputs_embeds=bad, attention_mask=batch[1])


@pytest.mark.parametrize("bad,facts", [
    (torch.arange(T + 1)[None], ("position_ids", "(1, 12)", "(3, 11)")),
    (torch.arange(T)[None] + 30, ("position_ids", "40", "max_position_embeddings=32")),
    (torch.arange(T)[None] - 1, ("position_ids", "-1")),
    (torch.arange(T, dtype=torch.float)[None], ("position_ids", "torch.float32")),
])
def test_position_ids_of_the_wrong_shape_or_range_are_refused(model, batch, bad, facts):
    with raises((ValueError, TypeError), *facts):
        model(batch[0], batch[1], position_ids=bad)
