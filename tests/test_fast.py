"""`minibert.fast(model)` swaps the CPU kernels into a plain model from outside
(machine/swap.py): in place, the same weights and state_dict, the same losses and gradients
as the plain model. `train()` trains the model as it is given; the scripts call `fast`."""

import ast
import copy
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minibert
from conftest import random_batch, tiny_config
from minibert.machine import kernels, swap

PACKAGE = Path(__file__).resolve().parents[1] / "minibert"


def _pair(**overrides):
    """A plain BertForMaskedLM, and a fast copy of it."""
    torch.manual_seed(0)
    plain = minibert.BertForMaskedLM(tiny_config(**overrides))
    return plain, minibert.fast(copy.deepcopy(plain))


def test_the_textbook_forward_calls_no_kernel():
    """model.py and heads.py read as plain PyTorch: they import nothing of kernels.py."""
    for name in ("model.py", "heads.py"):
        tree = ast.parse((PACKAGE / "model" / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {m for m in imported if m and "kernels" in m}, (name, imported)


def test_fast_swaps_in_place_keeping_the_weights_and_leaving_your_modules_alone():
    class Mine(nn.Module):  # a model of one's own around a minibert encoder
        def __init__(self):
            super().__init__()
            self.mlm = minibert.BertForMaskedLM(tiny_config())
            self.drop = nn.Dropout(0.1)

    torch.manual_seed(0)
    model = Mine()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert minibert.fast(model) is model
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert type(model.drop) is nn.Dropout  # not minibert's: left as it is
    kinds = {type(m) for m in model.mlm.modules()}
    assert {swap.Dropout, swap.FastSelfAttention, swap.TiedLookup, swap.FastMLMHead} <= kinds
    assert nn.Dropout not in kinds
    again = [type(m) for m in minibert.fast(model).modules()]
    assert again == [type(m) for m in model.modules()]  # a second call changes nothing


def test_train_trains_the_model_as_it_is_given(tmp_path):
    """No class of the user's modules is rewritten by `train()`: the model read is the model
    that runs."""
    from engine_utils import collator, tiny_corpus, tiny_model, train_config

    tok, ds = tiny_corpus(tmp_path)
    model = tiny_model(tok, dropout=0.1)
    before = [type(m) for m in model.modules()]
    minibert.train(model, ds, collator(tok), train_config(max_steps=1, warmup=0), tmp_path / "run")
    assert [type(m) for m in model.modules()] == before


@pytest.mark.parametrize("script", ["pretrain_wikitext", "glue"])
def test_the_scripts_train_a_fast_model(script, tmp_path, monkeypatch):
    """The kernels come in where the scripts call `minibert.fast`, just before `train()`."""
    from engine_utils import load_example
    from minibert.training import engine

    seen = []
    real_train = engine.train

    def spy(model, *args, **kwargs):
        seen.append({type(m) for m in model.modules()})
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(engine, "train", spy)
    if script == "pretrain_wikitext":
        from engine_utils import wikitext_folder

        module = load_example(script)
        monkeypatch.setattr(module, "train", spy)
        (tmp_path / "wt").mkdir()
        wikitext_folder(tmp_path / "wt", sizes=(("train", 12), ("valid", 4)))
        argv = ["--data-dir", str(tmp_path / "wt"), "--out", str(tmp_path / "out"),
                "--cache-dir", str(tmp_path / "cache"), "--preset", "tiny", "--vocab-size",
                "100", "--seq-len", "16", "--batch-size", "4", "--max-steps", "1",
                "--eval-batches", "1", "--no-progress", "--precision", "fp32"]
        assert module.main(argv) == 0
    else:
        from minibert.cli import glue
        from test_glue import make_glue

        monkeypatch.setattr(glue, "train", spy)
        tok = minibert.Tokenizer.train_from_iterator(
            [f"the cat {i} sat on the mat {i % 7}" for i in range(200)], vocab_size=80)
        config = minibert.BertConfig.preset("tiny", vocab_size=tok.vocab_size,
                                            pad_token_id=tok.pad_id, hidden_dropout=0.1)
        minibert.BertForMaskedLM(config).save_pretrained(tmp_path / "model", tokenizer=tok)
        argv = ["--init-from", str(tmp_path / "model"), "--out", str(tmp_path / "out"),
                "--glue-dir", str(make_glue(tmp_path / "glue", tasks=("MRPC",), n_train=16,
                                            n_dev=8)),
                "--batch-size", "8", "--seq-len", "32", "--epochs", "1", "--no-progress"]
        assert load_example(script).main(argv) == 0
    assert seen and all({swap.Dropout, swap.FastSelfAttention} <= kinds for kinds in seen)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_fast_model_computes_the_plain_ones_gradients_without_a_vocabulary_temporary(
        precision):
    """Every parameter gets the gradient plain autograd gives (fp32: to rounding; bf16
    autocast: to bf16's precision), with a padded batch, over accumulated backward passes;
    and in fp32 the tied hand-off zero-fills, copies or adds out of place no V x H tensor,
    which is what autograd's sum of the lookup's and the decoder's gradients costs. (Under
    bf16 both ways cast the matrix and its gradient between dtypes, which are copies too.)"""
    from torch.profiler import ProfilerActivity, profile

    plain, fast = _pair(vocab_size=97, hidden_dropout=0.0, attention_dropout=0.0)
    ids, mask = random_batch(vocab=97, pad_from=20)
    ids[0, 5] = 0  # a [PAD] id at an attended position
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, -100)

    def grads(model):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
                torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            for _ in range(2):  # gradient accumulation: the second pass adds to .grad
                model(ids, mask, labels=labels).loss.backward()
        temporaries = [e.name for e in prof.events() if e.input_shapes and
                       e.input_shapes[0] == [97, 32] and e.name in
                       ("aten::add", "aten::copy_", "aten::fill_", "aten::zero_")]
        return dict(model.named_parameters()), temporaries

    want, plain_temporaries = grads(plain)
    got, temporaries = grads(fast)
    if precision == "fp32":
        assert plain_temporaries and not temporaries, (plain_temporaries, temporaries)
    assert fast.bert.embeddings.word.weight.grad.layout == torch.strided
    tol = dict(rtol=1e-5, atol=1e-6) if precision == "fp32" else dict(rtol=2e-2, atol=2e-3)
    for name in want:
        torch.testing.assert_close(got[name].grad, want[name].grad, **tol, msg=name)


def test_the_sparse_head_runs_on_a_round_number_of_rows_with_the_same_loss(monkeypatch):
    """The fast MLM head's rows are rounded up to a multiple of PREDICTION_ROWS (a few block
    sizes repeat, so a long run's heap does not fragment). The padding rows change nothing:
    the loss, the logits of the real rows and every gradient are the plain model's."""
    plain, fast = _pair()
    plain.eval(), fast.eval()  # no dropout: the two compare
    ids = torch.randint(5, 99, (3, 20))
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[2, 7] = ids[0, 2], ids[1, 5], ids[2, 7]  # N = 3
    rows = []
    head_forward = fast.head.forward
    monkeypatch.setattr(fast.head, "forward",
                        lambda h, *a: rows.append(h.shape[0]) or head_forward(h, *a))
    got = fast(ids, labels=labels)
    got.loss.backward()
    assert rows == [kernels.PREDICTION_ROWS] and got.logits.shape == (3, 99)
    want = plain(ids, labels=labels)
    want.loss.backward()
    assert torch.allclose(got.loss, want.loss, atol=1e-6)
    assert torch.allclose(got.logits, want.logits, atol=1e-6)
    for (name, a), b in zip(fast.named_parameters(), plain.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_attention_dropout_on_a_cpu_is_the_formula_with_minibert_dropout(monkeypatch):
    """torch's fused CPU kernels have no dropout, and its fallback draws the mask with
    bernoulli_: the fast layer trains SDPA in fp32, and the math form, through the formula
    with `kernels.dropout` instead (the same numbers for the same seed as that formula).
    Without dropout, and in bf16 (whose fallback keeps the scores in fp32), SDPA stays."""
    from minibert.model.attention import attention_bias, attention_probs

    _, fast = _pair()
    layer = fast.bert.blocks[0].attn
    assert type(layer) is swap.FastSelfAttention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 40, 8, generator=g) for _ in range(3))
    keep = torch.arange(40)[None] < torch.tensor([40, 31])[:, None]
    torch.manual_seed(5)
    ref = kernels.dropout(attention_probs(q, k, attention_bias(keep, 40, None, q.dtype,
                                                               q.device)), 0.1) @ v
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(minibert.model.attention.F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for backend in ("sdpa", "math"):
        layer.backend = backend
        torch.manual_seed(5)
        assert torch.equal(layer.attend(q, k, v, keep, 0.1), ref) and not calls, backend
    layer.backend = "sdpa"
    layer.attend(q, k, v, keep, 0.0)  # evaluation: the fused kernel
    layer.attend(*(t.bfloat16() for t in (q, k, v)), keep, 0.1)
    assert calls == [1, 1]


def test_the_encoder_alone_then_the_head_alone_keep_every_gradient():
    """The lookup and the decoder share a gradient only within one forward of the whole
    model: the encoder run alone (a probe's forward) and then the head alone on other rows
    must each give the plain model's gradients, none handed to a lookup that is gone."""
    plain, fast = _pair(hidden_dropout=0.0, attention_dropout=0.0)
    ids, mask = random_batch()
    h = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    for model in (plain, fast):
        model.bert(ids, mask).last_hidden_state.sum().backward()
        model.head(h, model.bert.embeddings.word.weight).sum().backward()
    for (name, a), b in zip(fast.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_fast_model_saves_and_checkpoints_as_its_plain_class(tmp_path):
    import json

    from minibert.training.state import TrainState

    pytest.importorskip("safetensors")
    _, fast = _pair()
    fast.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    assert type(minibert.BertForMaskedLM.from_pretrained(tmp_path)) is minibert.BertForMaskedLM
    opt = torch.optim.AdamW(fast.parameters())
    saved = TrainState(optimizer=opt, scaler=torch.amp.GradScaler("cpu", enabled=False))
    assert saved.state_dict(fast, minibert.TrainConfig(), {})["model_class"] == "BertForMaskedLM"


def test_a_fast_chunked_model_tiles_through_the_buffers_with_the_plain_results(monkeypatch):
    made = []

    class Counted(kernels.TileBuffers):
        def __init__(self, like):
            made.append(like.shape)
            super().__init__(like)

    monkeypatch.setattr(swap, "TileBuffers", Counted)
    plain, fast = _pair(attention="chunked", attention_chunk_size=8, hidden_dropout=0.0,
                        attention_dropout=0.0)  # the fast dropout draws other masks
    ids, mask = random_batch(B=2, T=20, pad_from=13)
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(2))
                         < 0.3, ids, -100)
    outs = []
    for model in (plain, fast):
        torch.manual_seed(0)
        loss = model(ids, mask, labels=labels).loss
        loss.backward()
        outs.append([loss] + [p.grad for p in model.parameters()])
    assert made  # the fast model's chunked attention ran through the buffers
    for a, b in zip(*outs):  # the other kernels sum in another order (the tests above)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
