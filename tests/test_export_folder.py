"""An exported training checkpoint is a complete model folder: the model and the tokenizer of
its run, as the run's final/ is.

`export_checkpoint` used to write the weights and config only. The fine-tuning scripts then
refused the folder ("no tokenizer"), and transformers' AutoTokenizer built a 5-token
vocabulary from it that read every word as [UNK].
"""

import logging
from dataclasses import asdict

import pytest

import minibert
from minibert.training.checkpoint import latest_checkpoint, save_checkpoint
from minibert.interop.export import export_checkpoint

from conftest import tiny_config
from engine_utils import WORDS, load_example, quick_runs  # noqa: F401 (fixture)
from script_inputs import argv, make_inputs

pytest.importorskip("safetensors")
TEXT = f"The {WORDS[0]} {WORDS[1]}, far from {WORDS[2].upper()}! xyzzy {WORDS[3]}s"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("script", ["pretrain_wikitext", "finetune_classification"])
def test_an_export_carries_the_run_s_tokenizer(script, inputs, tmp_path):
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    assert load_example(script).main(argv(script, inputs, None, run)) == 0
    exported = export_checkpoint(latest_checkpoint(run / "checkpoints"), tmp_path / "export")
    ours = minibert.Tokenizer.from_pretrained(run / "tokenizer")
    assert minibert.Tokenizer.from_pretrained(exported).fingerprint == ours.fingerprint
    theirs = transformers.AutoTokenizer.from_pretrained(exported)
    ids = ours.encode(TEXT)
    assert theirs(TEXT)["input_ids"] == ids
    assert len(set(ids) - {ours.unk_id}) > 3  # words, not [UNK]s
    # The fine-tuning scripts take it as --init-from.
    out = tmp_path / "finetuned"
    assert load_example("finetune_classification").main(
        argv("finetune_classification", inputs, exported, out)) == 0
    assert (out / "final" / "tokenizer.json").is_file()


def _checkpoint_without_run(tmp_path, tok=None):
    """A training checkpoint saved by hand: no run folder, no tokenizer beside it."""
    model = minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size if tok else 99))
    identity = {"tokenizer": tok.fingerprint} if tok else {}
    return save_checkpoint(tmp_path / "checkpoints", 2, {
        "model": model.state_dict(), "model_class": "BertForMaskedLM",
        "model_config": asdict(model.config), "data_identity": identity})


def _tokenizer(vocab_size=100, texts=(" ".join(WORDS),)):
    return minibert.Tokenizer.train_from_iterator(list(texts) * 5, vocab_size=vocab_size,
                                                  min_frequency=1, use_cache=False)


def test_an_export_without_a_tokenizer_says_so(tmp_path, caplog):
    ckpt = _checkpoint_without_run(tmp_path)
    with caplog.at_level(logging.WARNING, logger="minibert.interop.export"):
        export_checkpoint(ckpt, tmp_path / "export")
    assert "no tokenizer" in caplog.text and str(tmp_path / "export") in caplog.text
    assert "tokenizer=" in caplog.text  # what to do
    minibert.BertForMaskedLM.from_pretrained(tmp_path / "export")  # the model is there


def test_an_export_takes_a_tokenizer_given_and_checks_it_is_the_run_s(tmp_path):
    tok = _tokenizer()
    ckpt = _checkpoint_without_run(tmp_path, tok)
    tok.save(tmp_path / "tok")
    for given in (tok, tmp_path / "tok"):
        exported = export_checkpoint(ckpt, tmp_path / "export", tokenizer=given)
        assert minibert.Tokenizer.from_pretrained(exported).fingerprint == tok.fingerprint
    other = _tokenizer(texts=(" ".join(reversed(WORDS)) + " zebra quokka",))
    assert other.fingerprint != tok.fingerprint
    with pytest.raises(ValueError) as e:
        export_checkpoint(ckpt, tmp_path / "export2", tokenizer=other)
    assert tok.fingerprint[:16] in str(e.value) and other.fingerprint[:16] in str(e.value)
    assert not (tmp_path / "export2").exists()


def test_a_run_folder_s_tokenizer_that_is_not_the_checkpoint_s_is_refused(tmp_path):
    """RUN/tokenizer replaced after the run (or a checkpoint copied into another run):
    carried, its ids would not be the model's."""
    tok = _tokenizer()
    ckpt = _checkpoint_without_run(tmp_path / "run", tok)
    _tokenizer(texts=(" ".join(reversed(WORDS)) + " zebra quokka",)).save(
        tmp_path / "run" / "tokenizer")
    with pytest.raises(ValueError, match=str(tmp_path / "run" / "tokenizer")):
        export_checkpoint(ckpt, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_a_run_inside_another_exports_with_the_outer_run_s_tokenizer(tmp_path):
    """distill.py's baseline/ is a run of its own that shares the distillation's tokenizer."""
    tok = _tokenizer()
    ckpt = _checkpoint_without_run(tmp_path / "run" / "baseline", tok)
    tok.save(tmp_path / "run" / "tokenizer")
    exported = export_checkpoint(ckpt, tmp_path / "export")
    assert minibert.Tokenizer.from_pretrained(exported).fingerprint == tok.fingerprint
