"""SentenceEncoder against an independent reference: transformers' BertModel and tokenizer on
the same folder, pooled by hand with sentence-transformers' formulas."""

import logging
import random

import pytest
import torch
import torch.nn.functional as F

import minibert
from minibert.tasks.sentence import SentenceEncoder, cosine_similarity, nearest

from conftest import hf_config, tiny_config
from facts import raises

transformers = pytest.importorskip("transformers")

WORDS = ("the cat sat on a mat while dogs ran far away from home and birds sang songs "
         "of rain in spring under green trees near rivers").split()
# Lengths from 0 to ~40 words, so every batch of mixed texts is padded; "" is [CLS] [SEP].
TEXTS = ["the cat sat on the mat", "", "Birds sang!", " ".join(WORDS),
         "dogs ran far away from home, under green trees near rivers", "rain",
         "of rain in spring " * 5, "a zebra? unknown words: qxz"]


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) for _ in range(100)]
    return minibert.Tokenizer.train_from_iterator(docs, vocab_size=120, min_frequency=1,
                                                  use_cache=False)


@pytest.fixture(scope="module")
def hf_folder(tok, tmp_path_factory):
    """A transformers BertModel (with its pooler) saved by transformers, and a vocab.txt."""
    folder = tmp_path_factory.mktemp("hf-bert")
    torch.manual_seed(0)
    model = transformers.BertModel(hf_config(tiny_config(vocab_size=tok.vocab_size)))
    model.save_pretrained(folder)
    vocab = sorted(tok.backend.get_vocab().items(), key=lambda kv: kv[1])
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def mlm_folder(tok, tmp_path_factory):
    """A minibert BertForMaskedLM export with its tokenizer, as pretraining's final/."""
    folder = tmp_path_factory.mktemp("minibert-mlm")
    minibert.set_seed(1)
    minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size)).save_pretrained(
        folder, tokenizer=tok)
    return folder


@pytest.fixture(scope="module", params=["hf_folder", "mlm_folder"])
def folder(request):
    return request.getfixturevalue(request.param)


def reference(folder, texts, pooling, max_length=None):
    """sentence-transformers' pooling of transformers' last_hidden_state, in one padded batch."""
    model = transformers.BertModel.from_pretrained(folder).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(folder)
    enc = tokenizer(texts, padding=True, return_tensors="pt", truncation=max_length is not None,
                    max_length=max_length)
    with torch.no_grad():
        h = model(**enc).last_hidden_state  # (N, T, H)
    return st_pool(h, enc["attention_mask"], pooling)


def st_pool(h, attention_mask, pooling):
    """sentence-transformers' Pooling of h (N, T, H) over the real tokens: (N, H)."""
    mask = attention_mask.unsqueeze(-1).expand(h.size()).to(h.dtype)  # (N, T, H)
    if pooling == "mean":
        return (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if pooling == "cls":
        return h[:, 0]
    return h.masked_fill(mask == 0, -1e9).max(1).values  # pooling_mode_max_tokens


def test_hf_reference_really_reads_the_export(mlm_folder):
    # The comparisons below mean something only if transformers loaded these weights.
    ours = minibert.BertForMaskedLM.from_pretrained(mlm_folder)
    ref = transformers.BertModel.from_pretrained(mlm_folder)
    assert torch.equal(ref.embeddings.word_embeddings.weight, ours.bert.embeddings.word.weight)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_matches_transformers_with_sentence_transformers_pooling(folder, pooling):
    enc = SentenceEncoder.from_pretrained(folder, pooling=pooling)
    got = enc.encode(TEXTS, batch_size=3)  # other batches, other padding than the reference
    want = reference(folder, TEXTS, pooling)
    assert got.shape == (len(TEXTS), 32) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_pooling_modes_differ(mlm_folder):
    # A guard on the test above: three poolings giving one answer would hide a wrong branch.
    out = [SentenceEncoder.from_pretrained(mlm_folder, pooling=p).encode(TEXTS)
           for p in ("mean", "cls", "max")]
    assert not torch.allclose(out[0], out[1]) and not torch.allclose(out[0], out[2])


def test_normalize_gives_unit_rows_in_the_reference_direction(hf_folder):
    got = SentenceEncoder.from_pretrained(hf_folder, normalize=True).encode(TEXTS)
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(TEXTS)))
    want = reference(hf_folder, TEXTS, "mean")
    torch.testing.assert_close(got, want / want.norm(dim=1, keepdim=True), atol=1e-5, rtol=0)


