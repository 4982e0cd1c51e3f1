"""The model traced whole: torch.export with dynamic batch and length, ONNX through
onnxruntime, torch.compile without a graph break on a padded batch, and gradient
checkpointing. Each against the eager model, on another shape than the one traced."""

import importlib.util

import pytest
import torch
from torch.export import Dim

import minibert
from facts import raises

HEADS = [("BertModel", {}), ("BertForMaskedLM", {}),
         ("BertForSequenceClassification", {"num_labels": 3}),
         ("BertForTokenClassification", {"num_labels": 3}), ("BertForQuestionAnswering", {})]
TOL = 1e-5


def _config(preset="tiny", **overrides):
    return minibert.BertConfig.preset(preset, vocab_size=99, max_position_embeddings=64,
                                      **overrides)


def _model(name, kwargs, preset="tiny", **overrides):
    torch.manual_seed(0)
    return getattr(minibert, name)(_config(preset, **overrides), **kwargs).eval()


def _batch(B, T, pad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if pad:
        mask[0, T // 2:] = 0  # a padded row first, a full one after it
        ids[mask == 0] = 0
    return ids, mask


def _tensors(out):
    return {name: t for name, t in out.items() if isinstance(t, torch.Tensor)}


def _assert_equal_outputs(got, want, tol=TOL):
    got, want = _tensors(got), _tensors(want)
    assert got.keys() == want.keys() and want
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert (got[name] - want[name]).abs().max().item() <= tol, name


def _dims(n):
    batch, length = Dim("batch"), Dim("length", max=64)
    return tuple({0: batch, 1: length} for _ in range(n))


@pytest.mark.parametrize("name,kwargs", HEADS)
def test_every_model_exports_with_dynamic_batch_and_length(name, kwargs):
    model = _model(name, kwargs)
    program = torch.export.export(model, _batch(2, 9), dynamic_shapes=_dims(2))
    for ids, mask in (_batch(3, 17, seed=1), _batch(1, 5, pad=False, seed=2)):
        with torch.no_grad():
            _assert_equal_outputs(program.module()(ids, mask), model(ids, mask))


@pytest.mark.parametrize("name,kwargs", [HEADS[0], HEADS[3]])
def test_a_modern_model_exports_with_its_windows_and_rotations(name, kwargs):
    model = _model(name, kwargs, "modernbert-tiny", local_window=4, global_every=2)
    program = torch.export.export(model, _batch(2, 9), dynamic_shapes=_dims(2))
    ids, mask = _batch(3, 23, seed=1)
    with torch.no_grad():
        _assert_equal_outputs(program.module()(ids, mask), model(ids, mask))


@pytest.mark.parametrize("preset,overrides", [
    ("tiny", {}), ("modernbert-tiny", {"local_window": 4, "global_every": 2})])
def test_a_chunked_model_exports_with_a_dynamic_length(preset, overrides):
    """Chunked attention loops over tiles in Python, which a traced length cannot drive;
    the exported program takes the plain path, and agrees with eager's tiles (tiles of 4,
    so both lengths below span several, and the window cuts some)."""
    model = _model("BertModel", {}, preset, attention="chunked", attention_chunk_size=4,
                   **overrides)
    program = torch.export.export(model, _batch(2, 9), dynamic_shapes=_dims(2))
    for ids, mask in (_batch(3, 17, seed=1), _batch(1, 6, seed=2)):
        with torch.no_grad():
            _assert_equal_outputs(program.module()(ids, mask), model(ids, mask))


def test_a_model_exports_without_a_mask():
    model = _model("BertModel", {})
    program = torch.export.export(model, _batch(2, 9, pad=False)[:1], dynamic_shapes=_dims(1))
    ids, _ = _batch(4, 30, pad=False, seed=3)
    with torch.no_grad():
        _assert_equal_outputs(program.module()(ids), model(ids))


def test_eager_calls_keep_their_input_errors():
    """The value checks are left out of traced graphs only; an eager call still refuses."""
    model = _model("BertForSequenceClassification", {"num_labels": 3})
    ids, mask = _batch(2, 9)
    with raises(ValueError, "vocab_size=99", "values from"):
        model(ids + 200, mask)
    with raises(ValueError, "position 0"):
        model(ids, mask.flip(-1))
    with raises(ValueError, "outside the 3 classes"):
        model(ids, mask, labels=torch.tensor([0, 7]))


_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))


