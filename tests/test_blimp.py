"""BLiMP scoring: each sentence's pseudo-log-likelihood against a plain loop over transformers'
models on the same weights, its independence of the batching, the accuracies on pairs whose
answers are known, the reader's refusals, and examples/blimp.py end to end."""

import gzip
import json

import pytest
import torch

import minibert
from minibert.tasks.blimp import (MinimalPair, PairScore, blimp_accuracy, evaluate_blimp,
                                  pseudo_log_likelihood, read_blimp, read_paradigm,
                                  sample_pairs)

from conftest import tiny_config
from engine_utils import WORDS, load_example, quick_runs  # noqa: F401 (a fixture)
from facts import assert_carries, raises

SENTENCES = ["the cat sat on a mat", "dogs ran far away from home",
             "birds sang songs of rain in spring under green trees near rivers",
             "the cat", "home"]


@pytest.fixture(scope="module")
def tok():
    return minibert.Tokenizer.train_from_iterator([" ".join(WORDS)] * 5, vocab_size=100,
                                                  min_frequency=1, use_cache=False)


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Weights far from their initial values, norms and biases included, so that attention
    is far from uniform and a wrong position, mask or token changes every score."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.3 * torch.randn(p.shape, generator=g)
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return model.eval()


@pytest.fixture(scope="module")
def bert_dir(tok, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    minibert.set_seed(0)
    _perturbed(minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size))
               ).save_pretrained(folder, tokenizer=tok)
    return folder


def transformers_pll(model, tokenizer, sentence: str) -> float:
    """The PLL as Salazar et al. define it, written plainly: one masked copy per forward."""
    ids = tokenizer(sentence)["input_ids"]
    total = 0.0
    for i in range(1, len(ids) - 1):  # not [CLS] (0) nor [SEP] (last)
        masked = torch.tensor([ids])
        masked[0, i] = tokenizer.mask_token_id
        with torch.no_grad():
            logits = model(input_ids=masked).logits[0, i]  # (V,)
        total += torch.log_softmax(logits, dim=-1)[ids[i]].item()
    return total


# ---- pseudo-log-likelihood -------------------------------------------------------------------

def test_pll_equals_transformers_bert_on_the_same_weights(bert_dir):
    transformers = pytest.importorskip("transformers")
    ours = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    theirs = transformers.BertForMaskedLM.from_pretrained(bert_dir).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(bert_dir)
    got = pseudo_log_likelihood(ours, minibert.Tokenizer.from_pretrained(bert_dir), SENTENCES,
                                batch_size=4)
    want = [transformers_pll(theirs, their_tok, s) for s in SENTENCES]
    assert all(g < 0 for g in got)
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-4, (got, want)


def test_pll_equals_transformers_modernbert_on_the_same_weights(tok, tmp_path):
    """Rotary positions and sliding-window layers (a window of 4 over sentences of up to 15
    tokens), where the masked position's neighbours decide what a layer sees."""
    transformers = pytest.importorskip("transformers")
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=tok.vocab_size,
                                        local_window=4, global_every=2,
                                        max_position_embeddings=64)
    minibert.set_seed(0)
    ours = _perturbed(minibert.BertForMaskedLM(config))
    ours.save_pretrained(tmp_path, tokenizer=tok)
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    got = pseudo_log_likelihood(ours, tok, SENTENCES, batch_size=5)
    want = [transformers_pll(theirs, their_tok, s) for s in SENTENCES]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-4, (got, want)


def test_pll_does_not_depend_on_the_batch_or_the_other_sentences(bert_dir, tok):
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    alone = [pseudo_log_likelihood(model, tok, [s])[0] for s in SENTENCES]
    for batch_size in (1, 3, 7, 1000):  # copies of several lengths in one padded forward
        got = pseudo_log_likelihood(model, tok, SENTENCES, batch_size=batch_size)
        assert max(abs(g - a) for g, a in zip(got, alone)) <= 1e-4, batch_size
    backwards = pseudo_log_likelihood(model, tok, SENTENCES[::-1], batch_size=3)
    assert max(abs(g - a) for g, a in zip(backwards[::-1], alone)) <= 1e-4