def encoders(folder, pooling="mean"):
    """Two encoders on the same weights: built without and with normalisation."""
    return (SentenceEncoder.from_pretrained(folder, pooling=pooling),
            SentenceEncoder.from_pretrained(folder, pooling=pooling, normalize=True))


def assert_not_unit_norm(x):
    # A guard: rows that were unit norm already would make normalising look like a no-op.
    assert not torch.allclose(x.norm(dim=1), torch.ones(len(x)), atol=1e-3)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_per_call_normalize_true_overrides_a_raw_encoder(mlm_folder, pooling):
    raw, _ = encoders(mlm_folder, pooling)
    plain = raw.encode(TEXTS)
    assert_not_unit_norm(plain)
    got = raw.encode(TEXTS, batch_size=3, normalize=True)
    assert got.shape == (len(TEXTS), 32) and got.dtype == torch.float32
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(TEXTS)))
    torch.testing.assert_close(got, F.normalize(plain, dim=-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_per_call_normalize_false_overrides_a_normalising_encoder(mlm_folder, pooling):
    raw, normed = encoders(mlm_folder, pooling)
    got = normed.encode(TEXTS, batch_size=3, normalize=False)
    assert_not_unit_norm(got)
    torch.testing.assert_close(got, raw.encode(TEXTS), atol=1e-5, rtol=0)


def test_default_normalize_follows_the_constructor(hf_folder):
    raw, normed = encoders(hf_folder)
    plain, unit = raw.encode(TEXTS), normed.encode(TEXTS)
    assert_not_unit_norm(plain)
    torch.testing.assert_close(unit, F.normalize(plain, dim=-1), atol=1e-6, rtol=0)
    # None spelled out is the default too.
    torch.testing.assert_close(raw.encode(TEXTS, normalize=None), plain, atol=0, rtol=0)
    torch.testing.assert_close(normed.encode(TEXTS, normalize=None), unit, atol=0, rtol=0)


def test_per_call_normalize_leaves_the_default_unchanged(mlm_folder):
    raw, normed = encoders(mlm_folder)
    plain, unit = raw.encode(TEXTS), normed.encode(TEXTS)
    raw.encode(TEXTS, normalize=True)
    normed.encode(TEXTS, normalize=False)
    assert raw.normalize is False and normed.normalize is True
    torch.testing.assert_close(raw.encode(TEXTS), plain, atol=0, rtol=0)
    torch.testing.assert_close(normed.encode(TEXTS), unit, atol=0, rtol=0)


def test_forward_takes_normalize_per_call_too(mlm_folder, tok):
    raw, normed = encoders(mlm_folder)
    ids = torch.tensor([tok.encode("the cat sat"), tok.encode("dogs ran far")])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = raw.eval()(ids, mask)
        torch.testing.assert_close(normed.eval()(ids, mask, normalize=False), plain)
        torch.testing.assert_close(raw(ids, mask, normalize=True), F.normalize(plain, dim=-1))
        torch.testing.assert_close(normed(ids, mask), F.normalize(plain, dim=-1))


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_normalize_must_be_a_bool_or_none(mlm_folder, tok, value):
    enc = SentenceEncoder.from_pretrained(mlm_folder)
    # the value refused, and the values allowed
    with raises(TypeError, f"normalize={value!r}", "True", "False", "None"):
        enc.encode(TEXTS, normalize=value)
    ids = torch.tensor([tok.encode("the cat sat")])
    with raises(TypeError, f"normalize={value!r}", "True", "False", "None"):
        enc(ids, torch.ones_like(ids), normalize=value)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_result_does_not_depend_on_batch_size(mlm_folder, pooling):
    enc = SentenceEncoder.from_pretrained(mlm_folder, pooling=pooling)
    alone = enc.encode(TEXTS, batch_size=1)  # no padding at all
    for batch_size in (2, 5, 64):
        torch.testing.assert_close(enc.encode(TEXTS, batch_size=batch_size), alone,
                                   atol=1e-5, rtol=0)


def test_rows_follow_input_order(mlm_folder):
    enc = SentenceEncoder.from_pretrained(mlm_folder)
    forward = enc.encode(TEXTS, batch_size=2)
    backward = enc.encode(TEXTS[::-1], batch_size=2)
    torch.testing.assert_close(backward.flip(0), forward, atol=1e-5, rtol=0)
    for i in (0, 3, 7):  # one text on its own is its own row
        torch.testing.assert_close(enc.encode([TEXTS[i]])[0], forward[i], atol=1e-5, rtol=0)


def test_max_length_truncates_as_transformers_does(hf_folder):
    enc = SentenceEncoder.from_pretrained(hf_folder)
    got = enc.encode(TEXTS, max_length=6)
    torch.testing.assert_close(got, reference(hf_folder, TEXTS, "mean", max_length=6),
                               atol=1e-5, rtol=0)
    with raises(ValueError, "max_length=65", "max_position_embeddings=64"):
        enc.encode(TEXTS, max_length=65)


def test_mlm_export_loads_the_encoder_only_without_warnings(mlm_folder, caplog):
    with caplog.at_level(logging.WARNING):
        enc = SentenceEncoder.from_pretrained(mlm_folder, pooling="cls")
    assert [r for r in caplog.records if r.name.startswith("minibert")] == []
    assert enc.model.pooler is None and isinstance(enc.model, minibert.BertModel)


def test_encode_runs_in_eval_mode_and_restores_the_mode(mlm_folder):
    enc = SentenceEncoder.from_pretrained(mlm_folder, hidden_dropout=0.5, attention_dropout=0.5)
    enc.train()
    first = enc.encode(TEXTS)
    torch.testing.assert_close(enc.encode(TEXTS), first, atol=0, rtol=0)  # no dropout
    assert enc.training and first.grad_fn is None
    assert not enc.encode(TEXTS).requires_grad


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_forward_trains_with_the_gradients_transformers_computes(mlm_folder, tok, pooling):
    """Trained through its forward (pooled, normalised), the encoder's weights get the
    gradient transformers' BertModel gives the same weights, pooled as sentence-transformers
    pools and normalised: checked in float64 on a padded batch, for the word embeddings and
    every encoder weight."""
    enc = SentenceEncoder.from_pretrained(mlm_folder, pooling=pooling, normalize=True).double()
    hf = transformers.BertModel.from_pretrained(mlm_folder, add_pooling_layer=False).double()
    rows = [tok.encode("the cat sat"), tok.encode("dogs ran far away from home")]
    T = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_id] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    weights = torch.randn(2, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    out = enc(ids, mask)  # (B, H)
    (out * weights).sum().backward()
    h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    want = F.normalize(st_pool(h, mask, pooling), dim=-1)
    (want * weights).sum().backward()

    assert out.shape == (2, 32)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-12)
    ours = enc.model.embeddings.word.weight.grad
    theirs = hf.embeddings.word_embeddings.weight.grad
    assert ours.abs().max() > 0  # the gradient checked is not all zeros
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(enc.model.blocks[0].attn.qkv.weight.grad, torch.cat(
        [getattr(hf.encoder.layer[0].attention.self, n).weight.grad
         for n in ("query", "key", "value")]), rtol=1e-7, atol=1e-12)


def test_empty_list_gives_zero_rows(mlm_folder):
    assert SentenceEncoder.from_pretrained(mlm_folder).encode([]).shape == (0, 32)


def test_bad_arguments(mlm_folder, tok):
    with raises(ValueError, "pooling='sum'", "mean", "cls", "max"):
        SentenceEncoder.from_pretrained(mlm_folder, pooling="sum")
    enc = SentenceEncoder.from_pretrained(mlm_folder)
    with raises(ValueError, "pooling='pooler'", "mean", "cls", "max"):
        SentenceEncoder(enc.model, tok, pooling="pooler")
    with pytest.raises(TypeError, match="list of strings"):
        enc.encode("one text")
    with pytest.raises(ValueError, match="batch_size=0"):
        enc.encode(TEXTS, batch_size=0)


def test_folder_without_tokenizer_or_mismatched_tokenizer(tmp_path, tok):
    minibert.BertModel(tiny_config(vocab_size=tok.vocab_size)).save_pretrained(tmp_path / "a")
    with raises(FileNotFoundError, str(tmp_path / "a"), "tokenizer"):
        SentenceEncoder.from_pretrained(tmp_path / "a")
    minibert.BertModel(tiny_config(vocab_size=50)).save_pretrained(tmp_path / "b", tokenizer=tok)
    with raises(ValueError, f"{tok.vocab_size} ids", "vocab_size", "50"):  # both sizes
        SentenceEncoder.from_pretrained(tmp_path / "b")
    with raises(FileNotFoundError, str(tmp_path / "missing")):
        SentenceEncoder.from_pretrained(tmp_path / "missing")


def test_pre_ln_export_pools_its_own_encoder(tmp_path, tok):
    # Pre-LN is minibert-only, so the reference is the in-memory model's encoder.
    minibert.set_seed(2)
    model = minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size, norm_position="pre"))
    model.save_pretrained(tmp_path, tokenizer=tok)
    ids = torch.tensor([tok.encode(TEXTS[3])])
    with torch.no_grad():
        want = model.eval().bert(ids).last_hidden_state.mean(1)  # one text: no padding
    got = SentenceEncoder.from_pretrained(tmp_path).encode([TEXTS[3]])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_similarity_helpers():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g)
    want = torch.nn.functional.cosine_similarity(a[:, None], b[None], dim=-1)  # (3, 5)
    torch.testing.assert_close(cosine_similarity(a, b), want)
    torch.testing.assert_close(SentenceEncoder.similarity(a[0], b), want[:1])
    scores, idx = nearest(a, b, k=2)
    assert idx.tolist() == want.argsort(dim=1, descending=True)[:, :2].tolist()
    torch.testing.assert_close(scores, want.gather(1, idx))
    assert nearest(a, b, k=10)[1].shape == (3, 5)
    with pytest.raises(ValueError, match="k=0"):
        nearest(a, b, k=0)


