import copy
import dataclasses
import json
import pickle

import pytest
import torch

import minibert
from facts import raises
from minibert import BertConfig
from minibert.model.config import PRESETS
from minibert.interop.hf import config_from_hf, config_to_hf


def test_defaults_are_bert_base():
    c = BertConfig()
    assert (c.num_layers, c.hidden_size, c.num_heads, c.intermediate_size) == (12, 768, 12, 3072)
    assert c.head_size == 64


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets(name):
    layers, hidden, heads = PRESETS[name]
    c = BertConfig.preset(name, vocab_size=1000)
    assert (c.num_layers, c.hidden_size, c.num_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden and c.vocab_size == 1000


def test_preset_table_matches_compact_bert():
    assert PRESETS["tiny"] == (2, 128, 2) and PRESETS["mini"] == (4, 256, 4)
    assert PRESETS["small"] == (4, 512, 8) and PRESETS["medium"] == (8, 512, 8)
    assert PRESETS["large"] == (24, 1024, 16)


@pytest.mark.parametrize("kwargs, words", [
    (dict(hidden_size=100, num_heads=3), ["hidden_size", "num_heads", "divisible"]),
    (dict(attention="flash"), ["attention", "'flash'", "sdpa", "math", "chunked"]),
    (dict(norm_position="middle"), ["norm_position", "post", "pre"]),
    (dict(hidden_dropout=1.5), ["hidden_dropout"]),
    (dict(num_layers=0), ["num_layers", ">= 1"]),
    (dict(vocab_size=10, pad_token_id=10), ["pad_token_id", "vocab_size"]),
    (dict(layer_norm_eps=0), ["layer_norm_eps"]),
    (dict(attention_chunk_size=2.5), ["attention_chunk_size"]),
])
def test_bad_values_name_the_field(kwargs, words):
    with raises(ValueError, *words):
        BertConfig(**kwargs)


@pytest.mark.parametrize("name", ["layer_norm_eps", "initializer_range", "rope_theta",
                                  "rope_local_theta", "hidden_dropout", "attention_dropout"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused(name, value):
    """An infinite epsilon or RoPE base passed `x > 0`: the model then computes NaN."""
    with raises(ValueError, f"BertConfig.{name}={value}"):
        BertConfig(**{name: value})


@pytest.mark.parametrize("modern", [False, True])
@pytest.mark.parametrize("field, text", [
    ("layer_norm_eps", "Infinity"), ("rope_theta", "Infinity"), ("initializer_range", "NaN"),
    ("hidden_dropout", "-Infinity"), ("num_layers", "0")])
def test_a_config_json_with_a_number_out_of_range_names_the_field_and_the_file(
        modern, field, text, tmp_path):
    """json.loads reads Infinity and NaN; what BertConfig refuses, a loaded config.json
    must not smuggle in, and the refusal says which file to repair."""
    pytest.importorskip("safetensors")
    config = BertConfig.preset("modernbert-tiny" if modern else "tiny", vocab_size=50)
    minibert.BertModel(config).save_pretrained(tmp_path)
    d = config_to_hf(config)
    theirs = {"layer_norm_eps": "norm_eps" if modern else "layer_norm_eps",
              "rope_theta": "global_rope_theta", "initializer_range": "initializer_range",
              "hidden_dropout": "mlp_dropout" if modern else "hidden_dropout_prob",
              "num_layers": "num_hidden_layers"}[field]
    if modern and field == "rope_theta":
        del d["rope_parameters"]  # the legacy key alone
    if not modern and field == "rope_theta":
        d.update(model_type="minibert", position="rope")  # a mix only minibert reads
        theirs = "rope_theta"
    d[theirs] = "@"
    if field == "num_layers" and modern:
        del d["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(d).replace('"@"', text))
    value = {"Infinity": "inf", "NaN": "nan", "-Infinity": "-inf", "0": "0"}[text]
    with raises(ValueError, str(tmp_path / "config.json"), f"{field}={value}", theirs):
        minibert.BertModel.from_pretrained(tmp_path)


def test_unknown_preset_and_field():
    with raises(ValueError, "'huge'", "tiny"):  # the name refused, and the names there are
        BertConfig.preset("huge")
    with raises(ValueError, "'hiden_size'", "BertConfig.preset('mini')"):
        BertConfig.preset("mini", hiden_size=3)


# transformers' name -> minibert's, for every field the two name differently (hf.py's map).
RENAMED = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
           "hidden_dropout_prob": "hidden_dropout",
           "attention_probs_dropout_prob": "attention_dropout"}


def test_the_renamed_fields_are_those_of_the_config_json_map():
    from minibert.interop.hf import _HF_NAMES
    assert {theirs: ours for theirs, ours in _HF_NAMES.items() if theirs != ours} == RENAMED


@pytest.mark.parametrize("theirs, ours", list(RENAMED.items()))
def test_a_transformers_field_name_is_refused_naming_minibert_s(theirs, ours):
    value = 0.0 if "dropout" in ours else 2
    with raises(TypeError, f"BertConfig got {theirs}", "transformers", f"{ours}={value}"):
        BertConfig(**{theirs: value})
    with raises(TypeError, theirs, "BertConfig.preset('tiny')", f"{ours}={value}"):
        BertConfig.preset("tiny", **{theirs: value})
    with raises(TypeError, theirs, "BertConfig.replace", f"{ours}={value}"):
        BertConfig().replace(**{theirs: value})
    with raises(TypeError, theirs, "config_from_hf", f"{ours}={value}"):  # from_pretrained's
        config_from_hf(config_to_hf(BertConfig()), **{theirs: value})


def test_two_transformers_names_are_named_together():
    with raises(TypeError, "num_hidden_layers", "num_attention_heads", "num_layers=2",
                "num_heads=4"):
        BertConfig(num_attention_heads=4, num_hidden_layers=2, hidden_size=64)


def test_an_unknown_field_name_is_refused_without_a_transformers_hint():
    with raises(TypeError, "hiden_size") as info:
        BertConfig(hiden_size=64, num_layers=2)
    assert "transformers" not in str(info.value)
    with raises(ValueError, "hiden_size") as info:
        BertConfig.preset("tiny", hiden_size=64)
    assert "transformers" not in str(info.value)


def test_a_config_copies_pickles_and_replaces():
    c = BertConfig.preset("tiny", vocab_size=99, norm_position="pre")
    assert copy.copy(c) == c == copy.deepcopy(c) == pickle.loads(pickle.dumps(c))
    assert dataclasses.replace(c, num_layers=3) == c.replace(num_layers=3) != c
    assert BertConfig(*dataclasses.astuple(c)) == BertConfig(**dataclasses.asdict(c)) == c


def test_hf_dict_round_trip():
    c = BertConfig.preset("small", vocab_size=5000, norm_position="pre", attention="chunked")
    d = config_to_hf(c)
    assert d["num_hidden_layers"] == 4 and d["num_attention_heads"] == 8
    assert d["hidden_dropout_prob"] == 0.1 and d["norm_position"] == "pre"
    assert config_from_hf(d) == c
    assert config_from_hf(d, attention="math").attention == "math"


def test_pre_ln_has_its_own_model_type():
    # transformers' BERT is Post-LN only; an unknown model_type makes its AutoConfig refuse a
    # Pre-LN config.json instead of misreading it (see hf.py for the weights file).
    assert config_to_hf(BertConfig(norm_position="pre"))["model_type"] == "minibert-preln"
    assert config_to_hf(BertConfig())["model_type"] == "bert"
    d = config_to_hf(BertConfig(norm_position="pre"))
    del d["norm_position"]
    assert config_from_hf(d).norm_position == "pre"
    d["norm_position"] = "post"
    with raises(ValueError, "config.json", "model_type='minibert-preln'", "norm_position='post'"):
        config_from_hf(d)
    old_export = dict(config_to_hf(BertConfig()), norm_position="pre")  # before the model_type
    assert config_from_hf(old_export).norm_position == "pre"


def test_hf_dict_from_transformers():
    transformers = pytest.importorskip("transformers")
    hc = transformers.BertConfig(vocab_size=321, hidden_size=64, num_hidden_layers=3,
                                 num_attention_heads=4, intermediate_size=128,
                                 hidden_dropout_prob=0.0, layer_norm_eps=1e-7)
    c = config_from_hf(hc.to_dict())
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads) == (321, 64, 3, 4)
    assert c.hidden_dropout == 0.0 and c.layer_norm_eps == 1e-7 and c.norm_position == "post"


@pytest.mark.parametrize("key, value, word", [
    ("hidden_act", "relu", "hidden_act"),
    ("is_decoder", True, "is_decoder"),
    ("add_cross_attention", True, "add_cross_attention"),
    ("model_type", "roberta", "model_type"),
    ("position_embedding_type", "relative_key", "position_embedding_type"),
])
def test_hf_dict_refuses_what_minibert_does_not_implement(key, value, word):
    d = config_to_hf(BertConfig())
    d[key] = value
    with pytest.raises(ValueError, match=word):
        config_from_hf(d)


def test_check_fits_refuses_long_sequences_and_larger_vocabularies():
    config = BertConfig.preset("tiny", vocab_size=100, max_position_embeddings=64)
    config.check_fits(64, 100)
    config.check_fits(32, 90)  # a smaller tokenizer fits: its ids are all embedded
    with raises(ValueError, "65", "max_position_embeddings=64"):
        config.check_fits(65, 100)
    with raises(ValueError, "101", "the teacher", "100"):  # both sizes, and whose is whose
        config.check_fits(64, 101, what="the teacher")


def test_an_untied_bert_decoder_is_refused_by_name(tmp_path):
    """minibert's MLM decoder is the word embeddings (as BERT's is); a checkpoint trained with
    a decoder of its own would be read with the wrong matrix."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, tie_word_embeddings=False))
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        minibert.BertForMaskedLM.from_pretrained(tmp_path)


def test_an_untied_checkpoint_loads_where_nothing_decodes(tmp_path):
    """Untied, the decoder is the only thing minibert cannot compute: the encoder and the
    classifiers of such a folder were refused too."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, tie_word_embeddings=False,
        num_labels=3)).eval()
    hf.save_pretrained(tmp_path)
    ids = torch.randint(1, 50, (2, 9))
    with torch.no_grad():
        ours = minibert.BertForSequenceClassification.from_pretrained(tmp_path).eval()
        assert (ours(ids).logits - hf(input_ids=ids).logits).abs().max() < 1e-5
    minibert.BertModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tie_word_embeddings=false"):
        minibert.BertForMaskedLM.from_pretrained(tmp_path)


