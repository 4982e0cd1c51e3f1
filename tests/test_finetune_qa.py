"""examples/finetune_qa.py end to end: windows, scores, exports, SQuAD 2.0, resume, bad input."""

import json
import random

import pytest
import torch

import minibert
from minibert.data import TaskCollator, best_span, encode_qa, read_squad
from minibert.tasks.metrics import squad_scores
from engine_utils import from_checkpoint, load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries, without

finetune_qa = load_example("finetune_qa")

FILLER = ("the a river town market road hill old new green small big and of in on by with "
          "near far was is there people many some lived built trade").split()
CITIES = "paris rome oslo lima cairo delhi tokyo berlin madrid vienna quito dakar".split()
QUESTION = "what is the capital ?"


def squad(n, seed, unanswerable=0.0, long_every=3):
    """SQuAD JSON of `n` paragraphs: filler words around "the capital is CITY", one question
    each. Every `long_every`-th context is long enough to need several windows at --seq-len 48
    (about 40 context tokens a window); with `unanswerable`, that share of the contexts names
    no capital and their questions are is_impossible."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(50, 80) if i % long_every == 0
                                                   else rng.randint(8, 25))]
        qa = {"id": f"q{seed}-{i}", "question": QUESTION}
        if rng.random() < unanswerable:
            qa.update(is_impossible=True, answers=[])
        else:
            city = rng.choice(CITIES)
            at = rng.randrange(len(words) + 1)
            before = " ".join(words[:at] + ["the capital is"])
            words.insert(at, f"the capital is {city}")
            qa["answers"] = [{"text": city, "answer_start": len(before) + 1}]
        paragraphs.append({"context": " ".join(words), "qas": [qa]})
    return {"version": "test", "data": [{"title": "towns", "paragraphs": paragraphs}]}


def write_json(path, doc):
    path.write_text(json.dumps(doc))
    return path




@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("squad")
    return {"train": write_json(d / "train.json", squad(240, 0)),
            "eval": write_json(d / "dev.json", squad(30, 1)),
            "cache": d / "cache", "dir": d}


def _args(data, out, *extra):
    return ["--train", str(data["train"]), "--eval", str(data["eval"]), "--out", str(out),
            "--cache-dir", str(data["cache"]), "--preset", "tiny", "--vocab-size", "200",
            "--seq-len", "48", "--doc-stride", "16", "--batch-size", "16", "--lr", "2e-3",
            "--warmup-ratio", "0.05", "--log-every", "5", "--no-progress", "--precision",
            "fp32", *extra]


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    assert finetune_qa.main(_args(data, out, "--epochs", "2")) == 0
    return out


def _gold(path, version_2=False):
    return {ex.id: [text for text, _ in ex.answers] for ex in read_squad(path, version_2)}


def test_scores_are_those_of_its_predictions_and_the_task_is_learnt(run, data):
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    evals = [r for r in rows if "exact_match" in r]
    summary = json.loads((run / "eval.json").read_text())
    assert len(evals) == 2 and evals[-1]["step"] == summary["steps"]  # after every epoch
    predictions = json.loads((run / "predictions.json").read_text())
    examples = read_squad(data["eval"])
    assert list(predictions) == [ex.id for ex in examples]
    for ex in examples:  # verbatim spans of the context, mapped back through the offsets
        assert predictions[ex.id] and predictions[ex.id] in ex.context
    rescored = squad_scores(predictions, _gold(data["eval"]))
    assert (summary["exact_match"], summary["f1"]) == (rescored["exact_match"], rescored["f1"])
    assert (summary["exact_match"], summary["f1"]) == (evals[-1]["exact_match"], evals[-1]["f1"])
    assert summary["precision"] == "fp32" and summary["tokens_seen"] > 0
    assert summary["train_windows"] > summary["train_examples"] == 240  # long contexts split
    # The answer is the word after "the capital is": a working pipeline finds it, also
    # where it lies only in a later window of a long context; chance is far below.
    assert summary["exact_match"] >= 80, summary
    tok = minibert.Tokenizer.from_pretrained(run / "final")
    features = encode_qa(tok, examples, max_len=48, doc_stride=16)
    # The windows are those of --seq-len 48 and --doc-stride 16.
    assert summary["train_windows"] == len(encode_qa(tok, read_squad(data["train"]), 48, 16))
    first = {}  # each question's first window
    for f in features:
        first.setdefault(f["example"], f)
    later = [examples[x] for x, f in first.items() if f["start_position"] == 0]
    assert later and all(predictions[ex.id] == ex.answers[0][0] for ex in later)


def test_final_model_loads_in_minibert_and_transformers(run, data):
    final = run / "final"
    tok = minibert.Tokenizer.from_pretrained(final)
    examples = read_squad(data["eval"])
    features = encode_qa(tok, examples, max_len=48, doc_stride=16)
    assert len(features) > len(examples)  # some questions span two or more windows
    batch = TaskCollator(tok.pad_id)(features)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    model = minibert.BertForQuestionAnswering.from_pretrained(final).eval()
    with torch.no_grad():
        ours = model(**inputs)
    # The exported model is the one that made predictions.json.
    spans = best_span(ours.start_logits, ours.end_logits, features, examples)
    assert {p.id: p.text for p in spans} == json.loads((run / "predictions.json").read_text())

    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(final)
    ex = examples[0]
    assert hf_tok(ex.question, ex.context)["input_ids"] == \
        tok.encode_pair(ex.question, ex.context).input_ids
    real = inputs["attention_mask"].bool()  # minibert puts the dtype's minimum on padding
    for cls in (transformers.AutoModelForQuestionAnswering, transformers.BertForQuestionAnswering):
        theirs = cls.from_pretrained(final).eval()
        with torch.no_grad():
            out = theirs(**inputs)
        torch.testing.assert_close(out.start_logits[real], ours.start_logits[real],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.end_logits[real], ours.end_logits[real],
                                   atol=1e-4, rtol=1e-4)


def test_init_from_a_minibert_checkpoint_keeps_its_encoder_and_tokenizer(data, tmp_path):
    ckpt = tmp_path / "mlm"
    doc = json.loads(data["train"].read_text())
    texts = [p["context"] for p in doc["data"][0]["paragraphs"]] + [QUESTION]
    tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=150, use_cache=False)
    config = minibert.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2,
                                 num_heads=4, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(1)
    mlm = minibert.BertForMaskedLM(config)
    mlm.save_pretrained(ckpt, tokenizer=tok)
    out = tmp_path / "run"
    assert finetune_qa.main(from_checkpoint(_args(data, out, "--init-from", str(ckpt),
                                                  "--max-steps", "2", "--lr", "1e-7"))) == 0
    model = minibert.BertForQuestionAnswering.from_pretrained(out / "final")
    assert model.config.hidden_size == 32  # the checkpoint's shape, not a preset's
    assert minibert.Tokenizer.from_pretrained(out / "final").fingerprint == tok.fingerprint
    torch.testing.assert_close(model.bert.blocks[1].ffn.up.weight,
                               mlm.bert.blocks[1].ffn.up.weight, atol=1e-4, rtol=0)


def test_version_2_answers_none_where_the_context_has_no_answer(data, tmp_path, capsys):
    v2 = {s: write_json(tmp_path / f"{s}.json", squad(n, seed, unanswerable=0.4))
          for s, n, seed in (("train", 80, 2), ("eval", 20, 3))}
    assert "pass --version-2" in _error_line(capsys, _args({**data, **v2}, tmp_path / "v1"))
    out = tmp_path / "v2"
    assert finetune_qa.main(_args({**data, **v2}, out, "--version-2", "--max-steps", "3")) == 0
    predictions = json.loads((out / "predictions.json").read_text())
    gold = _gold(v2["eval"], version_2=True)
    examples = read_squad(v2["eval"], version_2=True)
    assert list(predictions) == list(gold) and any(not g for g in gold.values())
    assert all(predictions[ex.id] in ex.context for ex in examples)  # "" is, too
    summary = json.loads((out / "eval.json").read_text())
    rescored = squad_scores(predictions, gold)
    assert (summary["exact_match"], summary["f1"]) == (rescored["exact_match"], rescored["f1"])
    # A threshold no null score can clear answers every question, and one every null score
    # clears answers none: "" scores exactly on the unanswerable questions.
    out2 = tmp_path / "none"
    assert finetune_qa.main(_args({**data, **v2}, out2, "--version-2", "--max-steps", "1",
                                  "--null-score-diff-threshold=-1e9")) == 0
    assert set(json.loads((out2 / "predictions.json").read_text()).values()) == {""}
    share = 100 * sum(not g for g in gold.values()) / len(gold)
    assert json.loads((out2 / "eval.json").read_text())["exact_match"] == pytest.approx(share)


def test_resume_continues_the_same_run_and_refuses_other_windows(data, tmp_path, capsys):
    out = tmp_path / "run"
    small = ("--max-train-examples", "40", "--log-every", "1")
    assert finetune_qa.main(_args(data, out, *small, "--max-steps", "2",
                                  "--decay-steps", "4")) == 0
    err = _error_line(capsys, _args(data, out, *small, "--max-steps", "4", "--resume",
                                    "--doc-stride", "12"))
    assert_carries(err, str(out / "checkpoints"))
    assert_carries(without(err, tmp_path), "--doc-stride", "16", "12")  # then and now
    assert finetune_qa.main(_args(data, out, *small, "--max-steps", "4", "--resume")) == 0
    assert json.loads((out / "eval.json").read_text())["steps"] == 4


def _error_line(capsys, argv):
    code = finetune_qa.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def _one_question(answer_start=11, **qa):
    qa = {"id": "q7", "question": QUESTION,
          "answers": [{"text": "oslo", "answer_start": answer_start}], **qa}
    return {"data": [{"paragraphs": [{"context": "the capital is oslo", "qas": [qa]}]}]}


BAD_FILES = [
    # (name, content, the facts its message must hold besides the file)
    pytest.param("train.json", b"", ["empty"], id="empty"),
    pytest.param("train.json", b'{"data": [', ["line 1", "JSON"], id="not JSON"),
    pytest.param("train.json", b'{"version": "1.1"}', ["'data'"], id="no data"),
    pytest.param("dev.json", json.dumps(_one_question(answer_start=4)).encode(),
                 ["'q7'", "'oslo'", "answer_start 4", "'capi'"], id="answer elsewhere"),
    pytest.param("train.json", json.dumps(_one_question(is_impossible=True, answers=[])).encode(),
                 ["'q7'", "is_impossible", "--version-2"], id="unanswerable"),
]


@pytest.mark.parametrize("name,content,facts", BAD_FILES)
def test_bad_files_get_one_line_naming_file_and_question(data, tmp_path, capsys, name,
                                                         content, facts):
    bad = tmp_path / name
    bad.write_bytes(content)
    files = {"eval" if name.startswith("dev") else "train": bad}
    out = tmp_path / "out"
    err = _error_line(capsys, _args({**data, **files}, out))
    assert_carries(err, str(bad))
    assert_carries(without(err, tmp_path), *facts)
    assert not out.exists()  # nothing is written before the input is known to be good


def test_bad_flags(data, tmp_path, capsys):
    out = tmp_path / "out"
    for extra, facts in [(["--doc-stride", "44"], ["--doc-stride 44", "[0, 44)", "--seq-len 48"]),
                         # after a 6-token question, in the flags' names
                         (["--doc-stride", "40"],
                          ["--seq-len 48", "40 context tokens", "--doc-stride 40"]),
                         (["--max-answer-length", "0"], ["--max-answer-length", "1", "0"]),
                         (["--batch-size", "1000"], ["train.json", "370", "--batch-size"]),
                         (["--resume"], ["--resume", "<path>/out"])]:
        err = _error_line(capsys, _args(data, out, *extra))
        assert_carries(without(err, tmp_path, data["train"].parent), *facts)
