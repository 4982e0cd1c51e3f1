"""Model folders on disk: atomic saves, damaged or hostile files, exporting training checkpoints.

Each test builds the bad situation for real (a crash injected mid-save, random bytes in a
weights file, an index pointing outside the folder) and checks that minibert either keeps
the previous state intact or refuses with one message that names the file.
"""

import json
import os
from dataclasses import asdict

import pytest
import torch

import minibert
import minibert.atomic
import minibert.interop.hf as hf
from conftest import random_batch, tiny_config
from facts import raises
from minibert.training.checkpoint import save_checkpoint
from minibert.interop.export import export_checkpoint
from minibert.interop.hf import config_to_hf

safetensors_torch = pytest.importorskip("safetensors.torch")


def _random_model(cls=minibert.BertForMaskedLM, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = cls(tiny_config(), **kwargs).eval()
    with torch.no_grad():  # values far from the initialisation, so a stale tensor shows
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _hidden_entries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---- A. save_pretrained replaces the whole folder or nothing -------------------------------

def _fail_writing_weights(monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full (injected)")
    monkeypatch.setattr(safetensors_torch, "save_file", broken)


def _fail_writing_config(monkeypatch):
    real = json.dumps

    def broken(obj, *args, **kwargs):
        if isinstance(obj, dict) and "hidden_size" in obj:
            raise OSError("disk full (injected)")
        return real(obj, *args, **kwargs)
    monkeypatch.setattr(json, "dumps", broken)


def _fail_moving_into_place(monkeypatch):
    # The old folder steps aside, then the second rename, which would move the new folder
    # into place, fails.
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError("power cut (injected)")
        return real(src, dst)
    monkeypatch.setattr(os, "rename", rename)


@pytest.mark.parametrize("crash", [_fail_writing_weights, _fail_writing_config,
                                   _fail_moving_into_place])
def test_a_failed_save_leaves_the_old_export_intact(crash, tmp_path, monkeypatch):
    old, new = _random_model(seed=0), _random_model(seed=1)
    out = tmp_path / "final"
    old.save_pretrained(out)
    (out / "tokenizer.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    crash(monkeypatch)
    with pytest.raises(OSError, match="injected"):
        new.save_pretrained(out)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _same_weights(minibert.BertForMaskedLM.from_pretrained(out), old)
    assert _hidden_entries(tmp_path) == []  # no temporary folders left behind


def test_two_saves_in_a_row_and_files_beside_the_model(tmp_path):
    out = tmp_path / "final"
    _random_model(seed=0).save_pretrained(out)
    (out / "vocab.txt").write_text("[PAD]\n")
    (out / "notes").mkdir()
    (out / "notes" / "run.txt").write_text("lr 1e-4")
    torch.save({"stale": torch.zeros(1)}, out / "pytorch_model.bin")  # an older layout
    second = _random_model(seed=1)
    second.save_pretrained(out)
    assert _same_weights(minibert.BertForMaskedLM.from_pretrained(out), second)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "notes", "vocab.txt"]
    assert (out / "vocab.txt").read_text() == "[PAD]\n"
    assert (out / "notes" / "run.txt").read_text() == "lr 1e-4"
    assert _hidden_entries(tmp_path) == []


def test_save_with_the_tokenizer_in_one_step(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
    tok = minibert.Tokenizer.from_pretrained(tmp_path / "vocab.txt")
    model = _random_model()
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    assert minibert.Tokenizer.from_pretrained(tmp_path / "m").fingerprint == tok.fingerprint
    assert _same_weights(minibert.BertForMaskedLM.from_pretrained(tmp_path / "m"), model)


def _vocab_tokenizer(folder, words):
    """A WordPiece tokenizer of BERT's special tokens and `words`, from a vocab.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
    return minibert.Tokenizer.from_pretrained(folder / "vocab.txt")


def test_a_save_without_a_tokenizer_refuses_the_one_saved_with_the_model_it_replaces(tmp_path):
    """Kept, the old model's tokenizer would load beside the new model without a word (the
    vocabulary record goes with the old config.json): the save is refused, nothing written."""
    out = tmp_path / "final"
    _random_model(seed=0).save_pretrained(out, tokenizer=_vocab_tokenizer(tmp_path / "a",
                                                                          ["the", "cat"]))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    second = _random_model(seed=1)
    with raises(ValueError, str(out), "tokenizer.json", "vocab.txt", "tokenizer="):
        second.save_pretrained(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _hidden_entries(tmp_path) == []
    # With the new model's own tokenizer, the folder is the new pair, recorded as one.
    tok = _vocab_tokenizer(tmp_path / "b", ["a", "dog"])
    second.save_pretrained(out, tokenizer=tok)
    assert minibert.Tokenizer.from_pretrained(out).fingerprint == tok.fingerprint
    assert _same_weights(minibert.BertForMaskedLM.from_pretrained(out), second)


def test_a_tokenizer_saved_into_the_folder_before_the_model_is_kept(tmp_path):
    """transformers' usual order, tokenizer first: it is the user's choice for this model."""
    out = tmp_path / "final"
    _random_model(seed=0).save_pretrained(out, tokenizer=_vocab_tokenizer(tmp_path / "a",
                                                                          ["the", "cat"]))
    tok = _vocab_tokenizer(tmp_path / "b", ["a", "dog"])
    tok.save(out)  # replaces the old model's tokenizer
    second = _random_model(seed=1)
    second.save_pretrained(out)
    assert minibert.Tokenizer.from_pretrained(out).fingerprint == tok.fingerprint
    assert _same_weights(minibert.BertForMaskedLM.from_pretrained(out), second)


def test_a_save_without_a_tokenizer_refuses_one_with_more_ids_than_the_model(tmp_path):
    out = tmp_path / "final"
    _vocab_tokenizer(tmp_path / "big", [f"w{i}" for i in range(120)]).save(out)
    with raises(ValueError, str(out), "tokenizer.json", "125 tokens", "99"):
        _random_model().save_pretrained(out)
    assert sorted(os.listdir(out)) == ["tokenizer.json", "tokenizer_config.json", "vocab.txt"]


def test_a_save_with_a_tokenizer_replaces_every_file_of_the_old_one(tmp_path):
    """transformers' special_tokens_map.json names the old tokenizer's special tokens, which
    AutoTokenizer would read beside the new tokenizer's files."""
    out = tmp_path / "final"
    _random_model(seed=0).save_pretrained(out)
    (out / "special_tokens_map.json").write_text(json.dumps({"unk_token": "<unk>"}))
    (out / "added_tokens.json").write_text(json.dumps({"<new>": 99}))
    (out / "notes.txt").write_text("lr 1e-4")
    _random_model(seed=1).save_pretrained(out, tokenizer=_vocab_tokenizer(tmp_path / "t", []))
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "notes.txt",
                                       "tokenizer.json", "tokenizer_config.json", "vocab.txt"]


def test_leftovers_of_a_killed_save_are_removed_by_the_next(tmp_path):
    (tmp_path / ".final.tmp-dead").mkdir()  # what a kill -9 mid-save leaves
    _random_model().save_pretrained(tmp_path / "final")
    assert _hidden_entries(tmp_path) == []


def test_a_save_killed_between_its_renames_is_recovered_by_the_next(tmp_path):
    # Where the old folder had stepped aside and the new one was not yet in place.
    _random_model(seed=0).save_pretrained(tmp_path / "final")
    (tmp_path / "final" / "vocab.txt").write_text("[PAD]\n")
    os.rename(tmp_path / "final", tmp_path / ".final.old-dead")
    second = _random_model(seed=1)
    second.save_pretrained(tmp_path / "final")
    assert (tmp_path / "final" / "vocab.txt").read_text() == "[PAD]\n"
    assert _same_weights(minibert.BertForMaskedLM.from_pretrained(tmp_path / "final"), second)
    assert _hidden_entries(tmp_path) == []


def test_save_onto_a_file_names_it(tmp_path):
    (tmp_path / "final").write_text("not a folder")
    with pytest.raises(NotADirectoryError, match="final"):
        _random_model().save_pretrained(tmp_path / "final")


# ---- C. damaged and hostile weight files ---------------------------------------------------

def _folder_with(tmp_path, name, data: bytes):
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(tiny_config())))
    (tmp_path / name).write_bytes(data)
    return tmp_path


