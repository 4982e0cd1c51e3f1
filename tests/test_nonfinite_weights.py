"""Weights that hold NaN or infinity are refused where they are loaded, naming the tensor and
the file: a model folder (`from_pretrained`, `SentenceEncoder`, `BertMultiTask`, and every
script that reads one), a training checkpoint resumed or exported.

Each test damages a real file: 64 bytes of 0xFF (a NaN as float32) written over the middle
of a saved model's tensor data, as a bad copy or a bad disk would. Such a folder used to
load silently: embed.py wrote vectors that were all NaN and exited 0, and fine-tuning
exited 1 blaming the learning rate.
"""

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import minibert
from minibert.interop import hf
from minibert.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from minibert.interop.export import export_checkpoint
from minibert.tasks.multitask import BertMultiTask
from minibert.tasks.sentence import SentenceEncoder

from conftest import tiny_config
from engine_utils import WORDS, load_example, quick_runs  # noqa: F401 (fixture)
from script_inputs import SCRIPTS, argv, make_inputs

safetensors_torch = pytest.importorskip("safetensors.torch")


def nan_in_the_middle(file: Path) -> str:
    """Write 64 bytes of 0xFF over the middle of a safetensors file's tensor data, inside one
    tensor; return that tensor's name."""
    data = bytearray(file.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    start = 8 + n
    middle = (len(data) - start) // 2
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if begin <= middle < end:
            assert entry["dtype"] == "F32" and end - begin >= 64
            at = min(middle - middle % 4, end - 64)  # whole floats, inside this tensor
            data[start + at:start + at + 64] = b"\xff" * 64
            file.write_bytes(bytes(data))
            return name
    raise AssertionError(f"no tensor holds the middle of {file}")


def _model_folder(folder: Path, cls=minibert.BertForMaskedLM, **kwargs) -> Path:
    tok = minibert.Tokenizer.train_from_iterator([" ".join(WORDS)] * 5, vocab_size=100,
                                                 min_frequency=1, use_cache=False)
    torch.manual_seed(0)
    cls(tiny_config(vocab_size=tok.vocab_size), **kwargs).save_pretrained(folder, tokenizer=tok)
    return folder


def _said(error: BaseException, tensor: str, file: Path) -> None:
    """The facts the refusal must carry: the tensor, the file, that it is not finite."""
    text = str(error)
    assert type(error).__name__ == "NonFiniteWeightsError"  # a ValueError: exit status 2
    assert tensor in text and str(file) in text and "NaN" in text, text


# ---- model folders ---------------------------------------------------------------------------

def test_from_pretrained_refuses_nan_weights_naming_tensor_and_file(tmp_path):
    folder = _model_folder(tmp_path / "m")
    weights = folder / "model.safetensors"
    tensor = nan_in_the_middle(weights)
    for load in (minibert.BertForMaskedLM.from_pretrained, minibert.BertModel.from_pretrained,
                 SentenceEncoder.from_pretrained,
                 lambda p: BertMultiTask.from_pretrained(p, {"t": ("sequence", 2)})):
        with pytest.raises(ValueError) as e:
            load(folder)
        _said(e.value, tensor, weights)


def test_read_weights_refuses_nan_weights_and_check_weights_reads_headers_only(tmp_path):
    """`read_weights`, which every loader goes through, refuses NaN; `check_weights` is the
    header-only check a script makes early, and leaves the values to that one read."""
    folder = _model_folder(tmp_path / "m")
    tensor = nan_in_the_middle(folder / "model.safetensors")
    with pytest.raises(ValueError) as e:
        hf.read_weights(folder)
    _said(e.value, tensor, folder / "model.safetensors")
    hf.check_weights(folder)  # the header is intact


def test_infinite_weights_in_a_pickled_checkpoint_are_named(tmp_path):
    folder = _model_folder(tmp_path / "m", minibert.BertModel)
    sd = safetensors_torch.load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    name = "encoder.layer.1.output.dense.weight"
    sd[name][3, 5] = -math.inf
    torch.save(sd, folder / "pytorch_model.bin")
    with pytest.raises(ValueError) as e:
        minibert.BertModel.from_pretrained(folder)
    text = str(e.value)
    assert name in text and str(folder / "pytorch_model.bin") in text and "infinit" in text


def test_a_shard_with_nan_weights_is_named(tmp_path):
    folder = _model_folder(tmp_path / "m", minibert.BertModel)
    sd = safetensors_torch.load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    for file, keys in shards.items():
        safetensors_torch.save_file({k: sd[k] for k in keys}, str(folder / file))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    second = folder / "model-00002-of-00002.safetensors"
    tensor = nan_in_the_middle(second)
    with pytest.raises(ValueError) as e:
        minibert.BertModel.from_pretrained(folder)
    _said(e.value, tensor, second)


def test_finite_extremes_and_integer_buffers_load(tmp_path):
    """Only NaN and infinity are refused: the largest finite float is a weight (odd, but
    computable), and integer tensors (transformers' position_ids buffer) have no NaN."""
    folder = _model_folder(tmp_path / "m", minibert.BertModel)
    sd = safetensors_torch.load_file(str(folder / "model.safetensors"))
    sd["pooler.dense.bias"][0] = torch.finfo(torch.float32).max
    sd["embeddings.position_ids"] = torch.arange(64)[None]
    safetensors_torch.save_file(sd, str(folder / "model.safetensors"))
    model = minibert.BertModel.from_pretrained(folder)
    assert model.pooler.bias[0] == torch.finfo(torch.float32).max


# ---- the scripts -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = make_inputs(tmp_path_factory.mktemp("inputs"))
    folder = _model_folder(d / "nan")
    return d, nan_in_the_middle(folder / "model.safetensors")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_refuses_a_model_with_nan_weights_before_writing(script, inputs,
                                                                      tmp_path, capsys):
    """--init-from, --teacher or --model holding NaN weights: one line naming the tensor and
    the file, exit status 2, and nothing written (embed.py wrote NaN vectors and exited 0;
    fine-tuning trained on and exited 1, blaming the learning rate)."""
    inputs, tensor = inputs
    out = tmp_path / "out"
    args = argv(script, inputs, inputs / "nan", out)
    got = load_example(script).main(args)
    err = capsys.readouterr().err.strip()
    assert got == 2 and err.startswith("error: ") and "\n" not in err, (got, err)
    assert tensor in err and str(inputs / "nan" / "model.safetensors") in err, err
    assert not out.exists()


# ---- training checkpoints --------------------------------------------------------------------

def _with_nan(checkpoint: Path, tensor: str) -> None:
    """Re-save `checkpoint` with one NaN in its model's `tensor`, as a run whose weights
    overflowed would have saved it (its sha256 then matches: not damage on disk)."""
    state = load_checkpoint(checkpoint)
    state["model"][tensor].view(-1)[0] = math.nan
    step = int(checkpoint.name.removeprefix("step_"))
    save_checkpoint(checkpoint.parent, step, state)


def test_a_resume_from_a_checkpoint_with_nan_weights_is_refused_naming_it(inputs, tmp_path,
                                                                        capsys):
    """Resumed, every step of such a run is non-finite and skipped, and the run stopped
    after max_bad_steps, blaming the learning rate."""
    inputs, _ = inputs
    script = "finetune_classification"
    out = tmp_path / "out"
    main = load_example(script).main
    assert main(argv(script, inputs, None, out)) == 0
    last = latest_checkpoint(out / "checkpoints")
    tensor = "bert.blocks.0.ffn.up.weight"
    _with_nan(last, tensor)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    got = main(argv(script, inputs, None, out, "--resume", "--max-steps", "2"))
    err = capsys.readouterr().err.strip()
    assert got == 2 and "\n" not in err, (got, err)
    assert tensor in err and str(last / "state.pt") in err and "NaN" in err, err
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_export_refuses_a_checkpoint_with_nan_weights(tmp_path):
    model = minibert.BertForMaskedLM(tiny_config())
    ckpt = save_checkpoint(tmp_path / "checkpoints", 3, {
        "model": model.state_dict(), "model_class": "BertForMaskedLM",
        "model_config": asdict(model.config)})
    tensor = "bert.embeddings.word.weight"
    _with_nan(ckpt, tensor)
    with pytest.raises(ValueError) as e:
        export_checkpoint(ckpt, tmp_path / "export")
    _said(e.value, tensor, ckpt / "state.pt")
    assert not (tmp_path / "export").exists()