@pytest.mark.skipif(not _ONNX, reason="the [onnx] extra is not installed")
@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
def test_onnx_export_runs_in_onnxruntime_equal_to_eager(tmp_path, preset):
    import onnxruntime

    model = _model("BertForSequenceClassification", {"num_labels": 3}, preset)
    program = torch.onnx.export(model, _batch(2, 9), dynamo=True, dynamic_shapes=_dims(2),
                                input_names=["input_ids", "attention_mask"],
                                output_names=["logits"])
    program.save(str(tmp_path / "model.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    ids, mask = _batch(3, 17, seed=1)
    (logits,) = session.run(["logits"], {"input_ids": ids.numpy(),
                                         "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = model(ids, mask).logits
    assert logits.shape == (3, 3)
    assert (torch.from_numpy(logits) - want).abs().max().item() <= TOL


def _loss(out):
    return out.loss if out.loss is not None else out.logits.float().square().mean()


def _grads(model):
    return {n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("name,kwargs,labels,preset", [
    ("BertForMaskedLM", {}, "mlm", "tiny"),
    ("BertForSequenceClassification", {"num_labels": 3}, "sequence", "tiny"),
    ("BertForTokenClassification", {"num_labels": 3}, "token", "tiny"),
    ("BertForMaskedLM", {}, "mlm", "modernbert-tiny")])
def test_compile_traces_a_padded_training_step_whole(name, kwargs, labels, preset):
    """fullgraph=True: a graph break would be an error. aot_eager runs torch.compile's
    tracing and its autograd, without the code generation that takes a minute on a CPU;
    benchmarks/bench_compile.py times the real compiler."""
    torch._dynamo.reset()
    model = _model(name, kwargs, preset, hidden_dropout=0.0, attention_dropout=0.0).train()
    ids, mask = _batch(3, 12)
    y = {"mlm": torch.where(torch.arange(12) % 4 == 1, ids, -100),
         "sequence": torch.tensor([0, 2, 1]), "token": torch.randint(0, 3, (3, 12))}[labels]
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    got = compiled(ids, mask, labels=y)
    _loss(got).backward()
    got_grads = _grads(model)
    model.zero_grad()
    want = model(ids, mask, labels=y)
    _loss(want).backward()
    _assert_equal_outputs(got, want)
    for n, g in _grads(model).items():
        assert (got_grads[n] - g).abs().max().item() <= TOL, n


def test_compile_traces_the_probing_outputs_too():
    torch._dynamo.reset()
    model = _model("BertModel", {})
    ids, mask = _batch(2, 10)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        got = compiled(ids, mask, output_hidden_states=True, output_attentions=True)
        want = model(ids, mask, output_hidden_states=True, output_attentions=True)
    for a, b in zip(got.hidden_states + got.attentions, want.hidden_states + want.attentions):
        assert (a - b).abs().max().item() <= TOL


def test_default_compile_breaks_only_at_the_sparse_head_s_gathers():
    """What docs/research.md says of torch.compile's defaults: the masked LM given labels
    breaks the graph twice, at its gathers of the N predicted rows (`aten.nonzero`, whose
    output shape depends on the mask's values), and a classifier's step not at all; with
    fullgraph=True the masked LM is one graph, which a new N does not recompile."""
    from torch._dynamo.testing import CompileCounter

    ids, mask = _batch(3, 12)
    labels = torch.where(torch.arange(12) % 4 == 1, ids, -100)
    torch._dynamo.reset()
    mlm = _model("BertForMaskedLM", {}, hidden_dropout=0.0, attention_dropout=0.0).train()
    report = torch._dynamo.explain(mlm)(ids, mask, labels=labels)
    assert report.graph_break_count == 2
    assert all("nonzero" in str(b.reason) for b in report.break_reasons)
    clf = _model("BertForSequenceClassification", {"num_labels": 3}).train()
    assert torch._dynamo.explain(clf)(ids, mask, labels=torch.tensor([0, 2, 1])
                                      ).graph_break_count == 0
    torch._dynamo.reset()
    counter = CompileCounter()
    whole = torch.compile(mlm, backend=counter, fullgraph=True)
    for k in (2, 3, 4):  # N = 6, 5, 4 labelled real tokens
        whole(ids, mask, labels=torch.where(torch.arange(12) % k == 1, ids, -100))
    assert counter.frame_count == 1


@pytest.mark.parametrize("preset,backend", [("tiny", "sdpa"), ("tiny", "chunked"),
                                            ("modernbert-tiny", "math")])
@pytest.mark.parametrize("name,kwargs", [HEADS[1], HEADS[2]])
def test_gradient_checkpointing_gives_the_same_gradients(name, kwargs, preset, backend):
    """With dropout on: the recomputed forward draws the same masks (the random state is
    put back), so every gradient is bit for bit the plain step's."""
    ids, mask = _batch(3, 16)
    y = torch.where(torch.arange(16) % 3 == 1, ids, -100) if name == "BertForMaskedLM" \
        else torch.tensor([0, 2, 1])
    grads = []
    for on in (False, True):
        model = _model(name, kwargs, preset, attention=backend, attention_chunk_size=8,
                       hidden_dropout=0.1, attention_dropout=0.1).train()
        if on:
            model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing == on
        torch.manual_seed(1)
        out = model(ids, mask, labels=y)
        out.loss.backward()
        grads.append((out.loss.detach(), _grads(model)))
    (loss_a, a), (loss_b, b) = grads
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(a[n], b[n]) for n in a), [n for n in a if not torch.equal(a[n], b[n])]
    assert any(g.abs().sum() > 0 for g in a.values())


def test_gradient_checkpointing_switches_every_encoder_and_keeps_nothing_between_blocks():
    model = minibert.BertMultiTask(_config(), {"a": ("sequence", 2)})
    model.gradient_checkpointing_enable()
    assert model.bert.gradient_checkpointing and model.is_gradient_checkpointing
    model.gradient_checkpointing_disable()
    assert not model.bert.gradient_checkpointing
    # Under checkpointing a block's forward keeps none of its activations for backward:
    # the graph holds only what enters each block.
    saved = []
    for on in (False, True):
        m = _model("BertModel", {}, hidden_dropout=0.0, attention_dropout=0.0).train()
        if on:
            m.gradient_checkpointing_enable()
        count = [0]
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: count.__setitem__(0, count[0] + 1) or t, lambda t: t):
            m(*_batch(2, 8)).last_hidden_state.sum()
        saved.append(count[0])
    assert saved[1] < saved[0] / 2, saved


# Each head and each architecture once, which every path of the trace goes through.
@pytest.mark.parametrize("preset,head", [("tiny", "BertForSequenceClassification"),
                                         ("modernbert-tiny", "BertForMaskedLM")])
def test_compile_traces_a_fast_training_step_with_dropout_whole(preset, head):
    """Dropout on, as the presets train, and the CPU kernels swapped in, as the scripts do
    before compiling: the traced graph takes torch's dropout and plain autograd (minibert's
    CPU mask draws random bits in a way dynamo cannot trace), and breaks nowhere."""
    torch._dynamo.reset()
    classify = head == "BertForSequenceClassification"
    model = minibert.fast(_model(head, {"num_labels": 3} if classify else {}, preset,
                                 hidden_dropout=0.1, attention_dropout=0.1).train())
    model.gradient_checkpointing_enable()
    ids, mask = _batch(3, 12)
    labels = torch.tensor([0, 2, 1]) if classify else torch.where(mask.bool(), ids, -100)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    out = compiled(ids, mask, labels=labels)
    out.loss.backward()
    weight = model.classifier.weight if classify else model.bert.embeddings.word.weight
    assert torch.isfinite(out.loss) and weight.grad.abs().sum() > 0


def test_from_pretrained_gives_the_model_in_eval_mode(tmp_path):
    pytest.importorskip("safetensors")
    _model("BertForSequenceClassification", {"num_labels": 3},
           hidden_dropout=0.1).save_pretrained(tmp_path)
    model = minibert.BertForSequenceClassification.from_pretrained(tmp_path)
    assert not model.training
    ids, mask = _batch(2, 9)
    with torch.no_grad():
        assert torch.equal(model(ids, mask).logits, model(ids, mask).logits)