def _torch_file_bytes(tmp_path) -> bytes:
    torch.save(minibert.BertModel(tiny_config()).state_dict(), tmp_path / "whole.bin")
    return (tmp_path / "whole.bin").read_bytes()


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
def test_damaged_pytorch_model_bin_is_called_damaged(damage, tmp_path):
    whole = _torch_file_bytes(tmp_path)
    data = {"random": os.urandom(4096), "truncated": whole[:len(whole) // 2],
            "empty": b""}[damage]
    (tmp_path / "m").mkdir()
    folder = _folder_with(tmp_path / "m", "pytorch_model.bin", data)
    with raises(ValueError, str(folder / "pytorch_model.bin"), "damaged") as e:
        minibert.BertModel.from_pretrained(folder)
    assert "arbitrary code" not in str(e.value)


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
def test_damaged_safetensors_is_called_damaged(damage, tmp_path):
    minibert.BertModel(tiny_config()).save_pretrained(tmp_path / "src")
    whole = (tmp_path / "src" / "model.safetensors").read_bytes()
    data = {"random": os.urandom(4096), "truncated": whole[:len(whole) // 2],
            "empty": b""}[damage]
    (tmp_path / "m").mkdir()
    folder = _folder_with(tmp_path / "m", "model.safetensors", data)
    with raises(ValueError, str(folder / "model.safetensors"), "damaged"):
        minibert.BertModel.from_pretrained(folder)


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
def test_check_weights_finds_damage(damage, tmp_path):
    """What loading would refuse, said by the check a script makes before writing (NaN
    weights: test_nonfinite_weights.py)."""
    from minibert.interop.hf import check_weights

    minibert.BertModel(tiny_config()).save_pretrained(tmp_path / "src")
    whole = (tmp_path / "src" / "model.safetensors").read_bytes()
    data = {"random": os.urandom(4096), "truncated": whole[:-4], "empty": b""}[damage]
    (tmp_path / "m").mkdir()
    folder = _folder_with(tmp_path / "m", "model.safetensors", data)
    with raises(ValueError, str(folder / "model.safetensors"), "damaged"):
        check_weights(folder)
    check_weights(tmp_path / "src")
    # the folder, and the files looked for in it
    with raises(FileNotFoundError, str(tmp_path), "model.safetensors", "pytorch_model.bin"):
        check_weights(tmp_path)


def test_git_lfs_pointer_is_named_as_such(tmp_path):
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n"
    folder = _folder_with(tmp_path, "model.safetensors", pointer)
    with raises(ValueError, str(folder / "model.safetensors"), "Git LFS", "git lfs pull"):
        minibert.BertModel.from_pretrained(folder)


def _sharded(tmp_path, weight_map=None, index_text=None):
    """A checkpoint folder whose weights are split over two shards and an index."""
    src = tmp_path / "src"
    model = _random_model(minibert.BertModel)
    model.save_pretrained(src)
    sd = safetensors_torch.load_file(str(src / "model.safetensors"))
    names = sorted(sd)
    folder = tmp_path / "sharded"
    (folder / "shards").mkdir(parents=True)
    (folder / "config.json").write_text((src / "config.json").read_text())
    halves = {"model-1.safetensors": names[:10], "shards/model-2.safetensors": names[10:]}
    for file, keys in halves.items():
        safetensors_torch.save_file({k: sd[k] for k in keys}, str(folder / file))
    if weight_map is None:
        weight_map = {k: file for file, keys in halves.items() for k in keys}
    if index_text is None:
        index_text = json.dumps({"metadata": {}, "weight_map": weight_map})
    (folder / "model.safetensors.index.json").write_text(index_text)
    return model, folder


def test_sharded_checkpoint_loads(tmp_path):
    model, folder = _sharded(tmp_path)
    assert _same_weights(minibert.BertModel.from_pretrained(folder), model)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "shards/../../outside.safetensors",
                                   "ABSOLUTE"])
