"""examples/finetune_classification.py end to end: a learnable task, --init-from, bad input."""

import csv
import json
import random
import sys
from pathlib import Path

import pytest
import torch

import minibert
from minibert.tasks.metrics import classification_scores
from engine_utils import load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries, without

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "finetune_classification.py"
FILLER = ("the a movie film story plot actor scene was is and it this that very quite really "
          "with of to in for on by at some").split()
KEYWORDS = {"neg": ["awful", "boring", "terrible"], "neu": ["average", "okay", "fine"],
            "pos": ["great", "lovely", "superb"]}


finetune = load_example("finetune_classification")


def sentences(n, seed, labels):
    """(text, label): filler words around one keyword of the label; labels alternate."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = labels[i % len(labels)]
        words = [rng.choice(FILLER) for _ in range(rng.randint(4, 14))]
        words.insert(rng.randrange(len(words) + 1), rng.choice(KEYWORDS[label]))
        rows.append((" ".join(words), label))
    rng.shuffle(rows)
    return rows


def write_tsv(path, rows, header=("sentence", "label")):
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))
    return path




@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("task")
    labels = ("neg", "neu", "pos")
    return {"train": write_tsv(d / "train.tsv", sentences(256, 0, labels)),
            "eval": write_tsv(d / "dev.tsv", sentences(60, 1, labels)),
            "cache": d / "cache"}


def _args(task, out, *extra):
    return ["--train", str(task["train"]), "--eval", str(task["eval"]), "--text-column",
            "sentence", "--label-column", "label", "--out", str(out), "--cache-dir",
            str(task["cache"]), "--preset", "tiny", "--vocab-size", "200", "--seq-len", "32",
            "--batch-size", "16", "--lr", "1e-3", "--log-every", "5", "--no-progress",
            "--precision", "fp32", *extra]


@pytest.fixture(scope="module")
def run(task, tmp_path_factory):
    """One run from scratch: 4 epochs of 16 steps, two micro-batches of 8 per step."""
    out = tmp_path_factory.mktemp("run") / "out"
    assert finetune.main(_args(task, out, "--epochs", "4", "--micro-batch-size", "8")) == 0
    return out


def test_reports_every_epoch_and_learns_the_task(run):
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    evals = [r for r in rows if "accuracy" in r]
    assert [r["step"] for r in evals] == [16, 32, 48, 64]  # 256 // 16 steps per epoch
    assert all(0 <= r["accuracy"] <= 1 and 0 <= r["f1"] <= 1 for r in evals)
    summary = json.loads((run / "eval.json").read_text())
    assert summary["labels"] == ["neg", "neu", "pos"]
    assert (summary["accuracy"], summary["f1"]) == (evals[-1]["accuracy"], evals[-1]["f1"])
    assert summary["steps"] == 64 and summary["eval_examples"] == 60
    # Three balanced classes: chance is 1/3. The keyword decides the label, so a working
    # pipeline learns it; shuffled labels or a broken head would stay near chance.
    assert summary["accuracy"] >= 0.8 and summary["f1"] >= 0.8
    assert evals[0]["accuracy"] < summary["accuracy"]


def test_reported_scores_match_a_hand_count_of_the_predictions(run, task):
    with open(run / "predictions.tsv", newline="") as f:
        preds = list(csv.DictReader(f, delimiter="\t"))
    truth = task["eval"].read_text().splitlines()
    assert len(preds) == 60
    for p in preds:  # each prediction is aligned with its line of the eval file
        assert truth[int(p["line"]) - 1].split("\t")[1] == p["label"]
    f1s = []
    for c in ("neg", "neu", "pos"):
        tp = sum(p["label"] == c and p["prediction"] == c for p in preds)
        fp = sum(p["label"] != c and p["prediction"] == c for p in preds)
        fn = sum(p["label"] == c and p["prediction"] != c for p in preds)
        f1s.append(2 * tp / (2 * tp + fp + fn))
    summary = json.loads((run / "eval.json").read_text())
    assert summary["f1"] == pytest.approx(sum(f1s) / 3)
    assert summary["accuracy"] == pytest.approx(
        sum(p["label"] == p["prediction"] for p in preds) / 60)


def test_macro_f1_by_hand():
    # The script reports minibert.tasks.metrics.classification_scores; these are its numbers.
    # class 0: TP 2, FP 0, FN 1 -> 4/5; class 1: TP 1, FP 1, FN 1 -> 1/2; class 2: TP 1,
    # FP 1, FN 0 -> 2/3; class 3 is neither true nor predicted and does not count.
    s = classification_scores([0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 2, 2], num_labels=4)
    assert s["f1"] == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)
    assert s["accuracy"] == pytest.approx(4 / 6)
    assert s["per_class"][0] == {"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3}
    # A class that is predicted but never true counts, with F1 0.
    assert classification_scores([0, 0], [0, 1], 2)["f1"] == pytest.approx(1 / 3)


def test_final_model_loads_with_its_labels_and_reproduces_the_predictions(run, task):
    model = minibert.BertForSequenceClassification.from_pretrained(run / "final").eval()
    tok = minibert.Tokenizer.from_pretrained(run / "final")
    assert model.id2label == ["neg", "neu", "pos"]
    texts = [line.split("\t")[0] for line in task["eval"].read_text().splitlines()[1:]]
    ids = [tok.encode(t) for t in texts]
    T = max(map(len, ids))
    input_ids = torch.tensor([x + [tok.pad_id] * (T - len(x)) for x in ids])
    mask = (input_ids != tok.pad_id).long()
    with torch.no_grad():
        logits = model(input_ids, mask).logits
    with open(run / "predictions.tsv", newline="") as f:
        expected = [p["prediction"] for p in csv.DictReader(f, delimiter="\t")]
    assert [model.id2label[i] for i in logits.argmax(-1).tolist()] == expected

    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForSequenceClassification.from_pretrained(run / "final").eval()
    assert theirs.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert theirs.config.label2id == {"neg": 0, "neu": 1, "pos": 2}
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids, attention_mask=mask).logits, logits,
                                   atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def pair_task(tmp_path_factory):
    """A CSV sentence-pair task with integer labels (2 and 10), quoted commas, and "02"."""
    d = tmp_path_factory.mktemp("pairs")
    names = {"neg": "2", "pos": "10"}

    def write(path, rows):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["premise", "hypothesis", "y"])
            for i, (text, label) in enumerate(rows):
                y = "02" if i == 0 and label == "neg" else names[label]  # "02" is class 2
                w.writerow([text.replace(" ", ", ", 1), "some other words", y])
        return path

    rows = sentences(64, 2, ("neg", "pos"))
    return {"train": write(d / "train.csv", rows), "eval": write(d / "dev.csv", rows[:16]),
            "cache": d / "cache", "dir": d}


def _pair_args(pair_task, out, init_from, *extra):
    return ["--train", str(pair_task["train"]), "--eval", str(pair_task["eval"]),
            "--text-column", "premise", "--text-pair-column", "hypothesis", "--label-column",
            "y", "--out", str(out), "--init-from", str(init_from), "--seq-len", "24",
            "--batch-size", "8", "--no-progress", "--precision", "fp32", *extra]


def _mlm_checkpoint(ckpt, dropout):
    """A small masked LM saved with its tokenizer in `ckpt`: (tokenizer, config, model)."""
    texts = [t for t, _ in sentences(64, 2, ("neg", "pos"))]
    tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=150, use_cache=False)
    config = minibert.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2,
                                 num_heads=4, intermediate_size=64, max_position_embeddings=64,
                                 hidden_dropout=dropout, attention_dropout=dropout)
    torch.manual_seed(1)
    mlm = minibert.BertForMaskedLM(config)
    mlm.save_pretrained(ckpt)
    tok.save(ckpt)
    return tok, config, mlm


@pytest.mark.parametrize("pretrained_dropout", [0.0, 0.1])
def test_from_a_checkpoint_the_dropout_is_its_own_unless_given(pair_task, tmp_path,
                                                              pretrained_dropout):
    """Without --dropout a checkpoint fine-tunes at its own rate, as transformers'
    from_pretrained does: 0 after the main job, which pretrains without dropout, and BERT's
    0.1 after BERT's pretraining."""
    ckpt = tmp_path / "mlm"
    _mlm_checkpoint(ckpt, dropout=pretrained_dropout)
    out = tmp_path / "run"
    assert finetune.main(_pair_args(pair_task, out, ckpt, "--max-steps", "1")) == 0
    config = minibert.BertForSequenceClassification.from_pretrained(out / "final").config
    assert config.hidden_dropout == config.attention_dropout == pretrained_dropout


