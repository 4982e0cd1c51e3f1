"""Model behaviour that needs no reference library: invariances, training, and bad input."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

import minibert
from minibert.interop.hf import config_to_hf
from conftest import random_batch, tiny_config
from facts import raises

BACKENDS = ["math", "sdpa", "chunked"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_does_not_change_real_tokens(backend, norm):
    torch.manual_seed(0)
    model = minibert.BertModel(tiny_config(attention=backend, norm_position=norm,
                                           attention_chunk_size=8)).eval()
    ids, _ = random_batch(B=2, T=21)
    padded = torch.cat([ids, torch.zeros(2, 14, dtype=torch.long)], dim=1)  # (2, 35)
    mask = torch.cat([torch.ones(2, 21), torch.zeros(2, 14)], dim=1).long()
    with torch.no_grad():
        a = model(ids).last_hidden_state
        full = model(padded, mask).last_hidden_state
    assert (a - full[:, :21]).abs().max() <= 1e-5
    assert (full[:, 21:] == 0).all()  # padding positions are not computed (unpadding)


def test_sparse_mlm_head_matches_dense_loss_and_gradients():
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(tiny_config(hidden_dropout=0.0, attention_dropout=0.0))
    ids, mask = random_batch(pad_from=30)
    labels = torch.full_like(ids, -100)
    labels[:, 3::5] = ids[:, 3::5]
    labels[1, 30:] = -100
    sparse = model(ids, mask, labels=labels)
    g_sparse = torch.autograd.grad(sparse.loss, list(model.parameters()))
    dense_logits = model(ids, mask).logits  # (B, T, V)
    dense_loss = F.cross_entropy(dense_logits.view(-1, 99), labels.view(-1), ignore_index=-100)
    g_dense = torch.autograd.grad(dense_loss, list(model.parameters()))
    assert abs(sparse.loss.item() - dense_loss.item()) <= 1e-6
    for a, b in zip(g_sparse, g_dense):
        assert (a - b).abs().max() <= 1e-6
    assert sparse.logits.shape == ((labels != -100).sum().item(), 99)


def test_decoder_is_tied_to_word_embeddings():
    model = minibert.BertForMaskedLM(tiny_config())
    n_params = sum(p.numel() for p in model.parameters())
    # 99 x 32 appears once; moving the embedding moves the decoder with it.
    with torch.no_grad():
        model.bert.embeddings.word.weight[5] += 1.0
    ids = torch.tensor([[1, 5, 2]])
    out = model.eval()(ids).logits
    h = model.bert(ids).last_hidden_state
    h = model.head.norm(F.gelu(model.head.dense(h)))
    assert torch.allclose(out, h @ model.bert.embeddings.word.weight.T + model.head.bias)
    assert not any(n.startswith("head") and "weight" in n and p.shape[0] == 99
                   for n, p in model.named_parameters())
    assert n_params == sum(p.numel() for p in set(model.parameters()))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_both_norm_positions_overfit_a_tiny_batch(norm):
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(tiny_config(norm_position=norm, hidden_dropout=0.0,
                                                 attention_dropout=0.0))
    ids, mask = random_batch(B=4, T=16)
    labels = torch.full_like(ids, -100)
    labels[:, 2::3] = ids[:, 2::3]
    masked = ids.masked_fill(labels != -100, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = model(masked, mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_classification_trains_and_regression_uses_mse():
    torch.manual_seed(0)
    clf = minibert.BertForSequenceClassification(tiny_config(), num_labels=3)
    ids, mask = random_batch()
    out = clf(ids, mask, labels=torch.tensor([0, 1, 2]))
    assert out.logits.shape == (3, 3) and out.loss.ndim == 0
    reg = minibert.BertForSequenceClassification(tiny_config(), num_labels=1).eval()
    y = torch.tensor([0.1, 0.2, 0.3])
    out = reg(ids, mask, labels=y)
    assert torch.allclose(out.loss, F.mse_loss(out.logits.squeeze(-1), y))


def test_outputs_unpack_as_the_fields_that_are_set():
    model = minibert.BertForMaskedLM(tiny_config()).eval()
    out = model(torch.tensor([[1, 2, 3]]))
    (logits,) = out.to_tuple()  # no loss without labels, no extras unless asked for by name
    assert out.loss is None and out.hidden_states is None and logits.shape == (1, 3, 99)
    hidden, pooled = minibert.BertModel(tiny_config())(torch.tensor([[1, 2]]), return_dict=False)
    assert hidden.shape == (1, 2, 32) and pooled.shape == (1, 32)


def test_attention_dropout_is_active_in_training_only():
    torch.manual_seed(0)
    for backend in BACKENDS:
        model = minibert.BertModel(tiny_config(attention=backend, hidden_dropout=0.0,
                                               attention_dropout=0.5))
        ids, _ = random_batch()
        a, b = model(ids).last_hidden_state, model(ids).last_hidden_state
        assert not torch.allclose(a, b), backend  # two different dropout draws
        model.eval()
        assert torch.equal(model(ids).last_hidden_state, model(ids).last_hidden_state)


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("make, exc, words", [
    (lambda: torch.rand(2, 5), TypeError, ["integer", "float"]),
    (lambda: torch.ones(2, 5, dtype=torch.bool), TypeError, ["integer"]),
    (lambda: [[1, 2, 3]], TypeError, ["torch.Tensor"]),
    (lambda: torch.ones(5, dtype=torch.long), ValueError, ["2-D", "(5,)"]),
    (lambda: torch.ones(1, 2, 5, dtype=torch.long), ValueError, ["2-D"]),
    (lambda: torch.ones(1, 65, dtype=torch.long), ValueError, ["65", "max_position_embeddings"]),
    (lambda: torch.tensor([[1, 99]]), ValueError, ["vocab_size=99", "99"]),
    (lambda: torch.tensor([[-1, 2]]), ValueError, ["vocab_size", "-1"]),
    # The embedding looks up long or int32 ids alone: another integer type was said to be
    # out of range, or failed in torch's words
    (lambda: torch.tensor([[1, 2]], dtype=torch.uint8), TypeError, ["torch.uint8", ".long()"]),
    (lambda: torch.tensor([[1, 2]], dtype=torch.int16), TypeError, ["torch.int16", ".long()"]),
])
def test_bad_input_ids(make, exc, words):
    model = minibert.BertForMaskedLM(tiny_config())
    with raises(exc, *words):
        model(make())


@pytest.mark.parametrize("shape", [(0, 5), (2, 0), (0, 0)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_input_is_a_clear_error(shape, backend):
    model = minibert.BertForMaskedLM(tiny_config(attention=backend))
    ids = torch.ones(shape, dtype=torch.long)
    with raises(ValueError, "input_ids", "empty", str(shape)):
        model(ids, torch.ones(shape, dtype=torch.long))


def test_bad_masks_and_labels():
    model = minibert.BertForMaskedLM(tiny_config())
    ids = torch.ones(2, 5, dtype=torch.long)
    # each names the argument, the shape or values it got, and what it must be
    with raises(ValueError, "attention_mask", "(2, 4)", "(2, 5)"):
        model(ids, attention_mask=torch.ones(2, 4))
    with raises(ValueError, "token_type_ids", "(1, 5)", "(2, 5)"):
        model(ids, token_type_ids=torch.zeros(1, 5, dtype=torch.long))
    with raises(ValueError, "token_type_ids", "type_vocab_size=2"):
        model(ids, token_type_ids=torch.full((2, 5), 2))
    for dtype in (torch.uint8, torch.float32):
        with raises(TypeError, "token_type_ids", str(dtype), ".long()"):
            model(ids, token_type_ids=torch.zeros(2, 5, dtype=dtype))
    with raises(ValueError, "labels", "(2, 4)", "(2, 5)"):
        model(ids, labels=torch.ones(2, 4, dtype=torch.long))
    clf = minibert.BertForSequenceClassification(tiny_config(), num_labels=3)
    with raises(TypeError, "labels", "integer", "num_labels=3", "torch.float32"):
        clf(ids, labels=torch.tensor([0.0, 1.0]))
    with raises(ValueError, "labels", "(2, 1)", "(2,)"):
        clf(ids, labels=torch.tensor([[0], [1]]))
    with raises(ValueError, "labels", "(2, 3)", "(2,)", "multi-label"):  # not supported
        clf(ids, labels=torch.tensor([[0, 1, 1], [1, 0, 0]]))
    with pytest.raises(ValueError, match="num_labels"):
        minibert.BertForSequenceClassification(tiny_config(), num_labels=0)


@pytest.mark.parametrize("pad, said", [
    (-10000.0, ["-10000.0", "1 = token, 0 = padding", "additive", "(mask == 0)"]),
    (float("-inf"), ["-inf", "additive", "(mask == 0)"]),
    (float("nan"), ["nan", "1 = token, 0 = padding"]),
    (2.0, ["2.0", "1 = token, 0 = padding"]),
])
def test_a_mask_in_another_form_is_refused_not_inverted(pad, said):
    """transformers' additive mask (0 keep, a large negative number at padding) read as
    1 = token would attend to the padding alone; a NaN was read as a token."""
    ids, _ = random_batch(B=2, T=6)
    mask = torch.zeros(2, 6)
    mask[1, 4:] = pad  # row 1's last two positions, in that form
    if pad == 2.0 or pad != pad:  # 2 and NaN beside 1s and 0s: another number in a 0/1 mask
        mask = torch.ones(2, 6)
        mask[1, 4] = pad
    models = [minibert.BertModel(tiny_config()),
              minibert.BertForSequenceClassification(tiny_config(), 3)]  # reads position 0
    for model in models:
        with raises(ValueError, "attention_mask", *said):
            model(ids, mask)
    for ok in (torch.ones(2, 6), torch.ones(2, 6, dtype=torch.long),
               torch.ones(2, 6, dtype=torch.bool)):  # the forms the docs name
        ok[1, 4:] = 0
        for model in models:
            model(ids, ok)


def test_from_pretrained_missing_directory_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        minibert.BertModel.from_pretrained(missing)
    missing.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        minibert.BertModel.from_pretrained(missing)


def test_from_pretrained_corrupt_config_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 32, ')
    with raises(ValueError, str(tmp_path / "config.json"), "JSON"):
        minibert.BertModel.from_pretrained(tmp_path)


def test_from_pretrained_without_weights_lists_what_it_looked_for(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(tiny_config())))
    with raises(FileNotFoundError, str(tmp_path), "model.safetensors", "pytorch_model.bin"):
        minibert.BertModel.from_pretrained(tmp_path)


class _Exploit:
    """Unpickling this would create a file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_object_in_checkpoint_is_refused_without_running_it(tmp_path):
    model = minibert.BertModel(tiny_config())
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(model.config)))
    marker = tmp_path / "pwned"
    sd = dict(model.state_dict())
    sd["evil"] = _Exploit(str(marker))
    torch.save(sd, tmp_path / "pytorch_model.bin")
    # the file, what it holds, and the safe format to save it in
    with raises(ValueError, str(tmp_path / "pytorch_model.bin"), "pickled objects",
                "safetensors"):
        minibert.BertModel.from_pretrained(tmp_path)
    assert not marker.exists()