def test_shard_outside_the_folder_is_refused(shard, tmp_path):
    outside = tmp_path / "outside.safetensors"
    safetensors_torch.save_file({"x": torch.zeros(1)}, str(outside))
    shard = str(outside) if shard == "ABSOLUTE" else shard
    _, folder = _sharded(tmp_path, weight_map={"bert.embeddings.word_embeddings.weight": shard})
    with raises(ValueError, str(folder / "model.safetensors.index.json"), repr(shard)):
        minibert.BertModel.from_pretrained(folder)


def test_missing_shard_names_it_and_the_index(tmp_path):
    _, folder = _sharded(tmp_path)
    (folder / "shards" / "model-2.safetensors").unlink()
    with raises(FileNotFoundError, "shards/model-2.safetensors",
                str(folder / "model.safetensors.index.json")):
        minibert.BertModel.from_pretrained(folder)


@pytest.mark.parametrize("index_text", ['{"weight_map": ', '{"metadata": {}}',
                                        '{"weight_map": ["a"]}', '{"weight_map": {"a": 1}}',
                                        '[1, 2]'])
def test_malformed_index_names_the_index(index_text, tmp_path):
    _, folder = _sharded(tmp_path, index_text=index_text)
    with raises(ValueError, str(folder / "model.safetensors.index.json")):
        minibert.BertModel.from_pretrained(folder)


