"""The modern encoder's switches (ModernBERT, Warner et al. 2024), each against an
independent reference: transformers' ModernBERT on the same weights both ways, the formula
for GeGLU, and a loop over queries for the sliding window."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import minibert
from facts import raises
from minibert.model.attention import attention
from minibert.interop.hf import config_to_hf

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def _hf_config(**overrides):
    fields = dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=64, local_attention=8,
                  global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                  cls_token_id=2, sep_token_id=3, attn_implementation="eager")
    fields.update(overrides)
    return transformers.ModernBertConfig(**fields)


def _perturbed(model):
    """Random norms and biases too, so that a norm or bias read into the wrong place shows,
    and matrices large enough that attention is far from uniform, so that positions (RoPE,
    the window) change the outputs."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g) if name.endswith(
                    "weight") else 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _batch(T=21, B=3, vocab=99):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 13:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    return ids, mask


def _close_at_real(ours, theirs, mask, tol=1e-4):
    keep = mask.bool()
    assert (ours[keep] - theirs[keep]).abs().max().item() <= tol


CLASSES = [("BertForMaskedLM", "ModernBertForMaskedLM", {}),
           ("BertForSequenceClassification", "ModernBertForSequenceClassification",
            {"num_labels": 3}),
           ("BertForTokenClassification", "ModernBertForTokenClassification", {"num_labels": 3})]