def test_the_encoder_keeps_the_mode_of_the_model_it_wraps(mlm_folder, tok):
    """Wrapping a model in eval mode must not turn on its dropout: `encode` restores the
    mode it found, which is the wrapped model's, and `from_pretrained` gives an encoder
    ready for inference, as transformers' from_pretrained does."""
    model = minibert.BertModel(tiny_config(vocab_size=tok.vocab_size, hidden_dropout=0.5),
                               add_pooler=False).eval()
    encoder = minibert.SentenceEncoder(model, tok)
    assert not encoder.training
    encoder.encode(["the cat sat"])
    assert not model.training
    loaded = minibert.SentenceEncoder.from_pretrained(mlm_folder)
    assert not loaded.training
    ids = torch.tensor([tok.encode("the cat sat")])
    mask = torch.ones_like(ids)
    assert torch.equal(loaded(ids, mask), loaded(ids, mask))


def test_cls_pooling_refuses_a_batch_padded_on_the_left(tok):
    """[CLS] pooling reads position 0, padding in a left-padded row (a zero vector). The
    encoder has no pooler, as `from_pretrained` builds it: a pooler reads position 0 too,
    and refuses such a batch itself."""
    model = minibert.BertModel(tiny_config(vocab_size=tok.vocab_size), add_pooler=False)
    ids = torch.randint(5, tok.vocab_size, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with raises(ValueError, "attention_mask", "position 0", "[1]"):

        minibert.SentenceEncoder(model, tok, pooling="cls")(ids, mask)
    minibert.SentenceEncoder(model, tok, pooling="mean")(ids, mask)  # mean pooling: fine