def test_init_from_a_minibert_checkpoint(pair_task, tmp_path, allocator_calls):
    ckpt = tmp_path / "mlm"
    tok, config, mlm = _mlm_checkpoint(ckpt, dropout=0.05)
    out = tmp_path / "run"
    # A learning rate so small that two steps leave the encoder where the checkpoint put it.
    assert finetune.main(_pair_args(pair_task, out, ckpt, "--max-steps", "2", "--lr", "1e-7",
                                    "--precision", "bf16", "--keep-freed-memory",
                                    "--dropout", "0.25")) == 0
    assert allocator_calls == [True]
    model = minibert.BertForSequenceClassification.from_pretrained(out / "final")
    assert model.id2label == ["2", "10"]  # sorted as numbers; "02" in the file is class 2
    assert model.config.hidden_size == 32  # the checkpoint's shape, not a preset's
    assert model.config.hidden_dropout == model.config.attention_dropout == 0.25  # --dropout
    assert minibert.Tokenizer.from_pretrained(out / "final").fingerprint == tok.fingerprint
    torch.testing.assert_close(model.bert.blocks[1].ffn.up.weight, mlm.bert.blocks[1].ffn.up.weight,
                               atol=1e-4, rtol=0)
    summary = json.loads((out / "eval.json").read_text())
    assert summary["labels"] == ["2", "10"] and summary["steps"] == 2

    # A classifier for other labels as the starting point: its encoder is kept, its head
    # (three classes, a 32 x 3 matrix) replaced by a new one for these two.
    out2 = tmp_path / "again"
    three = minibert.BertForSequenceClassification(config, 3, id2label=["a", "b", "c"])
    three.save_pretrained(tmp_path / "three")
    tok.save(tmp_path / "three")
    assert finetune.main(_pair_args(pair_task, out2, tmp_path / "three", "--max-steps",
                                    "1")) == 0
    again = minibert.BertForSequenceClassification.from_pretrained(out2 / "final")
    assert again.num_labels == 2
    # the checkpoint's own dropout, 0.05, where --dropout is not given
    assert again.config.hidden_dropout == again.config.attention_dropout == 0.05