@pytest.mark.parametrize("ours,theirs,kwargs", CLASSES)
@pytest.mark.parametrize("backend", ["math", "sdpa", "chunked"])
def test_transformers_modernbert_loads_with_the_same_outputs(tmp_path, ours, theirs, kwargs,
                                                            backend):
    torch.manual_seed(0)
    hf = _perturbed(getattr(transformers, theirs)(_hf_config(**kwargs)))
    hf.save_pretrained(tmp_path)
    model = getattr(minibert, ours).from_pretrained(tmp_path, attention=backend,
                                                    attention_chunk_size=4).eval()
    assert model.config.position == "rope" and model.config.global_every == 2
    ids, mask = _batch()
    with torch.no_grad():
        a, b = model(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits
    if ours == "BertForSequenceClassification":
        assert (a - b).abs().max().item() <= 1e-4
    else:
        _close_at_real(a, b, mask)


@pytest.mark.parametrize("ours,theirs,kwargs", CLASSES)
def test_a_modern_model_saves_a_folder_transformers_loads(tmp_path, ours, theirs, kwargs):
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=99, local_window=8,
                                        global_every=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = _perturbed(getattr(minibert, ours)(config, **kwargs))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "modernbert"
    hf = getattr(transformers, theirs).from_pretrained(tmp_path, attn_implementation="eager")
    ids, mask = _batch()
    with torch.no_grad():
        a, b = model(ids, mask).logits, hf.eval()(input_ids=ids, attention_mask=mask).logits
    if ours == "BertForSequenceClassification":
        assert (a - b).abs().max().item() <= 1e-4
    else:
        _close_at_real(a, b, mask)
    again = getattr(minibert, ours).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(again(ids, mask).logits, model(ids, mask).logits)


def test_a_modernbert_with_every_bias_on_loads_with_the_same_outputs(tmp_path):
    """transformers' four bias switches all on: minibert's one `bias` switch computes it."""
    torch.manual_seed(0)
    hf = _perturbed(transformers.ModernBertForMaskedLM(_hf_config(
        attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)))
    hf.save_pretrained(tmp_path)
    model = minibert.BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert model.config.bias
    ids, mask = _batch()
    with torch.no_grad():
        _close_at_real(model(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits,
                       mask)
    model.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == \
        "modernbert"


def test_a_bare_modern_encoder_has_no_pooler_and_saves_none():
    """ModernBERT has no tanh pooler: a BertModel with its heads' switch builds none, so its
    folder holds no weight transformers would not know."""
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=99,
                                        max_position_embeddings=64)
    assert minibert.BertModel(config).pooler is None
    assert minibert.BertModel(minibert.BertConfig.preset("tiny", vocab_size=99)).pooler \
        is not None


def test_mean_pooling_needs_the_transform_head():
    with raises(ValueError, "classifier_pooling='mean'", "task_head='transform'"):
        minibert.BertConfig(classifier_pooling="mean")


def test_mean_pooling_classifier_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf = _perturbed(transformers.ModernBertForSequenceClassification(
        _hf_config(num_labels=2, classifier_pooling="mean")))
    hf.save_pretrained(tmp_path)
    model = minibert.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert model.config.classifier_pooling == "mean"
    ids, mask = _batch()
    with torch.no_grad():
        a, b = model(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits
    assert (a - b).abs().max().item() <= 1e-4


@pytest.mark.parametrize("change,named", [
    ({"hidden_activation": "silu"}, "hidden_activation"),
    ({"classifier_activation": "relu"}, "classifier_activation"),
    ({"decoder_bias": False}, "decoder_bias"),
    ({"attention_bias": True}, "bias"),
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention",
                      "sliding_attention"]}, "layer_types"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e4,
                                             "factor": 2.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_type"),
])
def test_what_minibert_cannot_compute_is_refused_by_name(tmp_path, change, named):
    hf_config = _hf_config()
    for key, value in change.items():
        setattr(hf_config, key, value)
    transformers.ModernBertForMaskedLM(_hf_config()).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named):
        minibert.BertForMaskedLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("edit", [
    # the sliding layers' theta missing: transformers takes local_rope_theta's default
    lambda c: c.update(rope_parameters={"full_attention": {"rope_type": "default",
                                                           "rope_theta": 20.0}}),
    # thetas in the legacy keys only
    lambda c: c.update(rope_parameters={"full_attention": {"rope_type": "default"},
                                        "sliding_attention": {"rope_type": "default"}},
                       global_rope_theta=5000.0, local_rope_theta=50.0),
    # transformers' other name for half the window
    lambda c: c.update(sliding_window=3) or c.pop("local_attention"),
], ids=["one-rope-kind", "legacy-thetas", "sliding_window"])
def test_config_keys_transformers_reads_are_read_alike(tmp_path, edit):
    """Each of these configs used to load with other thetas or another window than
    transformers gives the same file: logits off by whole units, without a word."""
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(_hf_config())
    with torch.no_grad():  # attention far from uniform, so that positions matter
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path).eval()
    ours = minibert.BertForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = _batch(T=30)
    with torch.no_grad():
        _close_at_real(ours(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits,
                       mask)


def test_scaled_rope_is_refused_however_it_is_written(tmp_path):
    transformers.ModernBertForMaskedLM(_hf_config()).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with raises(ValueError, "config.json", "rope_scaling", "'linear'"):
        minibert.BertForMaskedLM.from_pretrained(tmp_path)
    config["rope_scaling"] = None
    config["local_attention"], config["sliding_window"] = 8, 5
    (tmp_path / "config.json").write_text(json.dumps(config))
    with raises(ValueError, "local_attention=8", "sliding_window=5"):
        minibert.BertForMaskedLM.from_pretrained(tmp_path)


def test_a_classic_bert_is_unchanged_by_default():
    config = minibert.BertConfig()
    assert (config.position, config.mlp, config.bias, config.global_every,
            config.task_head, config.first_block_attn_norm) == ("learned", "gelu", True, 1,
                                                                "bert", True)
    assert config_to_hf(config)["model_type"] == "bert"


@pytest.mark.parametrize("field,value", [("position", "alibi"), ("mlp", "swiglu"),
                                         ("global_every", 0), ("local_window", 1),
                                         ("rope_theta", 0.0), ("bias", "no"),
                                         ("task_head", "pooler"), ("classifier_pooling", "max"),
                                         ("type_vocab_size", -1)])
def test_modern_switches_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        minibert.BertConfig(**{field: value})


def test_geglu_is_the_formula():
    """GeGLU (Shazeer 2020): (GELU(x W) * (x V)) W_o, W and V the two halves of `up`."""
    config = minibert.BertConfig.preset("tiny", vocab_size=50, mlp="geglu", bias=False)
    ffn = minibert.BertModel(config).blocks[0].ffn
    x = torch.randn(3, 5, config.hidden_size)
    w, v = ffn.up.weight.chunk(2, dim=0)
    expected = (F.gelu(x @ w.T) * (x @ v.T)) @ ffn.down.weight.T
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_without_bias_there_is_no_bias_but_the_decoder_s():
    model = minibert.BertForMaskedLM(minibert.BertConfig.preset("modernbert-tiny",
                                                                vocab_size=50))
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert biases == ["head.bias"]
    assert not any(n.startswith("bert.embeddings.position") for n, _ in model.named_parameters())
    assert model.bert.blocks[0].attn_norm is None and model.bert.blocks[1].attn_norm is not None
    ids = torch.ones(1, 4, dtype=torch.long)
    model(ids, token_type_ids=torch.zeros(1, 4, dtype=torch.long))  # one segment: fine
    with pytest.raises(ValueError, match="token_type_ids"):
        model(ids, token_type_ids=torch.tensor([[0, 0, 1, 1]]))


def _windowed_reference(q, k, v, keep, window):
    """Each query's softmax over the real keys within `window` positions of it, one at a
    time: no masks, no tiles."""
    B, nh, T, hs = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for i in range(T):
            js = [j for j in range(T) if abs(i - j) <= window and (keep is None or keep[b, j])]
            if not js:
                continue
            s = q[b, :, i, None] @ k[b, :, js].transpose(-2, -1) / math.sqrt(hs)  # (nh, 1, n)
            out[b, :, i] = (torch.softmax(s, dim=-1) @ v[b, :, js])[:, 0]  # (nh, hs)
    return out


@pytest.mark.parametrize("backend", ["math", "sdpa", "chunked"])
def test_sliding_window_attention_is_the_loop_over_queries(backend):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, requires_grad=True) for _ in range(3))
    keep = torch.ones(2, 37, dtype=torch.bool)
    keep[1, 29:] = False
    out = attention(q, k, v, keep, backend, chunk_size=4, window=5)
    ref = _windowed_reference(q, k, v, keep, 5)
    real = keep[:, None, :, None].expand_as(out)
    assert torch.allclose(out[real], ref[real], atol=1e-5)
    # Gradients through the real queries only (padding queries' outputs are never used).
    g = torch.randn_like(out) * real
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-4)


