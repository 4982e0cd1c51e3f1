"""examples/finetune_token_classification.py end to end: a learnable NER task, the word
alignment and windows checked against an independent re-run of final/, resume, bad input."""

import json
import random

import pytest
import torch

import minibert
from minibert.tasks.metrics import accuracy, span_f1
from engine_utils import from_checkpoint, load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries, without

script = load_example("finetune_token_classification")

FILLER = "the a met saw with and from in at today later he she they spoke to about".split()
FIRST = ["ann", "bob", "maximilian", "bartholomew", "konstantinos", "guinevere"]
LAST = ["smith", "oppenheimer", "vanderbilt", "schwarzenegger"]
CITIES = ["rome", "kathmandu", "ouagadougou"]
SEQ_LEN = 16  # pieces per window: the long eval sentence needs several


def sentence(rng, n_filler):
    """(word, tag) pairs: filler words (O) around a person (B-PER [I-PER]) and a city."""
    words = [(rng.choice(FILLER), "O") for _ in range(n_filler)]
    person = [(rng.choice(FIRST), "B-PER")] + \
        ([(rng.choice(LAST), "I-PER")] if rng.random() < 0.6 else [])
    at = rng.randrange(len(words) + 1)
    words[at:at] = person
    words.insert(rng.randrange(len(words) + 1), (rng.choice(CITIES), "B-LOC"))
    return words


def write_conll(path, sentences, sep=" "):
    path.write_text("-DOCSTART- -X- O O\n\n" + "\n\n".join(
        "\n".join(f"{w}{sep}{t}" for w, t in s) for s in sentences) + "\n")
    return path


def read_predictions(path):
    """predictions.conll as sentences of (word, gold, predicted)."""
    blocks = path.read_text().split("\n\n")
    return [[tuple(line.split("\t")) for line in b.splitlines()] for b in blocks if b.strip()]




@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("ner")
    rng = random.Random(0)
    train = [sentence(rng, rng.randint(3, 8)) for _ in range(160)]
    dev = [sentence(rng, rng.randint(3, 8)) for _ in range(30)]
    long = sentence(rng, 24) + sentence(rng, 10)  # about 40 pieces: 3+ windows of 14
    return {"train": write_conll(d / "train.conll", train),
            "eval": write_conll(d / "dev.conll", dev + [long], sep="\t"),
            "dev": dev + [long], "cache": d / "cache", "dir": d}


def _args(task, out, *extra):
    return from_checkpoint([
        "--train", str(task["train"]), "--eval", str(task["eval"]), "--out", str(out),
        "--cache-dir", str(task["cache"]), "--preset", "tiny", "--vocab-size", "150",
        "--seq-len", str(SEQ_LEN), "--batch-size", "16", "--lr", "2e-3", "--log-every",
        "5", "--no-progress", "--precision", "fp32", *extra])


@pytest.fixture(scope="module")
def run(task, tmp_path_factory):
    """One run from scratch: 3 epochs of 12 steps (160 sentences in 178 windows of 16 pieces:
    11 full batches and one of 2, as every window is used each epoch)."""
    out = tmp_path_factory.mktemp("run") / "out"
    assert script.main(_args(task, out, "--epochs", "3", "--micro-batch-size", "8")) == 0
    return out


def test_reports_scores_that_recount_from_the_predictions_file(run, task):
    summary = json.loads((run / "eval.json").read_text())
    assert {"f1", "entity_precision", "entity_recall", "accuracy", "per_type", "steps",
            "tokens_seen", "wall_seconds", "precision"} <= set(summary)
    assert summary["precision"] == "fp32" and summary["steps"] == 36
    assert summary["labels"] == ["B-LOC", "B-PER", "I-PER", "O"]
    preds = read_predictions(run / "predictions.conll")
    # One line per eval word, in the file's order, with the file's gold tag.
    assert [[(w, g) for w, g, _ in s] for s in preds] == task["dev"]
    gold = [[g for _, g, _ in s] for s in preds]
    pred = [[p for _, _, p in s] for s in preds]
    scores = span_f1(gold, pred, "IOB2")
    # JSON keeps a float's every bit: the numbers must be equal, not close.
    assert (summary["f1"], summary["entity_precision"], summary["entity_recall"]) == \
        (scores["f1"], scores["precision"], scores["recall"])
    assert summary["per_type"] == scores["per_type"] and set(scores["per_type"]) == {"LOC", "PER"}
    names = summary["labels"]
    assert summary["accuracy"] == (accuracy(
        [names.index(t) for s in gold for t in s], [names.index(t) for s in pred for t in s]))
    # The tag is the word's identity (and B/I its place): a working pipeline learns it, and
    # a misaligned one (labels on the wrong pieces) would not.
    assert summary["f1"] >= 0.8, summary
    evals = [json.loads(r) for r in open(run / "metrics.jsonl") if '"f1"' in r]
    assert [r["step"] for r in evals] == [12, 24, 36] and evals[-1]["f1"] == summary["f1"]


