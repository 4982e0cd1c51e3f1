"""What probing code asks of an encoder, against transformers on the same weights: every
layer's hidden states and attention probabilities, for classic BERT and for ModernBERT with
its sliding windows, on padded batches, from the bare encoder and from every head."""

import pytest
import torch

import minibert
from conftest import hf_config, random_batch, tiny_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TOL = 1e-5


def _perturbed(model, seed=0):
    """Random values in every tensor, norms included, so that a state taken at the wrong
    place (before a norm, after the wrong block) cannot pass for the right one."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _classic(tmp_path, cls_name="BertModel", **hf_overrides):
    hc = hf_config(tiny_config())
    hc._attn_implementation = "eager"
    for k, v in hf_overrides.items():
        setattr(hc, k, v)
    torch.manual_seed(0)
    hf = _perturbed(getattr(transformers, cls_name)(hc))
    hf.save_pretrained(tmp_path)
    return hf


def _modern(tmp_path, cls_name="ModernBertModel", **overrides):
    fields = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=64, local_attention=8,
                  global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2,
                  eos_token_id=3, cls_token_id=2, sep_token_id=3, attn_implementation="eager")
    fields.update(overrides)
    torch.manual_seed(0)
    hf = _perturbed(getattr(transformers, cls_name)(transformers.ModernBertConfig(**fields)))
    hf.save_pretrained(tmp_path)
    return hf


def _batch(T=21):
    ids, mask = random_batch(B=3, T=T, pad_from=13)
    mask[2, 6:] = 0
    ids[2, 6:] = 0
    return ids, mask


def _assert_states_match(ours, theirs, mask, n_layers):
    """Both tuples: L + 1 states (B, T, H), equal at real tokens, ours zero at padding."""
    assert len(ours) == len(theirs) == n_layers + 1
    keep = mask.bool()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, i
        assert (a[keep] - b[keep]).abs().max().item() <= TOL, f"hidden state {i}"
        assert not a[~keep].any(), f"hidden state {i} is not zero at padding"


def _assert_attentions_match(ours, theirs, mask, n_layers):
    """Both tuples: L probabilities (B, nh, T, T), equal in every real query's row; ours
    zero in the rows of padding queries."""
    assert len(ours) == len(theirs) == n_layers
    keep = mask.bool()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, i
        rows = keep[:, None, :].expand(a.shape[:3])  # (B, nh, T): real queries
        assert (a[rows] - b[rows]).abs().max().item() <= TOL, f"attentions {i}"
        assert not a[~rows].any(), f"attentions {i}: a padding query's row is not zero"
        assert torch.allclose(a[rows].sum(-1), torch.ones(())), i


def _both(ours, hf):
    """Both models' outputs on the padded batch, every state and map asked for."""
    ids, mask = _batch()
    with torch.no_grad():
        a = ours(ids, mask, output_hidden_states=True, output_attentions=True)
        b = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True,
               output_attentions=True)
    return a, b, mask


@pytest.mark.parametrize("backend", ["math", "sdpa", "chunked"])
def test_hidden_states_and_attentions_match_transformers_bert(tmp_path, backend):
    hf = _classic(tmp_path)
    ours = minibert.BertModel.from_pretrained(tmp_path, attention=backend,
                                              attention_chunk_size=8).eval()
    a, b, mask = _both(ours, hf)
    _assert_states_match(a.hidden_states, b.hidden_states, mask, 2)
    _assert_attentions_match(a.attentions, b.attentions, mask, 2)
    assert torch.equal(a.hidden_states[-1], a.last_hidden_state)


@pytest.mark.parametrize("backend", ["math", "sdpa", "chunked"])
def test_hidden_states_and_attentions_match_transformers_modernbert(tmp_path, backend):
    hf = _modern(tmp_path)
    ours = minibert.BertModel.from_pretrained(tmp_path, attention=backend,
                                              attention_chunk_size=4).eval()
    assert ours.config.global_every == 2 and ours.final_norm is not None
    a, b, mask = _both(ours, hf)
    _assert_states_match(a.hidden_states, b.hidden_states, mask, 3)
    _assert_attentions_match(a.attentions, b.attentions, mask, 3)
    # layer 1 is local: a query 10 sees keys 6..14 only (the window of 8, 4 on each side)
    assert not a.attentions[1][0, :, 10, :6].any() and a.attentions[1][0, :, 10, 6:15].all()
    # the last state is after the final LayerNorm, as transformers' is
    assert torch.equal(a.hidden_states[-1], a.last_hidden_state)


HEADS = [("BertForMaskedLM", {}), ("BertForSequenceClassification", {"num_labels": 3}),
         ("BertForTokenClassification", {"num_labels": 3}), ("BertForQuestionAnswering", {}),
         ("ModernBertForMaskedLM", {}), ("ModernBertForTokenClassification", {"num_labels": 3})]


@pytest.mark.parametrize("name,kwargs", HEADS)
def test_every_head_hands_out_what_transformers_hands_out(tmp_path, name, kwargs):
    modern = name.startswith("Modern")
    hf = (_modern if modern else _classic)(tmp_path, name, **kwargs)
    ours = getattr(minibert, name.removeprefix("Modern")).from_pretrained(tmp_path).eval()
    a, b, mask = _both(ours, hf)
    layers = 3 if modern else 2
    _assert_states_match(a.hidden_states, b.hidden_states, mask, layers)
    _assert_attentions_match(a.attentions, b.attentions, mask, layers)


def test_with_labels_the_heads_still_hand_them_out():
    config = tiny_config()
    ids, mask = _batch()
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    torch.manual_seed(0)
    mlm = minibert.BertForMaskedLM(config).eval()
    out = mlm(ids, mask, labels=labels, output_hidden_states=True)
    plain = mlm(ids, mask, labels=labels)
    assert len(out.hidden_states) == 3 and out.attentions is None
    assert torch.equal(out.loss, plain.loss) and torch.equal(out.logits, plain.logits)
    multi = minibert.BertMultiTask(config, {"a": ("sequence", 2), "b": ("token", 3)}).eval()
    for task in ("a", "b"):
        out = multi(ids, mask, task=task, output_attentions=True, output_hidden_states=True)
        assert len(out.attentions) == 2 and len(out.hidden_states) == 3


def test_nothing_is_handed_out_unless_asked_and_the_outputs_are_unchanged():
    torch.manual_seed(0)
    model = minibert.BertModel(tiny_config()).eval()
    ids, mask = _batch()
    plain = model(ids, mask)
    assert plain.hidden_states is None and plain.attentions is None
    asked = model(ids, mask, output_hidden_states=True, output_attentions=True)
    assert torch.allclose(asked.last_hidden_state, plain.last_hidden_state, atol=1e-6)
    assert torch.equal(asked.pooler_output, plain.pooler_output) or \
        torch.allclose(asked.pooler_output, plain.pooler_output, atol=1e-6)
