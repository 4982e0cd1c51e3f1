"""Pair tasks on a model without segment embeddings (`type_vocab_size=0`: every
`modernbert-*` preset and every ModernBERT checkpoint). Such a model tells the two texts of a
pair apart by their [SEP] alone, so the collators leave `token_type_ids` out of its batches.
QA and pair classification then train, through the library and through the scripts, and the
exported folders give transformers' ModernBert classes' logits on pair inputs; a second
segment handed to such a model by hand is still refused."""

import csv
import json
import random

import pytest
import torch

import minibert
from minibert.data import MLMCollator, QAExample, TaskCollator, encode_classification, encode_qa
from minibert.interop.export import export_checkpoint
from engine_utils import WORDS, load_example, quick_runs  # noqa: F401 (fixture)
from facts import raises

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

CITIES = "paris rome oslo lima cairo delhi tokyo berlin".split()


def _qa_examples(n, seed):
    """`n` questions "what is the capital ?" over filler words around "the capital is CITY"."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 30))]
        city = rng.choice(CITIES)
        before = " ".join(words[:len(words) // 2] + ["the capital is"])
        context = f"{before} {city} {' '.join(words[len(words) // 2:])}"
        examples.append(QAExample(f"q{seed}-{i}", "what is the capital ?", context,
                                  [(city, len(before) + 1)], False))
    return examples


def _pairs(n, seed):
    """(text, pair, label) rows: label 1 when the pair's word is in the text."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text = rng.sample(WORDS, 5)
        word = rng.choice(text) if rng.random() < 0.5 else rng.choice(WORDS)
        rows.append((" ".join(text), word, int(word in text)))
    return rows


@pytest.fixture(scope="module")
def tok():
    texts = [f"{ex.question} {ex.context}" for ex in _qa_examples(40, 0)]
    return minibert.Tokenizer.train_from_iterator(texts + [" ".join(WORDS)], vocab_size=200,
                                                  use_cache=False)


def _modern(tok):
    return minibert.BertConfig.preset("modernbert-tiny", vocab_size=tok.vocab_size,
                                      pad_token_id=tok.pad_id, max_position_embeddings=64,
                                      local_window=8, global_every=2)


def _features(tok, kind):
    if kind == "qa":
        return encode_qa(tok, _qa_examples(6, 1), max_len=24, doc_stride=8)
    rows = _pairs(8, 1)
    return encode_classification(tok, [r[0] for r in rows], [r[2] for r in rows],
                                 pairs=[r[1] for r in rows], max_len=32)


def _close_at_real(ours, theirs, mask):
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- the collators

def test_which_models_have_segments():
    assert minibert.BertConfig.preset("tiny").has_segments
    for name in ("modernbert-tiny", "modernbert-base"):
        assert not minibert.BertConfig.preset(name).has_segments


@pytest.mark.parametrize("kind", ["qa", "sequence"])
def test_the_task_collator_leaves_segments_out_for_a_model_without_them(tok, kind):
    features = _features(tok, kind)
    with_segments = TaskCollator(tok.pad_id)(features)
    without = TaskCollator(tok.pad_id, segments=False)(features)
    assert with_segments["token_type_ids"].max() == 1  # the features do mark the pair
    assert set(with_segments) - set(without) == {"token_type_ids"}
    for key, value in without.items():
        assert torch.equal(value, with_segments[key]), key


def test_the_mlm_collator_leaves_segments_out_for_a_model_without_them(tok):
    pair = tok.encode_pair("the capital is oslo", "what is the capital ?")
    examples = [{"input_ids": pair.input_ids, "token_type_ids": pair.token_type_ids,
                 "index": 0}, {"input_ids": pair.input_ids[:5], "index": 1}]
    with_segments = MLMCollator(tok, seed=3)(examples)
    without = MLMCollator(tok, seed=3, segments=False)(examples)
    assert with_segments["token_type_ids"].max() == 1
    assert set(with_segments) - set(without) == {"token_type_ids"}
    for key, value in without.items():  # the same masks: segments take no part in them
        assert torch.equal(value, with_segments[key]), key


def test_a_second_segment_is_still_refused_by_a_model_without_segments(tok):
    """Leaving segments out is the collators' decision for the model they feed; a caller who
    hands a segment-less model a second segment anyway would have it silently ignored, so the
    model refuses it. One segment (all zeros) means nothing to such a model and passes."""
    model = minibert.BertForQuestionAnswering(_modern(tok)).eval()
    batch = TaskCollator(tok.pad_id)(_features(tok, "qa"))
    with raises(ValueError, "token_type_ids", "segments=False"):

        model(**batch)
    with torch.no_grad():
        model(**{**batch, "token_type_ids": torch.zeros_like(batch["input_ids"])})
        model(**TaskCollator(tok.pad_id, segments=model.config.has_segments)(
            _features(tok, "qa")))


# ---------------------------------------------------------------- fine-tuned in the library

HEADS = {"qa": (minibert.BertForQuestionAnswering, "ModernBertForQuestionAnswering", {}),
         "sequence": (minibert.BertForSequenceClassification,
                      "ModernBertForSequenceClassification", {"num_labels": 2})}