def _windows(tok, words, seq_len):
    """Independent of the library: pieces of each word, packed greedily into windows of
    whole words; (input_ids, first-piece positions) per window."""
    pieces = [tok.encode(w, add_special_tokens=False) for w in words]
    out, ids, firsts = [], [], []
    for p in pieces:
        if ids and len(ids) + len(p) > seq_len - 2:
            out.append(([tok.cls_id] + ids + [tok.sep_id], firsts))
            ids, firsts = [], []
        firsts.append(len(ids) + 1)
        ids += p
    return out + [([tok.cls_id] + ids + [tok.sep_id], firsts)]


def test_final_model_reproduces_each_word_once_over_windows(run, task):
    transformers = pytest.importorskip("transformers")
    ours = minibert.BertForTokenClassification.from_pretrained(run / "final").eval()
    theirs = transformers.BertForTokenClassification.from_pretrained(run / "final").eval()
    assert theirs.config.id2label == dict(enumerate(["B-LOC", "B-PER", "I-PER", "O"]))
    tok = minibert.Tokenizer.from_pretrained(run / "final")
    preds = read_predictions(run / "predictions.conll")
    split = {w for s in task["dev"] for w, _ in s
             if len(tok.encode(w, add_special_tokens=False)) > 1}
    assert len(split) >= 3, split  # words of several pieces, each still predicted once
    n_windows = []
    for s, pred in zip(task["dev"], preds):
        windows = _windows(tok, [w for w, _ in s], SEQ_LEN)
        n_windows.append(len(windows))
        predicted = []
        for ids, firsts in windows:
            x = torch.tensor([ids])
            with torch.no_grad():
                logits = ours(x).logits
                torch.testing.assert_close(theirs(x).logits, logits, atol=1e-4, rtol=1e-4)
            predicted += [ours.id2label[i] for i in logits[0, firsts].argmax(-1).tolist()]
        assert predicted == [p for _, _, p in pred]
    assert n_windows[-1] >= 3  # the long sentence is split
    summary = json.loads((run / "eval.json").read_text())
    assert summary["eval_windows"] == sum(n_windows) and summary["train_windows"] == 178


def test_init_from_a_checkpoint_keeps_its_tokenizer_and_encoder(task, tmp_path):
    ckpt = tmp_path / "mlm"
    tok = minibert.Tokenizer.train_from_iterator(FILLER + FIRST + LAST + CITIES, vocab_size=80,
                                                 use_cache=False)
    # Positions for one window only: the long eval sentence must be cut, or it fails.
    config = minibert.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2,
                                 num_heads=4, intermediate_size=64,
                                 max_position_embeddings=SEQ_LEN)
    torch.manual_seed(1)
    mlm = minibert.BertForMaskedLM(config)
    mlm.save_pretrained(ckpt, tokenizer=tok)
    out = tmp_path / "run"
    assert script.main(_args(task, out, "--init-from", str(ckpt), "--max-steps", "2", "--lr",
                             "1e-7")) == 0
    model = minibert.BertForTokenClassification.from_pretrained(out / "final")
    assert model.config.hidden_size == 32
    assert minibert.Tokenizer.from_pretrained(out / "final").fingerprint == tok.fingerprint
    torch.testing.assert_close(model.bert.blocks[1].ffn.up.weight,
                               mlm.bert.blocks[1].ffn.up.weight, atol=1e-4, rtol=0)
    # A tagger of other tags as the start: its encoder is kept, its head (3 tags) replaced.
    other = minibert.BertForTokenClassification(config, 3, id2label=["B-X", "I-X", "O"])
    other.save_pretrained(tmp_path / "other", tokenizer=tok)
    assert script.main(_args(task, tmp_path / "again", "--init-from", str(tmp_path / "other"),
                             "--max-steps", "1", "--lr", "1e-7")) == 0
    again = minibert.BertForTokenClassification.from_pretrained(tmp_path / "again" / "final")
    assert again.id2label == ["B-LOC", "B-PER", "I-PER", "O"]
    torch.testing.assert_close(again.bert.blocks[0].ffn.up.weight,
                               other.bert.blocks[0].ffn.up.weight, atol=1e-4, rtol=0)
    long = task["dev"][-1]
    assert len(tok.encode(" ".join(w for w, _ in long))) > 2 * SEQ_LEN
    assert [w for w, *_ in read_predictions(out / "predictions.conll")[-1]] == \
        [w for w, _ in long]