def test_random_weights_beside_init_from_change_the_weights_alone(pair_task, tmp_path):
    """The untrained baseline for a checkpoint: its config, tokenizer and settings, new
    weights drawn from --seed, and the checkpoint's dropout whichever the weights."""
    ckpt = tmp_path / "mlm"
    tok, config, mlm = _mlm_checkpoint(ckpt, dropout=0.0)
    steps = ("--max-steps", "2", "--lr", "1e-7", "--seed", "3")
    runs = {}
    for name, extra in (("pretrained", ()), ("random", ("--random-weights",))):
        assert finetune.main(_pair_args(pair_task, tmp_path / name, ckpt, *steps, *extra)) == 0
        runs[name] = minibert.BertForSequenceClassification.from_pretrained(
            tmp_path / name / "final")
        assert minibert.Tokenizer.from_pretrained(
            tmp_path / name / "final").fingerprint == tok.fingerprint
    for model in runs.values():  # the checkpoint's shape and its own dropout, 0
        assert model.config.hidden_size == 32 and model.config.num_layers == 2
        assert model.config.hidden_dropout == model.config.attention_dropout == 0.0
    # What --seed 3 draws for a new classifier of that config: the random run's start, which
    # two steps at 1e-7 hardly move; the pretrained run kept the checkpoint's encoder.
    minibert.set_seed(3)
    fresh = minibert.BertForSequenceClassification(config, 2, id2label=["2", "10"])
    weight = lambda m: m.bert.blocks[1].ffn.up.weight  # noqa: E731
    torch.testing.assert_close(weight(runs["random"]), weight(fresh), atol=1e-4, rtol=0)
    torch.testing.assert_close(weight(runs["pretrained"]), weight(mlm), atol=1e-4, rtol=0)
    assert (weight(runs["random"]) - weight(mlm)).abs().max() > 1e-2