# ---- D. training checkpoints -> model folders ----------------------------------------------

def _training_checkpoint(tmp_path, model, **extra):
    state = {"model": model.state_dict(), "model_config": asdict(model.config),
             "train_config": {"lr": 1e-4}, "step": 7, **extra}
    return save_checkpoint(tmp_path / "checkpoints", 7, state)


@pytest.mark.parametrize("cls_name, extra", [
    ("BertForMaskedLM", {"model_class": "BertForMaskedLM"}),
    ("BertForSequenceClassification", {"model_class": "BertForSequenceClassification"}),
])
def test_export_checkpoint_loads_in_minibert_and_transformers(cls_name, extra, tmp_path):
    transformers = pytest.importorskip("transformers")
    kwargs = {"num_labels": 3} if cls_name == "BertForSequenceClassification" else {}
    model = _random_model(getattr(minibert, cls_name), **kwargs)
    ckpt = _training_checkpoint(tmp_path, model, **extra)
    export_checkpoint(ckpt, tmp_path / "export")
    ours = getattr(minibert, cls_name).from_pretrained(tmp_path / "export").eval()
    theirs = getattr(transformers, cls_name).from_pretrained(tmp_path / "export").eval()
    ids, mask = random_batch()
    with torch.no_grad():
        want = model(ids, mask).logits
        assert torch.equal(ours(ids, mask).logits, want)
        assert (theirs(input_ids=ids, attention_mask=mask).logits - want).abs().max() <= 1e-5


def test_export_with_the_wrong_class_says_which(tmp_path):
    ckpt = _training_checkpoint(tmp_path, _random_model(minibert.BertForSequenceClassification))
    with raises(ValueError, str(ckpt), "BertForMaskedLM", "model_class="):
        export_checkpoint(ckpt, tmp_path / "export", model_class="BertForMaskedLM")
    with raises(ValueError, "model_class='Bert'", "BertForMaskedLM"):  # and the classes there are
        export_checkpoint(ckpt, tmp_path / "export", model_class="Bert")
    assert not (tmp_path / "export").exists()


