"""A model and its tokenizer belong together: `check_tokenizer_fits`, the vocabulary
fingerprint that `save_pretrained` records and `from_pretrained` checks, a classifier's head
for other labels (`on_other_labels`), and every script refusing a tokenizer that is not its
model's before it writes anything."""

import hashlib
import json

import pytest
import torch

import minibert
from minibert.interop.pretrained import VOCAB_KEY, check_tokenizer_fits, vocab_sha256

from engine_utils import WORDS, load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries, raises, without
from script_inputs import SCRIPTS, argv, make_inputs



@pytest.fixture(scope="module")
def tok():
    return minibert.Tokenizer.train_from_iterator([" ".join(WORDS)] * 20, vocab_size=100,
                                                  min_frequency=1, use_cache=False)


def config(vocab_size, **overrides):
    return minibert.BertConfig(vocab_size=vocab_size, hidden_size=32, num_layers=1, num_heads=2,
                               intermediate_size=64, max_position_embeddings=64, **overrides)


def folder(path, tok, rows, cls=minibert.BertForMaskedLM, record=True, **overrides):
    """A model folder: `cls` with `rows` embedding rows, and `tok` beside it (recorded in
    config.json when `record`)."""
    torch.manual_seed(0)
    model = cls(config(rows, **overrides))
    model.save_pretrained(path, tokenizer=tok if record else None)
    tok.save(path)
    return path


# ---- the library -----------------------------------------------------------------------------