def test_random_weights_need_a_checkpoint(task, tmp_path, capsys):
    err = _error_line(capsys, _args(task, tmp_path / "out", "--random-weights"))
    assert_carries(err, "--random-weights", "--init-from", "--preset")
    assert not (tmp_path / "out").exists()


def test_init_from_a_transformers_checkpoint_with_vocab_txt(pair_task, tmp_path):
    transformers = pytest.importorskip("transformers")
    ckpt = tmp_path / "hf"
    texts = [t for t, _ in sentences(64, 2, ("neg", "pos"))]
    tok = minibert.Tokenizer.train_from_iterator(texts, vocab_size=150, use_cache=False)
    tok.save(ckpt)
    (ckpt / "tokenizer.json").unlink()  # transformers' BERT checkpoints ship a vocab.txt
    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64))
    hf.save_pretrained(ckpt)
    out = tmp_path / "run"
    assert finetune.main(_pair_args(pair_task, out, ckpt, "--epochs", "1",
                                    "--max-train-examples", "40")) == 0
    summary = json.loads((out / "eval.json").read_text())
    assert summary["train_examples"] == 40 and summary["steps"] == 40 // 8


def _rows(out):
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def test_extending_a_run_keeps_its_schedule_and_refuses_other_data(task, tmp_path, capsys):
    """--epochs 1 with the horizon of 2 epochs, resumed to 2 == an uninterrupted 2 epochs."""
    small = ("--max-train-examples", "64", "--log-every", "1")
    ref = tmp_path / "ref"
    assert finetune.main(_args(task, ref, *small, "--epochs", "2")) == 0
    out = tmp_path / "run"
    assert finetune.main(_args(task, out, *small, "--epochs", "1", "--decay-steps", "8")) == 0
    tokenizer = (out / "tokenizer" / "tokenizer.json").read_bytes()
    assert finetune.main(_args(task, out, *small, "--epochs", "2", "--resume")) == 0
    assert [r["step"] for r in _rows(out) if "f1" in r] == [4, 8]  # epoch 1, then epoch 2
    assert [(r["step"], r["lr"], r["loss"]) for r in _rows(out) if "lr" in r] == \
        [(r["step"], r["lr"], r["loss"]) for r in _rows(ref) if "lr" in r]
    assert json.loads((out / "eval.json").read_text())["steps"] == 8
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == tokenizer
    two = write_tsv(tmp_path / "two.tsv", sentences(64, 3, ("neg", "pos")))
    err = _error_line(capsys, _args({**task, "train": two, "eval": two}, out, "--resume"))
    assert_carries(err, "['neg', 'neu', 'pos']", str(two), "['neg', 'pos']")  # then and now
    # The same labels from another file, or other columns' settings: another run.
    other = write_tsv(tmp_path / "other.tsv", sentences(80, 7, ("neg", "neu", "pos")))
    err = _error_line(capsys, _args({**task, "train": other}, out, *small, "--epochs", "3",
                                    "--resume"))
    assert_carries(err, str(out / "checkpoints"), "train file")
    err = _error_line(capsys, _args(task, out, "--max-train-examples", "72", "--epochs", "3",
                                    "--resume"))
    assert_carries(without(err, tmp_path), "--max-train-examples", "64", "72")


def test_steps_past_the_horizon_run_at_min_lr(task, tmp_path):
    """Resumed further without a horizon set at the start: the rate never climbs back."""
    out = tmp_path / "run"
    small = ("--max-train-examples", "64", "--log-every", "1", "--min-lr", "1e-5")
    assert finetune.main(_args(task, out, *small, "--epochs", "1")) == 0
    first = [r["lr"] for r in _rows(out) if "lr" in r]
    assert finetune.main(_args(task, out, *small, "--epochs", "2", "--resume")) == 0
    lrs = [r["lr"] for r in _rows(out) if "lr" in r]
    assert lrs[:4] == first and lrs[3:] == [1e-5] * 5


def _error_line(capsys, argv):
    code = finetune.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