def test_loading_a_training_checkpoint_points_to_export(tmp_path):
    ckpt = _training_checkpoint(tmp_path, _random_model())
    for load in (hf.read_config, minibert.BertForMaskedLM.from_pretrained):
        with raises(FileNotFoundError, str(ckpt), "training checkpoint", "export_checkpoint"):
            load(ckpt)
    with raises(FileNotFoundError, str(ckpt.parent), "step_00000007", "export_checkpoint"):

        minibert.BertForMaskedLM.from_pretrained(ckpt.parent)  # the folder of checkpoints


@pytest.mark.parametrize("lowercase", [False, True])
def test_a_saved_tokenizer_encodes_alike_in_transformers(lowercase, tmp_path):
    """A folder saved with its tokenizer says how it normalises text (tokenizer_config.json):
    without it transformers rebuilt a cased vocabulary as BERT's default, lowercasing and
    stripping accents, and its ids were not the model's. It also gives transformers the
    model's length limit for truncation."""
    transformers = pytest.importorskip("transformers")
    texts = ["The Cat [MASK] walking Café", "the cat is walking cafe", "Über Straße naïve"]
    tok = minibert.Tokenizer.train_from_iterator(texts * 20, vocab_size=120, min_frequency=1,
                                                 lowercase=lowercase, use_cache=False)
    model = minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size))
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "m")
    for text in texts:
        assert theirs(text)["input_ids"] == tok.encode(text), text
    assert theirs.model_max_length == model.config.max_position_embeddings
    again = minibert.Tokenizer.from_pretrained(tmp_path / "m" / "vocab.txt")  # from vocab.txt
    assert [again.encode(t) for t in texts] == [tok.encode(t) for t in texts]


def test_a_modern_folder_names_its_tokenizer_s_special_ids(tmp_path):
    """transformers' ModernBERT config defaults [CLS] / [SEP] (and bos / eos) to ModernBERT's
    own ids, 50281 and 50282, far outside a small vocabulary: a folder saved with its
    tokenizer names the tokenizer's."""
    transformers = pytest.importorskip("transformers")
    tok = minibert.Tokenizer.train_from_iterator(["the cat sat on the mat"] * 20,
                                                 vocab_size=60, min_frequency=1,
                                                 use_cache=False)
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=tok.vocab_size,
                                        max_position_embeddings=64)
    minibert.BertForMaskedLM(config).save_pretrained(tmp_path, tokenizer=tok)
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert (theirs.cls_token_id, theirs.sep_token_id, theirs.bos_token_id,
            theirs.eos_token_id, theirs.pad_token_id) == (tok.cls_id, tok.sep_id, tok.cls_id,
                                                          tok.sep_id, tok.pad_id)


# ---- F. from_pretrained(dtype=...): the model in another precision ---------------------------

MODEL_CLASSES = [minibert.BertModel, minibert.BertForMaskedLM,
                 minibert.BertForSequenceClassification, minibert.BertForTokenClassification,
                 minibert.BertForQuestionAnswering]


def _outputs(model, ids, mask):
    with torch.no_grad():
        out = model(ids, mask)
    return [t for t in out.to_tuple() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name, dtype", [("dtype", torch.bfloat16),
                                         ("torch_dtype", torch.float16)])
def test_from_pretrained_in_another_dtype_is_the_fp32_model_cast(cls, name, dtype, tmp_path):
    """`dtype=` (and transformers' older name `torch_dtype=`) loads every parameter in that
    dtype, computing what the fp32 model cast to it computes."""
    labels = {"num_labels": 3} if cls is minibert.BertForTokenClassification else {}
    _random_model(cls, **labels).save_pretrained(tmp_path)
    model = cls.from_pretrained(tmp_path, **{name: dtype}).eval()
    assert {p.dtype for p in model.parameters()} == {dtype}
    cast = cls.from_pretrained(tmp_path).to(dtype).eval()
    assert _same_weights(model, cast)
    ids, mask = random_batch(B=2, T=9, pad_from=5)
    ours, want = _outputs(model, ids, mask), _outputs(cast, ids, mask)
    assert ours and all(a.dtype == dtype and torch.equal(a, b) for a, b in zip(ours, want))