class _Dense(torch.nn.Module):
    """A masked LM that ignores `labels` and returns every position's logits, (R, T, V), as
    transformers' models do."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, attention_mask=None, labels=None):
        return self.model(input_ids, attention_mask)


def test_a_model_with_every_positions_logits_scores_the_same(bert_dir, tok):
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    sparse = pseudo_log_likelihood(model, tok, SENTENCES, batch_size=4)
    dense = pseudo_log_likelihood(_Dense(model), tok, SENTENCES, batch_size=4)
    assert max(abs(a - b) for a, b in zip(sparse, dense)) <= 1e-5


def test_pll_runs_in_eval_mode_and_puts_training_mode_back(tok):
    minibert.set_seed(0)
    model = minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size,
                                                 hidden_dropout=0.5, attention_dropout=0.5))
    model.train()
    a = pseudo_log_likelihood(model, tok, SENTENCES[:2])
    b = pseudo_log_likelihood(model, tok, SENTENCES[:2])
    assert a == b and model.training  # dropout off while scoring, on again after


def test_pll_under_bf16_autocast_is_near_fp32(bert_dir, tok):
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    exact = pseudo_log_likelihood(model, tok, SENTENCES[:3])
    bf16 = pseudo_log_likelihood(model, tok, SENTENCES[:3], precision="bf16")
    assert bf16 != exact  # the forward did run in bf16
    assert max(abs(a - b) / abs(a) for a, b in zip(exact, bf16)) < 0.05
    with raises(ValueError, "fp16", "CUDA"):
        pseudo_log_likelihood(model, tok, SENTENCES[:1], precision="fp16")


def test_pll_refuses_what_it_cannot_score(bert_dir, tok):
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    with raises(ValueError, "sentence 1", "65 tokens", "max_position_embeddings=64"):
        pseudo_log_likelihood(model, tok, ["the cat", " ".join(["cat"] * 63)])
    with raises(ValueError, "sentence 0", "nothing to score"):
        pseudo_log_likelihood(model, tok, ["\u200b"])  # stripped by the normaliser: no token
    with raises(ValueError, "batch_size=0"):
        pseudo_log_likelihood(model, tok, SENTENCES, batch_size=0)
    with raises(TypeError, "one str"):
        pseudo_log_likelihood(model, tok, "the cat")


def test_pll_refuses_a_model_without_a_masked_lm_head(tok):
    """An encoder or a classifier decodes no vocabulary: refused by name, not by a shape
    error from inside its forward."""
    config = tiny_config(vocab_size=tok.vocab_size)
    for model in (minibert.BertModel(config), minibert.BertForSequenceClassification(config)):
        with raises(TypeError, type(model).__name__, "masked LM"):
            pseudo_log_likelihood(model, tok, SENTENCES)
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32)
    for model in (transformers.BertModel(hf), transformers.BertForSequenceClassification(hf)):
        with raises(TypeError, type(model).__name__, "masked LM"):
            pseudo_log_likelihood(model, tok, SENTENCES)


# ---- accuracies ------------------------------------------------------------------------------

def _pair(paradigm, field, k=0):
    return MinimalPair(f"good {k}", f"bad {k}", paradigm, field, str(k), k + 1)


def test_accuracies_per_paradigm_field_and_overall_on_known_answers():
    scores = [
        # a: 3 of 4 right; the tie is wrong, as is a NaN
        PairScore(_pair("a", "syntax", 0), -1.0, -2.0),
        PairScore(_pair("a", "syntax", 1), -3.0, -3.0),
        PairScore(_pair("a", "syntax", 2), -1.0, -1.5),
        PairScore(_pair("a", "syntax", 3), -0.5, -4.0),
        # b: 0 of 2 right
        PairScore(_pair("b", "syntax", 0), -5.0, -2.0),
        PairScore(_pair("b", "syntax", 1), float("nan"), -2.0),
        # c: 1 of 1 right, another field
        PairScore(_pair("c", "morphology", 0), -1.0, -9.0),
    ]
    result = blimp_accuracy(scores)
    assert result.paradigms == {"a": 0.75, "b": 0.0, "c": 1.0}
    assert result.pairs == {"a": 4, "b": 2, "c": 1}
    # a field: the share of its pairs (3 of 6), not the mean of its paradigms (0.375)
    assert result.fields == {"morphology": 1.0, "syntax": 0.5}
    assert result.field_pairs == {"morphology": 1, "syntax": 6}
    # overall: the mean of the paradigms (1.75 / 3), not of the pairs (4 of 7)
    assert result.overall == pytest.approx(1.75 / 3)
    table = result.to_markdown()
    assert "| a | syntax | 4 | 75.0 |" in table and "| syntax | 6 | 50.0 |" in table
    as_json = result.to_dict()
    assert as_json["paradigms"]["c"] == {"field": "morphology", "accuracy": 1.0, "pairs": 1}
    assert as_json["pairs"] == 7 and as_json["tied"] == 1


def test_sentences_that_encode_alike_score_alike_in_any_batch(bert_dir, tok):
    """Two sentences the tokenizer makes one are one sentence: the same PLL to the bit, so
    their pair ties (and counts wrong) whatever the batch size puts beside their copies."""
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    words = SENTENCES[:3] * 4
    pairs = {"p": [MinimalPair(f"{w} \u2603", f"{w} \u2602", "p", "syntax", "p", k + 1)
                   for k, w in enumerate(words)]}
    for batch_size in (3, 7, 64):
        result = evaluate_blimp(model, tok, pairs, batch_size=batch_size)
        assert result.to_dict()["tied"] == len(words), batch_size
        assert result.overall == 0.0


def test_a_pair_the_tokenizer_cannot_tell_apart_is_counted_and_said(bert_dir, tok, caplog):
    """Words outside the vocabulary both become [UNK]: the two sentences are one, their
    PLLs tie, and the pair counts wrong. The log and results.json say how many."""
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    good, bad = "the cat sat on \u2603", "the cat sat on \u2602"  # neither in the vocabulary
    assert tok.encode(good) == tok.encode(bad)
    pairs = {"p": [MinimalPair(good, bad, "p", "syntax", "p", 1),
                   MinimalPair("the cat sat", "cat the sat", "p", "syntax", "p", 2)]}
    with caplog.at_level("WARNING"):
        result = evaluate_blimp(model, tok, pairs)
    assert result.to_dict()["tied"] == 1
    assert_carries(caplog.text, "1 of 2 pairs", "[UNK]")


def test_scoring_pairs_with_a_model_gives_its_plls(bert_dir, tok):
    model = minibert.BertForMaskedLM.from_pretrained(bert_dir)
    paradigms = {"p": [MinimalPair(SENTENCES[0], SENTENCES[1], "p", "syntax", "0", 1),
                       MinimalPair(SENTENCES[3], SENTENCES[4], "p", "syntax", "1", 2)],
                 "q": [MinimalPair(SENTENCES[1], SENTENCES[0], "q", "semantics", "0", 1)]}
    result = evaluate_blimp(model, tok, paradigms, batch_size=5)
    pll = dict(zip(SENTENCES, pseudo_log_likelihood(model, tok, SENTENCES)))
    for s in result.scores:
        assert s.good == pytest.approx(pll[s.pair.good], abs=1e-4)
        assert s.bad == pytest.approx(pll[s.pair.bad], abs=1e-4)
    # the pair and its reverse: exactly one of them is right
    assert result.paradigms["p"] in (0.0, 0.5, 1.0)
    assert result.scores[0].correct != result.scores[2].correct


def test_the_sample_is_fixed_nested_and_in_file_order():
    pairs = {"a": [_pair("a", "x", k) for k in range(100)], "b": [_pair("b", "x", 0)]}
    small, large = sample_pairs(pairs, 10), sample_pairs(pairs, 40)
    assert small == sample_pairs(pairs, 10)  # the same every call
    assert len(small["a"]) == 10 and small["b"] == pairs["b"]
    assert set(small["a"]) <= set(large["a"])  # a larger sample holds the smaller
    lines = [p.line for p in large["a"]]
    assert lines == sorted(lines) and lines != list(range(1, 41))  # spread, in file order
    assert sample_pairs(pairs, 10, seed=1) != small
    assert sample_pairs(pairs, None) == pairs
    with raises(ValueError, "max_pairs=0"):
        sample_pairs(pairs, 0)


# ---- the reader ------------------------------------------------------------------------------

def _line(good="The cat sat.", bad="The cat sit.", **extra):
    return json.dumps({"sentence_good": good, "sentence_bad": bad, **extra})


def _write(folder, name, lines):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_reads_each_file_as_a_paradigm(tmp_path):
    folder = tmp_path / "blimp"
    _write(folder, "b_paradigm.jsonl", [
        _line(field="syntax", UID="b_paradigm", pairID="0"), "",
        _line(field="syntax", UID="b_paradigm", pairID="1")])
    _write(folder, "a_paradigm.jsonl", [_line(linguistics_term="binding"), _line()])
    (folder / "README").write_text("not a paradigm")
    paradigms = read_blimp(folder)
    assert list(paradigms) == ["a_paradigm", "b_paradigm"]
    a, b = paradigms["a_paradigm"], paradigms["b_paradigm"]
    assert [(p.field, p.pair_id, p.line) for p in a] == [("binding", "1", 1),
                                                         ("unknown", "2", 2)]
    assert [(p.field, p.pair_id, p.line) for p in b] == [("syntax", "0", 1), ("syntax", "1", 3)]
    assert b[0].good == "The cat sat." and b[0].bad == "The cat sit."


@pytest.mark.parametrize("line,facts", [
    ('{"sentence_good": "A cat.", "sentence_bad": ', ["not JSON"]),
    ('["A cat.", "A cats."]', ["list", "sentence_good"]),
    (json.dumps({"sentence_bad": "A cats."}), ["no 'sentence_good'"]),
    (json.dumps({"sentence_good": "A cat.", "sentence_bad": 3}), ["int", "'sentence_bad'"]),
    (json.dumps({"sentence_good": "A cat.", "sentence_bad": "  "}), ["'sentence_bad' is empty"]),
    ('{"sentence_good": "A cat.", "sentence_bad": "A cats.", "sentence_bad": "Cats."}',
     ["'sentence_bad'", "twice"]),
    (_line(UID="other"), ["UID 'other'", "line 1 has 'p'"]),
])
def test_a_bad_line_is_refused_naming_the_file_and_line(tmp_path, line, facts):
    path = _write(tmp_path, "p.jsonl", [_line(UID="p"), "", line])
    with raises(ValueError, f"{path}, line 3", *facts):
        read_paradigm(path)
    with raises(ValueError, f"{path}, line 3"):
        read_blimp(tmp_path)


def test_a_byte_that_is_not_utf8_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes((_line() + "\n").encode() + b'{"sentence_good": "caf\xe9"}\n')
    with raises(ValueError, f"{path}, line 2", "UTF-8"):
        read_blimp(tmp_path)


def test_folders_and_files_without_pairs_are_refused(tmp_path):
    with raises(FileNotFoundError, str(tmp_path / "none"), "not found"):
        read_blimp(tmp_path / "none")
    empty = tmp_path / "empty"
    empty.mkdir()
    with raises(FileNotFoundError, str(empty), "no paradigm files", "*.jsonl", "empty"):
        read_blimp(empty)
    zipped = tmp_path / "zipped"
    zipped.mkdir()
    (zipped / "p.jsonl.xz").write_bytes(b"\xfd7zXZ")
    with raises(FileNotFoundError, "no paradigm files", "p.jsonl.xz", "decompress"):
        read_blimp(zipped)
    (zipped / "p.jsonl.gz").write_bytes(gzip.compress((_line() + "\n").encode()))
    assert [p.good for p in read_blimp(zipped)["p"]] == [json.loads(_line())["sentence_good"]]
    _write(zipped, "p.jsonl", [_line()])
    with raises(ValueError, "'p'", "twice"):
        read_blimp(zipped)
    blank = _write(tmp_path / "blank", "p.jsonl", ["", "  "])
    with raises(ValueError, str(blank), "no pairs"):
        read_blimp(blank.parent)
    with raises(NotADirectoryError, str(blank), "is a file"):
        read_blimp(blank)


# ---- examples/blimp.py -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def script():
    return load_example("blimp")


@pytest.fixture
def blimp_dir(tmp_path):
    folder = tmp_path / "blimp"
    _write(folder, "agreement.jsonl", [
        _line(s, b, field="morphology", UID="agreement", pairID=str(k))
        for k, (s, b) in enumerate([("the cat sat on a mat", "the cat sat on a mats"),
                                    ("dogs ran far away", "dogs ran far aways"),
                                    ("birds sang songs", "birds sang song")])])
    _write(folder, "islands.jsonl", [_line("the cat sat", "sat the cat", field="syntax",
                                           UID="islands", pairID="0")])
    return folder


def test_the_script_writes_the_accuracies_and_every_pairs_scores(script, bert_dir, tok,
                                                                 blimp_dir, tmp_path, capsys):
    out = tmp_path / "new" / "results"
    rc = script.main(["--model", str(bert_dir), "--blimp-dir", str(blimp_dir), "--out",
                      str(out), "--max-pairs", "2", "--batch-size", "5"])
    assert (rc, capsys.readouterr().err) == (0, "")
    results = json.loads((out / "results.json").read_text())
    want = evaluate_blimp(minibert.BertForMaskedLM.from_pretrained(bert_dir), tok,
                          read_blimp(blimp_dir), max_pairs=2)
    assert results["overall"] == pytest.approx(want.overall)
    assert results["paradigms"] == want.to_dict()["paradigms"]
    assert results["paradigms"]["agreement"]["pairs"] == 2 and results["max_pairs"] == 2
    assert set(results["fields"]) == {"morphology", "syntax"}
    lines = [json.loads(x) for x in (out / "scores.jsonl").read_text().splitlines()]
    assert [(x["paradigm"], x["pair_id"]) for x in lines] == [
        (s.pair.paradigm, s.pair.pair_id) for s in want.scores]
    assert all(x["correct"] == (x["pll_good"] > x["pll_bad"]) for x in lines)
    assert "| islands | syntax | 1 |" in (out / "results.md").read_text()


@pytest.mark.parametrize("change,facts", [
    (lambda a, d: a + ["--max-pairs", "0"], ["--max-pairs 0", "at least 1"]),
    (lambda a, d: a + ["--batch-size", "-2"], ["--batch-size -2"]),
    (lambda a, d: a[:3] + [str(d / "none")] + a[4:], ["--blimp-dir", "none", "not found"]),
    (lambda a, d: a[:1] + [str(d / "blimp" / "agreement.jsonl")] + a[2:], ["--model", "file"]),
    (lambda a, d: _write(d / "blimp", "broken.jsonl", ['{"sentence_good": "x"}']) and a,
     ["broken.jsonl, line 1", "sentence_bad"]),
])
def test_bad_input_exits_2_before_out_is_made(script, bert_dir, blimp_dir, tmp_path, capsys,
                                              change, facts):
    out = tmp_path / "out"
    argv = ["--model", str(bert_dir), "--blimp-dir", str(blimp_dir), "--out", str(out)]
    rc = script.main(change(argv, tmp_path))
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1
    assert_carries(err, *facts)


def test_a_folder_without_a_masked_lm_head_is_refused(script, bert_dir, blimp_dir, tmp_path,
                                                     capsys):
    """A classifier's folder loads as a masked LM only with a new, random head, whose scores
    are noise: it is refused before --out is made, not scored with a warning."""
    folder = tmp_path / "classifier"
    minibert.BertForSequenceClassification.from_pretrained(bert_dir, num_labels=2
                                                           ).save_pretrained(folder)
    minibert.Tokenizer.from_pretrained(bert_dir).save(folder)
    out = tmp_path / "out"
    rc = script.main(["--model", str(folder), "--blimp-dir", str(blimp_dir), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists() and len(err.strip().splitlines()) == 1
    assert_carries(err, "--model", str(folder), "masked-LM head")


def test_the_docs_snippet_runs(bert_dir, tok, tmp_path, monkeypatch):
    """docs/quality.md's BLiMP section, its python run on a folder of the paradigms it names."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "quality.md").read_text()
    section = text.split("## BLiMP: zero-shot minimal pairs")[1].split("\n## ")[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "blimp" / "data", "passive_1.jsonl",
           [_line("the cat sat", "the cat sat sat", field="syntax", UID="passive_1")])
    namespace = {"model": minibert.BertForMaskedLM.from_pretrained(bert_dir), "tokenizer": tok}
    exec(compile(block, "docs/quality.md", "exec"), namespace)
    assert namespace["result"].pairs == {"passive_1": 1} and len(namespace["pll"]) == 2