def _error_line(capsys, argv):
    code = script.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_resume_refuses_another_training_file(task, tmp_path, capsys):
    out = tmp_path / "run"
    small = ("--max-train-examples", "32", "--max-steps", "2")
    assert script.main(_args(task, out, *small)) == 0
    rng = random.Random(5)
    other = write_conll(tmp_path / "other.conll", [sentence(rng, 4) for _ in range(40)])
    err = _error_line(capsys, _args({**task, "train": other}, out, *small, "--resume"))
    assert_carries(err, str(out / "checkpoints"), "train file")
    fewer = write_conll(tmp_path / "fewer.conll", [[("ann", "B-PER"), ("spoke", "O")]] * 40)
    err = _error_line(capsys, _args({**task, "train": fewer, "eval": fewer}, out, "--resume"))
    # the tags the run was trained on, the file, and its tags
    assert_carries(err, "['B-LOC', 'B-PER', 'I-PER', 'O']", str(fewer), "['B-PER', 'O']")


def test_bio_and_iob2_name_one_scheme_on_resume(task, tmp_path):
    """--help says BIO is IOB2: a run started with one resumes under the other."""
    out = tmp_path / "run"
    assert script.main(_args(task, out, "--max-train-examples", "32", "--max-steps", "1",
                             "--scheme", "BIO")) == 0
    assert script.main(_args(task, out, "--max-train-examples", "32", "--max-steps", "2",
                             "--scheme", "IOB2", "--resume")) == 0


BAD = [
    # (which file, content, extra flags, the facts its message must hold besides the file)
    pytest.param("train", "ann B-PER\nspoke\n", [], ["line 2", "one column", "'spoke'"],
                 id="one column"),
    pytest.param("train", "ann PER\nspoke O\n", [], ["line 1", "'PER'", "'IOB2'"],
                 id="tag outside IOB2"),
    pytest.param("train", "ann B-PER\nspoke O\n", ["--scheme", "IO"],
                 ["line 1", "'B-PER'", "'IO'"], id="tag outside IO"),
    pytest.param("train", "", [], ["empty"], id="empty"),
    pytest.param("train", "-DOCSTART- O\n\n", [], ["no sentences", "-DOCSTART-"],
                 id="no sentences"),
    pytest.param("train", "spoke O\nto O\n", [], ["'O'", "two classes"], id="one class"),
    pytest.param("eval", "ann B-PER\n\nin O\nlondon B-CITY\n", [],
                 ["line 4", "'B-CITY'", "train.conll", "'B-LOC', 'B-PER', 'I-PER', 'O'"],
                 id="unknown label"),
]


@pytest.mark.parametrize("which,content,extra,facts", BAD)
def test_bad_input_is_one_line_and_touches_nothing(task, run, tmp_path, capsys, which,
                                                   content, extra, facts):
    bad = tmp_path / ("train.conll" if which == "train" else "dev.conll")
    bad.write_text(content)
    files = {**task, which: bad}
    out = tmp_path / "out"
    err = _error_line(capsys, _args(files, out, *extra))
    assert_carries(err, str(bad))
    assert_carries(without(err, tmp_path), *facts)
    assert not out.exists()  # the files are checked before --out is created
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    _error_line(capsys, _args(files, run, *extra, "--resume"))  # a run's folder stays as it was
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