def test_from_pretrained_with_dtype_holds_transformers_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    _random_model().save_pretrained(tmp_path)
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    ours = hf.to_hf_state_dict(minibert.BertForMaskedLM.from_pretrained(
        tmp_path, dtype=torch.bfloat16))
    shared = [k for k, t in theirs.state_dict().items() if t.is_floating_point() and k in ours]
    assert len(shared) > 20
    for key in shared:
        t = theirs.state_dict()[key]
        assert t.dtype == ours[key].dtype == torch.bfloat16 and torch.equal(t, ours[key]), key


@pytest.mark.parametrize("kwargs, error, facts", [
    (dict(dtype="bfloat"), TypeError, ["dtype='bfloat'", "torch.bfloat16", "auto"]),
    (dict(torch_dtype=16), TypeError, ["torch_dtype=16", "torch.dtype"]),
    (dict(dtype=torch.int64), ValueError, ["dtype=torch.int64", "floating"]),
    (dict(torch_dtype="int64"), ValueError, ["torch_dtype=torch.int64", "floating"]),
    (dict(dtype=torch.bfloat16, torch_dtype=torch.bfloat16), TypeError,
     ["dtype", "torch_dtype", "older name"]),
])
def test_a_dtype_that_is_not_one_is_refused_by_name(kwargs, error, facts, tmp_path):
    _random_model(minibert.BertModel).save_pretrained(tmp_path)
    with raises(error, *facts):
        minibert.BertModel.from_pretrained(tmp_path, **kwargs)
    with raises(error, *facts):  # before any file is read
        minibert.BertModel.from_pretrained(tmp_path / "nowhere", **kwargs)


def test_the_sentence_encoder_and_multitask_model_load_in_a_dtype(tmp_path):
    texts = ["the cat sat", "a dog ran far"]
    tok = minibert.Tokenizer.train_from_iterator(texts * 10, vocab_size=60, min_frequency=1,
                                                 use_cache=False)
    minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size)).save_pretrained(
        tmp_path, tokenizer=tok)
    encoder = minibert.SentenceEncoder.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in encoder.parameters()} == {torch.bfloat16}
    cast = minibert.SentenceEncoder.from_pretrained(tmp_path).to(torch.bfloat16)
    assert torch.equal(encoder.encode(texts), cast.encode(texts))
    multi = minibert.BertMultiTask.from_pretrained(
        tmp_path, {"a": ("sequence", 2)}, torch_dtype=torch.bfloat16)
    assert {p.dtype for p in multi.parameters()} == {torch.bfloat16}


# ---- D. config.json against the weights: each stored tensor is taken, or refused by name ----

# Every way into a model folder, each a class built from config.json and the weights read.
FOLDER_LOADERS = {
    "BertModel": lambda p: minibert.BertModel.from_pretrained(p),
    "BertForMaskedLM": lambda p: minibert.BertForMaskedLM.from_pretrained(p),
    "BertForSequenceClassification":
        lambda p: minibert.BertForSequenceClassification.from_pretrained(p),
    "BertForTokenClassification":
        lambda p: minibert.BertForTokenClassification.from_pretrained(p, num_labels=3),
    "BertForQuestionAnswering": lambda p: minibert.BertForQuestionAnswering.from_pretrained(p),
    "SentenceEncoder": lambda p: minibert.SentenceEncoder.from_pretrained(p),
    "BertMultiTask": lambda p: minibert.BertMultiTask.from_pretrained(p, {"t": ("sequence", 2)}),
}