def test_chunked_local_attention_skips_the_tiles_outside_the_window(monkeypatch):
    """A local layer's cost grows as T * window, not T^2: count the score tiles computed."""
    import minibert.model.attention as attn

    calls = []
    scores = attn._scores
    monkeypatch.setattr(attn, "_scores", lambda *a, **kw: calls.append(1) or scores(*a, **kw))
    counts = {}
    for T in (64, 128, 256):
        calls.clear()
        x = torch.randn(1, 1, T, 8)
        attention(x, x, x, None, "chunked", chunk_size=8, window=8)
        counts[T] = len(calls)
    assert counts[128] <= 2.1 * counts[64]
    assert counts[256] <= 2.1 * counts[128]
    calls.clear()
    attention(torch.randn(1, 1, 256, 8), torch.randn(1, 1, 256, 8), torch.randn(1, 1, 256, 8),
              None, "chunked", chunk_size=8)
    assert len(calls) == (256 // 8) ** 2  # a global layer visits every tile


def test_a_modern_preset_family():
    base = minibert.BertConfig.preset("modernbert-base")
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == \
        (22, 768, 12, 1152)
    assert (base.local_window, base.global_every, base.rope_theta, base.rope_local_theta) == \
        (128, 3, 160000.0, 10000.0)
    assert config_to_hf(base)["model_type"] == "modernbert"
    mini = minibert.BertConfig.preset("modernbert-mini", vocab_size=8192)
    assert (mini.num_layers, mini.hidden_size) == (4, 256)
    # Only some switches of the family: a minibert-only architecture, refused by transformers.
    hybrid = minibert.BertConfig.preset("mini", position="rope")
    assert config_to_hf(hybrid)["model_type"] == "minibert"


def test_qa_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf = _perturbed(transformers.ModernBertForQuestionAnswering(_hf_config(num_labels=2)))
    hf.save_pretrained(tmp_path)
    model = minibert.BertForQuestionAnswering.from_pretrained(tmp_path).eval()
    ids, mask = _batch()
    with torch.no_grad():
        ours, theirs = model(ids, mask), hf(input_ids=ids, attention_mask=mask)
    _close_at_real(ours.start_logits, theirs.start_logits, mask)
    _close_at_real(ours.end_logits, theirs.end_logits, mask)


def test_flops_count_geglu_and_the_window():
    """GeGLU's third matrix, and a local layer's 2w + 1 keys instead of T."""
    from minibert.machine.meters import flops_per_token

    classic = minibert.BertConfig.preset("tiny", vocab_size=100)
    geglu = classic.replace(mlp="geglu")
    H, I, L = classic.hidden_size, classic.intermediate_size, classic.num_layers
    assert flops_per_token(geglu, 64) - flops_per_token(classic, 64) == 6 * L * H * I
    local = classic.replace(global_every=2, local_window=8)  # layer 1: 9 keys of 64
    assert flops_per_token(classic, 64) - flops_per_token(local, 64) == 12 * H * (64 - 9)


def test_a_mix_of_switches_round_trips_as_a_minibert_only_folder(tmp_path):
    """Rotary positions on a Post-LN BERT with biases: neither BERT nor ModernBERT. It saves
    and loads with the same outputs, and transformers refuses the folder."""
    config = minibert.BertConfig.preset("tiny", vocab_size=99, position="rope", mlp="geglu",
                                        global_every=2, local_window=8)
    model = _perturbed(minibert.BertForMaskedLM(config))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "minibert"
    again = minibert.BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert again.config == config
    ids, mask = _batch()
    with torch.no_grad():
        assert torch.equal(again(ids, mask).logits, model(ids, mask).logits)
    with pytest.raises((ValueError, KeyError, OSError)):
        transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)


def test_a_stored_decoder_other_than_the_embeddings_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    transformers.ModernBertForMaskedLM(_hf_config()).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    words = weights["model.embeddings.tok_embeddings.weight"]
    save_file({**weights, "decoder.weight": words + 0.1}, str(tmp_path / "model.safetensors"))
    with raises(ValueError, "decoder.weight", "model.embeddings.tok_embeddings.weight"):

        minibert.BertForMaskedLM.from_pretrained(tmp_path)