BAD_FILES = [
    # (file name, content, the facts its message must hold besides the file: the line, the
    # field or value at fault)
    pytest.param("train.tsv", b"", ["empty"], id="empty"),
    pytest.param("train.tsv", b"sentence\tlabel\n\n", ["no data rows"], id="header only"),
    pytest.param("train.tsv", b"text\tlabel\nthe great film\tpos\n",
                 ["'sentence'", "'text', 'label'"], id="no column"),
    pytest.param("train.tsv", b"sentence\tlabel\na great film\tpos\na fine film\tpos\n",
                 ["'pos'", "two classes"], id="one class"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\nawful\tneg\tmore\n",
                 ["line 3", "3 field(s)", "2"], id="extra field"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\n \tneg\n",
                 ["line 3", "'sentence'", "empty"], id="empty text"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\nawful\t\n",
                 ["line 3", "'label'", "empty"], id="empty label"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\nawf\xffl\tneg\n",
                 ["line 3", "UTF-8", "0xff"], id="not UTF-8"),
    pytest.param("train.csv", b'sentence,label\ngreat,pos\n"awful" film,neg\n',
                 ["line 3", "unreadable"], id="bad quoting"),
    pytest.param("train.csv", b"sentence,label\ngreat,pos\nawful, boring,neg\n",
                 ["line 3", "3 field(s)", "quote"], id="unquoted comma"),
    pytest.param("train.txt", b"sentence\tlabel\ngreat\tpos\n", ["'.txt'", ".tsv", ".csv"],
                 id="unknown extension"),
    pytest.param("dev.tsv", b"sentence\tlabel\ngreat\tpos\n\nso so\tmixed\n",
                 ["line 4", "'mixed'", "train.tsv", "'neg', 'neu', 'pos'"], id="unknown label"),
]


@pytest.mark.parametrize("name,content,facts", BAD_FILES)
def test_bad_files_get_one_line_naming_file_and_line(task, tmp_path, capsys, name, content,
                                                     facts):
    bad = tmp_path / name
    bad.write_bytes(content)
    files = {"train": task["train"], "eval": task["eval"]}
    files["eval" if name.startswith("dev") else "train"] = bad
    out = tmp_path / "out"
    err = _error_line(capsys, _args({**task, **files}, out))
    assert_carries(err, str(bad))
    assert_carries(without(err, tmp_path), *facts)
    assert not out.exists()  # nothing is written before the input is known to be good


def test_bad_flags_and_existing_runs(task, run, tmp_path, capsys):
    out = tmp_path / "out"
    cases = [  # (the flags, the facts: each flag with its value, the file, the folder)
        (["--micro-batch-size", "5"], ["--batch-size 16", "--micro-batch-size 5"]),
        # TrainConfig's own checks, in the flags' names
        (["--batch-size", "0"], ["--batch-size 0", ">= 1"]),
        (["--min-lr", "0.1", "--lr", "0.01"], ["--min-lr <= --lr", "--lr 0.01", "--min-lr 0.1"]),
        (["--preset", "huge"], ["--preset", "'huge'", "tiny"]),
        (["--precision", "fp16"], ["--precision fp16", "CUDA"]),
        (["--batch-size", "300"], ["train.tsv", "256", "--batch-size"]),
        (["--resume"], ["--resume", "<path>/out"]),
        (["--init-from", str(tmp_path / "nowhere")], ["<path>/nowhere"]),
        # a ratio flag cannot take a step count: no "pass an int" hint here
        (["--warmup-ratio", "1.5"], ["--warmup-ratio 1.5", "[0, 1)"]),
        (["--dropout", "1"], ["--dropout 1.0", "[0, 1)"]),
    ]
    for extra, facts in cases:
        err = _error_line(capsys, _args(task, out, *extra))
        assert_carries(without(err, tmp_path, task["train"].parent), *facts)
        assert "pass an int" not in err, err

    fresh = tmp_path / "fresh"
    with pytest.MonkeyPatch.context() as mp:  # the model is saved at the end: said at the start
        mp.setitem(sys.modules, "safetensors", None)
        assert_carries(_error_line(capsys, _args(task, fresh)), "safetensors",
                       "pip install 'minibert[examples]'")
    assert not fresh.exists()
    before = (run / "eval.json").read_bytes()
    assert_carries(_error_line(capsys, _args(task, run)), str(run), "--resume", "--out")
    assert (run / "eval.json").read_bytes() == before