def _tokenizer(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
    return minibert.Tokenizer.from_pretrained(tmp_path / "vocab.txt")


def _edited_folder(tmp_path, config, **edits):
    """A masked LM of `config` saved with a tokenizer, then its config.json edited."""
    folder = tmp_path / "m"
    _random_model_of(config).save_pretrained(folder, tokenizer=_tokenizer(tmp_path))
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, **edits}))
    return folder


def _random_model_of(config):
    torch.manual_seed(0)
    return minibert.BertForMaskedLM(config)


# (the config saved, config.json's edit, the tensors the edited config has no place for,
# and how many they are)
DISAGREEMENTS = {
    "fewer layers": (tiny_config(num_layers=3), {"num_hidden_layers": 2},
                     "bert.encoder.layer.2.", 16),
    "rotary over a learned table": (tiny_config(mlp="geglu"), {"position": "rope"},
                                    "bert.embeddings.position_embeddings.weight", 1),
    "Post-LN over a Pre-LN model's final norm": (tiny_config(norm_position="pre", mlp="geglu"),
                                                 {"norm_position": "post"},
                                                 "bert.encoder.LayerNorm.weight", 2),
    "ModernBERT with fewer layers": (tiny_config(**{**minibert.model.config.MODERN,
                                                    "max_position_embeddings": 64},
                                                 num_layers=3),
                                     {"num_hidden_layers": 2, "layer_types": [
                                         "full_attention", "sliding_attention"]},
                                     "model.layers.2.", 6),
}


@pytest.mark.parametrize("case,loader", [
    (case, loader) for case in DISAGREEMENTS for loader in FOLDER_LOADERS
    # BertMultiTask builds BERT's heads, and refuses a ModernBERT folder before its weights
    if not (case.startswith("ModernBERT") and loader == "BertMultiTask")])
def test_a_tensor_the_config_has_no_place_for_is_refused_by_name(case, loader, tmp_path):
    """A config.json that describes less than its weights hold would load another model than
    the one saved, without a word: each loader names the tensors left over and the file."""
    config, edits, tensor, count = DISAGREEMENTS[case]
    folder = _edited_folder(tmp_path, config, **edits)
    weights = next(folder.glob("*.safetensors"))
    with raises(ValueError, tensor, f"{count} tensor", str(weights), "config.json"):
        FOLDER_LOADERS[loader](folder)


@pytest.mark.parametrize("loader", FOLDER_LOADERS)
def test_a_config_with_more_layers_than_the_weights_names_the_file(loader, tmp_path):
    folder = _edited_folder(tmp_path, tiny_config(), num_hidden_layers=3)
    with raises(ValueError, "bert.encoder.layer.2.", str(folder / "model.safetensors"),
                "config.json"):
        FOLDER_LOADERS[loader](folder)


@pytest.mark.parametrize("edits,facts", [
    ({"num_hidden_layers": 2}, ["bert.encoder.layer.2.", "16 tensor"]),
    ({"intermediate_size": 32}, ["bert.encoder.layer.0.intermediate.dense.weight", "(64, 32)",
                                 "(32, 32)"]),
])
def test_check_weights_reads_the_headers_alone_to_refuse_what_loading_would(edits, facts,
                                                                           tmp_path):
    """A script's early check: the names and shapes in the safetensors header against an
    encoder built on the meta device, before the data is prepared or --out touched."""
    folder = _edited_folder(tmp_path, tiny_config(num_layers=3))
    with torch.device("meta"):
        encoder = minibert.BertModel(tiny_config(num_layers=3), add_pooler=False)
    hf.check_weights(folder, encoder)  # the folder as saved
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, **edits}))
    with torch.device("meta"):
        encoder = minibert.BertModel(hf.config_from_hf(hf.read_config(folder)),
                                     add_pooler=False)
    with raises(ValueError, str(folder / "model.safetensors"), *facts):
        hf.check_weights(folder, encoder)