def test_checkpoint_with_other_shapes_or_too_few_layers(tmp_path):
    pytest.importorskip("safetensors")
    minibert.BertModel(tiny_config()).save_pretrained(tmp_path)
    # the tensor, both shapes; then the weights missing
    with raises(ValueError, "bert.embeddings.word_embeddings.weight", "(99, 32)", "(50, 32)"):
        minibert.BertModel.from_pretrained(tmp_path, vocab_size=50)
    with raises(ValueError, "encoder weight", "bert.encoder.layer.2."):

        minibert.BertModel.from_pretrained(tmp_path, num_layers=3)


def test_save_pretrained_leaves_no_temporary_files(tmp_path):
    pytest.importorskip("safetensors")
    minibert.BertForMaskedLM(tiny_config()).save_pretrained(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json", "model.safetensors"]


# ---- what reaches the attention kernel --------------------------------------------------------

def _spy_sdpa(monkeypatch) -> list:
    """Record the attn_mask of every F.scaled_dot_product_attention call made by minibert."""
    import minibert.model.attention

    masks, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(minibert.model.attention.F, "scaled_dot_product_attention", spy)
    return masks


def test_sdpa_gets_no_mask_when_nothing_is_padding(monkeypatch):
    """An all-ones attention_mask must reach SDPA as attn_mask=None: on CUDA any mask rules
    out the FlashAttention kernel, and MLMCollator always returns a mask."""
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(tiny_config(attention="sdpa")).eval()
    ids, mask = random_batch(B=2, T=21, pad_from=15)
    masks = _spy_sdpa(monkeypatch)
    with torch.no_grad():
        alone = model(ids[:1], mask[:1]).logits  # all ones: no mask needed
        assert len(masks) == 2 and all(m is None for m in masks)
        masks.clear()
        batch = model(ids, mask).logits  # sequence 1 is padded: the mask must stay
        assert len(masks) == 2 and all(m is not None for m in masks)
    # The unmasked path gives what the masked path gives for the same sequence.
    assert (alone[0] - batch[0]).abs().max() <= 1e-5