@pytest.mark.parametrize("kind", ["qa", "sequence"])
def test_a_modern_model_fine_tunes_on_pairs_and_exports_what_transformers_computes(
        tok, tmp_path, kind):
    ours, theirs, head = HEADS[kind]
    torch.manual_seed(0)
    model = ours(_modern(tok), **head)
    collate = TaskCollator(tok.pad_id, segments=model.config.has_segments)
    batch = collate(_features(tok, kind))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(2):
        loss = model(**batch).loss
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[1] < losses[0]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

    model.eval().save_pretrained(tmp_path, tokenizer=tok)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == [theirs]
    hf = getattr(transformers, theirs).from_pretrained(tmp_path, attn_implementation="eager")
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        a, b = model(**inputs), hf.eval()(**inputs)
    if kind == "qa":
        _close_at_real(a.start_logits, b.start_logits, inputs["attention_mask"])
        _close_at_real(a.end_logits, b.end_logits, inputs["attention_mask"])
    else:
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- fine-tuned by the scripts

finetune_qa = load_example("finetune_qa")
finetune_classification = load_example("finetune_classification")
finetune_multitask = load_example("finetune_multitask")


def _squad(path, examples):
    path.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": ex.context, "qas": [{"id": ex.id, "question": ex.question, "answers": [
            {"text": t, "answer_start": s} for t, s in ex.answers]}]} for ex in examples]}]}))
    return path


def _tsv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["premise", "hypothesis", "label"])
        w.writerows(rows)
    return path


def _run(script, tmp_path, *argv):
    out = tmp_path / "out"
    common = ["--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--batch-size", "4",
              "--max-steps", "2", "--no-progress", "--precision", "fp32", "--lr", "1e-3"]
    assert script.main([*argv, *common]) == 0
    return out


def test_the_qa_script_fine_tunes_a_modern_preset_and_exports_what_transformers_computes(
        tmp_path):
    examples = _qa_examples(12, 2)
    data = _squad(tmp_path / "train.json", examples)
    out = _run(finetune_qa, tmp_path, "--train", str(data), "--eval", str(data), "--preset",
               "modernbert-tiny", "--vocab-size", "200", "--seq-len", "32", "--doc-stride", "8")
    assert json.loads((out / "eval.json").read_text())["steps"] == 2
    final = out / "final"
    tok = minibert.Tokenizer.from_pretrained(final)
    features = encode_qa(tok, examples, max_len=32, doc_stride=8)
    batch = TaskCollator(tok.pad_id, segments=False)(features)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    ours = minibert.BertForQuestionAnswering.from_pretrained(final).eval()
    predictions = json.loads((out / "predictions.json").read_text())
    with torch.no_grad():
        a = ours(**inputs)
    spans = minibert.data.best_span(a.start_logits, a.end_logits, features, examples)
    assert {s.id: s.text for s in spans} == predictions  # final/ is the model that answered
    # The last checkpoint, exported, is the same model: both folders load in transformers.
    checkpoint = sorted((out / "checkpoints").glob("step_*"))[-1]
    exported = export_checkpoint(checkpoint, tmp_path / "exported")
    for folder in (final, exported):
        hf = transformers.ModernBertForQuestionAnswering.from_pretrained(
            folder, attn_implementation="eager").eval()
        with torch.no_grad():
            b = hf(**inputs)
        _close_at_real(a.start_logits, b.start_logits, inputs["attention_mask"])
        _close_at_real(a.end_logits, b.end_logits, inputs["attention_mask"])


def test_the_classification_script_fine_tunes_a_modern_preset_on_pairs(tmp_path):
    rows = _pairs(16, 2)
    data = _tsv(tmp_path / "train.tsv", rows)
    out = _run(finetune_classification, tmp_path, "--train", str(data), "--eval", str(data),
               "--text-column", "premise", "--text-pair-column", "hypothesis",
               "--label-column", "label", "--preset", "modernbert-tiny", "--vocab-size", "200",
               "--seq-len", "32")
    assert json.loads((out / "eval.json").read_text())["steps"] == 2
    final = out / "final"
    tok = minibert.Tokenizer.from_pretrained(final)
    names = json.loads((out / "labels.json").read_text())["id2label"]
    features = encode_classification(tok, [r[0] for r in rows], pairs=[r[1] for r in rows],
                                     max_len=32)
    inputs = TaskCollator(tok.pad_id, segments=False)(features)
    ours = minibert.BertForSequenceClassification.from_pretrained(final).eval()
    hf = transformers.ModernBertForSequenceClassification.from_pretrained(
        final, attn_implementation="eager").eval()
    with torch.no_grad():
        a, b = ours(**inputs).logits, hf(**inputs).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    with open(out / "predictions.tsv") as f:  # final/ is the model that predicted
        predicted = [r["prediction"] for r in csv.DictReader(f, delimiter="\t")]
    assert predicted == [names[i] for i in a.argmax(-1).tolist()]


def test_the_multitask_script_fine_tunes_a_model_without_segments_on_pairs(tmp_path):
    """BertMultiTask builds BERT's heads, so its model without segments is a BERT with
    `type_vocab_size=0`: started from such a checkpoint, a pair task trains."""
    rows = _pairs(16, 3)
    data = _tsv(tmp_path / "train.tsv", rows)
    tok = minibert.Tokenizer.train_from_iterator([r[0] for r in rows] + [" ".join(WORDS)],
                                                 vocab_size=200, use_cache=False)
    config = minibert.BertConfig.preset("tiny", vocab_size=tok.vocab_size,
                                        pad_token_id=tok.pad_id, type_vocab_size=0)
    minibert.BertForMaskedLM(config).save_pretrained(tmp_path / "mlm", tokenizer=tok)
    out = _run(finetune_multitask, tmp_path, "--task", f"nli:sequence:{data}:{data}",
               "--text-column", "premise", "--text-pair-column", "hypothesis",
               "--label-column", "label", "--init-from", str(tmp_path / "mlm"),
               "--seq-len", "32")
    exported = minibert.BertForSequenceClassification.from_pretrained(out / "final" / "nli")
    assert exported.config.type_vocab_size == 0