def test_rows_beyond_the_ids_fit_only_as_padding_to_a_round_size(tok):
    n = tok.vocab_size
    check_tokenizer_fits(config(n), tok)
    for m in (8, 64, 128):  # a table padded up to a round size for faster matmuls
        check_tokenizer_fits(config(-(-n // m) * m), tok)
    with raises(ValueError, f"{n} tokens", f"{n + 200} embedding rows",
                "--allow-vocab-mismatch"):
        check_tokenizer_fits(config(n + 200), tok)
    check_tokenizer_fits(config(n + 200), tok, allow_vocab_mismatch=True)  # surgery, as asked
    for allow in (False, True):  # an id past the table fails in any case
        with raises(ValueError, f"{n} tokens", "the teacher", f"{n - 1} embeddings"):
            check_tokenizer_fits(config(n - 1), tok, what="the teacher",
                                 allow_vocab_mismatch=allow)


def test_special_ids_must_be_the_configs(tok, tmp_path):
    assert tok.pad_id == 0
    with raises(ValueError, "[PAD]", "id 0", "3"):  # the token, its id, the config's id
        check_tokenizer_fits(config(tok.vocab_size, pad_token_id=3), tok)
    # A config.json that names the other special ids is held to them too.
    path = folder(tmp_path / "m", tok, tok.vocab_size)
    stored = json.loads((path / "config.json").read_text())
    stored["mask_token_id"] = tok.mask_id + 1
    (path / "config.json").write_text(json.dumps(stored))
    with raises(ValueError, "[MASK]", f"id {tok.mask_id}") as err:
        check_tokenizer_fits(config(tok.vocab_size), tok, source=path)
    assert str(tok.mask_id + 1) in without(str(err.value), tmp_path), str(err.value)


def test_the_recorded_vocabulary_is_vocab_txts_sha256_and_a_swap_is_refused(tok, tmp_path):
    path = folder(tmp_path / "m", tok, tok.vocab_size)
    recorded = json.loads((path / "config.json").read_text())[VOCAB_KEY]
    assert recorded == hashlib.sha256((path / "vocab.txt").read_bytes()).hexdigest()
    assert recorded == vocab_sha256(tok)
    minibert.BertForMaskedLM.from_pretrained(path)  # its own tokenizer: fine
    other = minibert.Tokenizer.train_from_iterator(["zebra yak quokka"] * 30, vocab_size=80,
                                                   min_frequency=1, use_cache=False)
    assert other.vocab_size <= tok.vocab_size
    other.save(path)  # the folder's tokenizer replaced by another
    # the folder, the vocabulary recorded and the one found, and the setting for surgery
    with raises(ValueError, str(path), recorded[:16], vocab_sha256(other)[:16],
                "allow_vocab_mismatch=True"):
        minibert.BertForMaskedLM.from_pretrained(path)
    with raises(ValueError, str(path), recorded[:16], vocab_sha256(other)[:16],
                "--allow-vocab-mismatch"):
        check_tokenizer_fits(config(tok.vocab_size), other, source=path,
                             allow_vocab_mismatch=False)
    minibert.BertForMaskedLM.from_pretrained(path, allow_vocab_mismatch=True)
    transformers = pytest.importorskip("transformers")  # the extra key does not bother it
    transformers.BertForMaskedLM.from_pretrained(path)


def test_a_swapped_tokenizer_is_refused_by_every_loader_of_a_folder(tok, tmp_path):
    """`SentenceEncoder` reads the folder's tokenizer and embeds with it, and `BertMultiTask`
    is fine-tuned with it: a tokenizer swapped in after saving would map text to ids the
    embeddings never learned, so both refuse it as `from_pretrained` does."""
    path = folder(tmp_path / "m", tok, tok.vocab_size)
    spec = {"topic": ("sequence", 2)}
    minibert.SentenceEncoder.from_pretrained(path)  # its own tokenizer: fine
    minibert.BertMultiTask.from_pretrained(path, spec)
    recorded = vocab_sha256(tok)
    other = minibert.Tokenizer.train_from_iterator(["zebra yak quokka"] * 30, vocab_size=80,
                                                   min_frequency=1, use_cache=False)
    other.save(path)
    for load in (lambda **kw: minibert.SentenceEncoder.from_pretrained(path, **kw),
                 lambda **kw: minibert.BertMultiTask.from_pretrained(path, spec, **kw)):
        with raises(ValueError, str(path), recorded[:16], vocab_sha256(other)[:16],
                    "allow_vocab_mismatch"):
            load()
        load(allow_vocab_mismatch=True)  # deliberate vocabulary surgery


def test_a_classifier_for_other_labels_gets_a_new_head_as_asked(tok, tmp_path):
    """`on_other_labels="new_head"` against the recipe the fine-tuning scripts used before it
    existed: the encoder loaded alone, under a new classifier built for the new labels."""
    cls = minibert.BertForSequenceClassification
    path = tmp_path / "three"
    torch.manual_seed(0)
    three = cls(config(tok.vocab_size), 3, id2label=["a", "b", "c"])
    three.save_pretrained(path, tokenizer=tok)
    for labels in (["x", "y"], ["x", "y", "z"]):  # fewer classes, or as many with other names
        with raises(ValueError, str(path), "['a', 'b', 'c']", str(labels),
                    "on_other_labels='new_head'"):
            cls.from_pretrained(path, id2label=labels)
        new = cls.from_pretrained(path, id2label=labels, on_other_labels="new_head")
        old = cls(cls.from_pretrained(path).bert.config, len(labels), id2label=labels)
        old.bert = cls.from_pretrained(path).bert
        assert new.id2label == old.id2label == labels
        assert new.state_dict().keys() == old.state_dict().keys()
        for k, t in new.bert.state_dict().items():  # the checkpoint's encoder, as before
            assert torch.equal(t, old.bert.state_dict()[k]) and \
                torch.equal(t, three.bert.state_dict()[k])
        assert new.classifier.weight.shape == old.classifier.weight.shape == (len(labels), 32)
        if len(labels) == 3:  # a fresh head, not the one trained for a, b, c
            assert not torch.equal(new.classifier.weight, three.classifier.weight)
    # The same labels, or none asked for: the checkpoint's own head.
    for kwargs in ({"id2label": ["a", "b", "c"]}, {}):
        same = cls.from_pretrained(path, **kwargs)
        assert torch.equal(same.classifier.weight, three.classifier.weight)
        assert same.id2label == ["a", "b", "c"]
    with pytest.raises(ValueError, match="on_other_labels='keep'"):
        cls.from_pretrained(path, on_other_labels="keep")


# ---- the scripts -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"))


def _refused(capsys, script, args):
    code = load_example(script).main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, (code, err)
    return err


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_refuses_a_tokenizer_with_fewer_ids_than_the_model_has_rows(
        script, tok, inputs, tmp_path, capsys):
    n = tok.vocab_size
    model = folder(tmp_path / "model", tok, n + 200, record=False)
    out = tmp_path / "out"
    err = _refused(capsys, script, argv(script, inputs, model, out))
    assert_carries(err, f"{n} tokens", f"{n + 200} embedding rows", "--allow-vocab-mismatch")
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("script", ["finetune_classification", "pretrain_wikitext", "embed"])
def test_every_script_refuses_a_swapped_tokenizer_and_another_pad_id(script, tok, inputs,
                                                                     tmp_path, capsys):
    swapped = folder(tmp_path / "swapped", tok, tok.vocab_size)
    other = minibert.Tokenizer.train_from_iterator(["zebra yak quokka"] * 30, vocab_size=80,
                                                   min_frequency=1, use_cache=False)
    other.save(swapped)
    out = tmp_path / "out"
    err = _refused(capsys, script, argv(script, inputs, swapped, out))
    assert_carries(err, vocab_sha256(tok)[:16], vocab_sha256(other)[:16])
    padded = folder(tmp_path / "pad", tok, tok.vocab_size, pad_token_id=tok.vocab_size - 1)
    err = _refused(capsys, script, argv(script, inputs, padded, out))
    # the token, its id in the tokenizer, and the id the model's config gives it
    assert_carries(without(err, tmp_path), "[PAD]", f"id {tok.pad_id}", str(tok.vocab_size - 1))
    assert not out.exists()


@pytest.mark.parametrize("script", ["finetune_classification", "embed"])
def test_a_round_table_fits_and_surgery_may_be_asked_for(script, tok, inputs, tmp_path):
    main = load_example(script).main
    padded = folder(tmp_path / "padded", tok, -(-tok.vocab_size // 64) * 64)
    assert main(argv(script, inputs, padded, tmp_path / "a")) == 0
    wide = folder(tmp_path / "wide", tok, tok.vocab_size + 200)
    assert main(argv(script, inputs, wide, tmp_path / "b", "--allow-vocab-mismatch")) == 0
