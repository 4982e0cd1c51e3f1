"""GLUE: the metrics against their definitions on worked examples (and scipy where it is
installed), the layouts of download_glue_data.py (CoLA without a header, MNLI's two dev
files), the benchmark's average, and examples/glue.py end to end, its scores recomputed from
the predictions it writes."""

import csv
import json
import logging
import math
import random
import shutil

import numpy as np
import pytest

import minibert
from engine_utils import load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries, raises
from minibert.data.task_files import read_table
from minibert.tasks.glue import (GLUE_TASKS, find_glue_tasks, glue_average, glue_task_scores,
                                 read_glue_task)
from minibert.tasks.metrics import binary_f1, matthews_corrcoef, pearson, spearman

glue_script = load_example("glue")

# ---- the metrics, worked by hand ---------------------------------------------------------------


def test_matthews_two_classes_by_hand():
    # TP 2, TN 2, FP 1, FN 1: (2*2 - 1*1) / sqrt(3 * 3 * 3 * 3) = 1/3
    assert matthews_corrcoef([1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]) == pytest.approx(1 / 3)
    # scikit-learn's documented example, [+1, +1, +1, -1] against [+1, -1, +1, +1]: -1/3
    assert matthews_corrcoef([1, 1, 1, 0], [1, 0, 1, 1]) == pytest.approx(-1 / 3)
    assert matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    # A constant prediction carries no information, however accurate: 0 (accuracy is 0.9)
    assert matthews_corrcoef([1] * 9 + [0], [1] * 10) == 0.0


def test_matthews_is_the_binary_formula_on_random_labels():
    rng = np.random.default_rng(0)
    for _ in range(20):
        t, p = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
        tp, tn = np.sum((t == 1) & (p == 1)), np.sum((t == 0) & (p == 0))
        fp, fn = np.sum((t == 0) & (p == 1)), np.sum((t == 1) & (p == 0))
        expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        assert matthews_corrcoef(t, p) == pytest.approx(expected)


def test_matthews_three_classes_by_hand():
    # gold counts t = (2, 2, 2), predicted p = (2, 3, 1), 4 correct of 6:
    # (4*6 - t.p) / sqrt((36 - p.p)(36 - t.t)) = (24 - 12) / sqrt(22 * 24)
    assert matthews_corrcoef([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]) == \
        pytest.approx(12 / math.sqrt(22 * 24))


def test_binary_f1_by_hand():
    # positive class 1: TP 2, FP 1, FN 1 -> 2*2 / (2*2 + 2) = 2/3
    assert binary_f1([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(2 / 3)
    assert binary_f1([0, 0], [0, 0]) == 0.0  # no positive anywhere: 0, scikit-learn's rule


def test_pearson_and_spearman_by_hand():
    # dx = (-1, 0, 1), dy = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9)
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    # ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): r of the ranks = 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)  # any increasing curve
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # a constant side: no correlation to measure
    with raises(ValueError, "NaN"):
        pearson([1, float("nan")], [1, 2])


def test_correlations_equal_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for _ in range(10):
        x = rng.integers(0, 6, 40).astype(float)  # many ties, as STS-B's rounded scores
        y = x + rng.normal(0, 1.5, 40)
        assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def test_task_score_and_glue_average_are_the_benchmarks():
    mrpc = glue_task_scores(GLUE_TASKS["MRPC"], {"dev": ([1, 1, 0, 0, 1], [1, 0, 1, 0, 1])})
    assert mrpc["f1"] == pytest.approx(200 / 3) and mrpc["accuracy"] == pytest.approx(60)
    assert mrpc["score"] == pytest.approx((200 / 3 + 60) / 2)
    mnli = glue_task_scores(GLUE_TASKS["MNLI"], {"matched": ([0, 1], [0, 1]),
                                                 "mismatched": ([0, 1], [0, 2])})
    assert (mnli["matched_accuracy"], mnli["mismatched_accuracy"], mnli["score"]) == \
        pytest.approx((100, 50, 75))
    with raises(ValueError, "matched", "mismatched"):
        glue_task_scores(GLUE_TASKS["MNLI"], {"dev": ([0], [0])})
    # BERT-large's published test scores (Devlin et al. 2019) give its leaderboard GLUE
    # score, 80.5: multi-metric tasks averaged, MNLI-m and -mm as one task, WNLI counted.
    published = {"CoLA": 60.5, "SST-2": 94.9, "MRPC": (89.3 + 85.4) / 2,
                 "STS-B": (87.6 + 86.5) / 2, "QQP": (72.1 + 89.3) / 2,
                 "MNLI": (86.7 + 85.9) / 2, "QNLI": 92.7, "RTE": 70.1, "WNLI": 65.1}
    assert round(glue_average(published), 1) == 80.5
    with raises(ValueError, "'SNLI'"):
        glue_average({"SNLI": 90.0})


# ---- the files, as download_glue_data.py lays them out ----------------------------------------

WORDS = "the a cat dog runs sleeps big small red blue house tree and not very".split()


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))


def make_glue(root, tasks=("CoLA", "MRPC", "STS-B", "MNLI"), n_train=64, n_dev=24, seed=0):
    """A small GLUE folder in the real layouts; CoLA and MRPC labels follow a keyword, so a
    model can learn them."""
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("dev", n_dev)):
        if "CoLA" in tasks:  # no header: source, label, original mark, sentence
            rows = []
            for _ in range(n):
                s = sentence(rng)
                rows.append(("gj04", int("cat" in s.split()), "" if "cat" in s else "*", s))
            write(root / "CoLA" / f"{split}.tsv", rows)
        if "MRPC" in tasks:
            rows = [("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")]
            for i in range(n):
                a, b = sentence(rng), sentence(rng)
                rows.append((int("dog" in a.split()), i, i + 1, a, b))
            write(root / "MRPC" / f"{split}.tsv", rows)
        if "STS-B" in tasks:
            rows = [("index", "genre", "filename", "year", "old_index", "source1", "source2",
                     "sentence1", "sentence2", "score")]
            rows += [(i, "main", "f", "2012", i, "none", "none", sentence(rng), sentence(rng),
                      f"{rng.uniform(0, 5):.3f}") for i in range(n)]
            write(root / "STS-B" / f"{split}.tsv", rows)
    if "MNLI" in tasks:
        header = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                  "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                  "sentence2", "label1", "gold_label")
        for name, n in (("train", n_train), ("dev_matched", n_dev), ("dev_mismatched", n_dev)):
            rows = [header] + [(i, i, i, "fiction", "(x)", "(y)", "(x)", "(y)", sentence(rng),
                                sentence(rng), "neutral",
                                rng.choice(["entailment", "neutral", "contradiction"]))
                               for i in range(n)]
            write(root / "MNLI" / f"{name}.tsv", rows)
    return root


def test_a_headerless_table_is_read_by_position(tmp_path):
    path = tmp_path / "train.tsv"
    write(path, [("gj04", 1, "", "a first sentence"), ("gj04", 0, "*", "second")])
    assert read_table(path, [3, 1], header=False) == [(1, ["a first sentence", "1"]),
                                                      (2, ["second", "0"])]
    with raises(ValueError, str(path), "column 4", "4 fields"):
        read_table(path, [4], header=False)
    write(path, [("gj04", 1, "", "one"), ("gj04", 0, "two")])
    with raises(ValueError, str(path), "line 2", "3 field(s)", "first row has 4"):
        read_table(path, [3, 1], header=False)


def test_tasks_are_found_in_glues_order_and_missing_ones_named(tmp_path):
    make_glue(tmp_path / "glue", tasks=("MNLI", "CoLA"))
    found, missing = find_glue_tasks(tmp_path / "glue")
    assert [t.name for t in found] == ["CoLA", "MNLI"]
    assert missing == ["SST-2", "MRPC", "STS-B", "QQP", "QNLI", "RTE", "WNLI"]
    (tmp_path / "glue" / "CoLA").rename(tmp_path / "glue" / "cola")  # any case
    assert [t.name for t in find_glue_tasks(tmp_path / "glue", ["mnli", "CoLA"])[0]] == \
        ["CoLA", "MNLI"]
    with raises(ValueError, "'SNLI'", "CoLA"):
        find_glue_tasks(tmp_path / "glue", ["SNLI"])
    with raises(ValueError, "folder of one task", "folder above"):
        find_glue_tasks(tmp_path / "glue" / "MNLI")
    (tmp_path / "empty").mkdir()
    with raises(FileNotFoundError, "CoLA/", "WNLI/"):
        find_glue_tasks(tmp_path / "empty")


def test_each_layout_reads_its_columns_and_classes(tmp_path):
    root = make_glue(tmp_path / "glue")
    cola = read_glue_task(GLUE_TASKS["CoLA"], root)
    first = (root / "CoLA" / "train.tsv").read_text().split("\n")[0].split("\t")
    assert (cola.train.texts[0], cola.train.labels[0], cola.train.pairs) == \
        (first[3], int(first[1]), None)
    mrpc = read_glue_task(GLUE_TASKS["MRPC"], root)
    second = (root / "MRPC" / "dev.tsv").read_text().split("\n")[1].split("\t")
    assert (mrpc.evals["dev"].texts[0], mrpc.evals["dev"].pairs[0],
            mrpc.evals["dev"].labels[0]) == (second[3], second[4], int(second[0]))
    sts = read_glue_task(GLUE_TASKS["STS-B"], root)
    assert all(isinstance(y, float) for y in sts.train.labels)
    mnli = read_glue_task(GLUE_TASKS["MNLI"], root, max_train=10)
    assert sorted(mnli.evals) == ["matched", "mismatched"] and len(mnli.train) == 10
    assert set(mnli.train.labels) <= {0, 1, 2}


def test_bad_rows_are_refused_with_file_and_line(tmp_path):
    root = make_glue(tmp_path / "glue", tasks=("MNLI", "STS-B"))
    dev = root / "STS-B" / "dev.tsv"
    lines = dev.read_text().split("\n")
    lines[3] = "\t".join(lines[3].split("\t")[:-1] + ["high"])
    dev.write_text("\n".join(lines))
    with raises(ValueError, str(dev), "line 4", "'high'"):
        read_glue_task(GLUE_TASKS["STS-B"], root)
    train = root / "MNLI" / "train.tsv"
    lines = train.read_text().split("\n")
    lines[2] = "\t".join(lines[2].split("\t")[:-1] + ["maybe"])
    train.write_text("\n".join(lines))
    with raises(ValueError, str(train), "line 3", "'maybe'", "entailment"):
        read_glue_task(GLUE_TASKS["MNLI"], root)


# ---- examples/glue.py end to end ---------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    rng = random.Random(0)
    tok = minibert.Tokenizer.train_from_iterator([sentence(rng) for _ in range(300)],
                                                 vocab_size=80)
    minibert.set_seed(0)
    config = minibert.BertConfig.preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id)
    minibert.BertForMaskedLM(config).save_pretrained(d / "model", tokenizer=tok)
    return d / "model"


def argv(model, glue_dir, out, *extra):
    return ["--init-from", str(model), "--glue-dir", str(glue_dir), "--out", str(out),
            "--batch-size", "16", "--seq-len", "32", "--epochs", "2", "--lr", "1e-3",
            "--no-progress", *extra]


def read_predictions(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_the_glue_command_scores_every_task_found(tmp_path, model_folder, caplog, capsys):
    pytest.importorskip("safetensors")
    caplog.set_level(logging.INFO)
    root = make_glue(tmp_path / "glue")
    out = tmp_path / "out"
    assert glue_script.main(argv(model_folder, root, out, "--seeds", "2")) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["tasks"]) == ["CoLA", "MRPC", "STS-B", "MNLI"]
    assert results["skipped"] == ["SST-2", "QQP", "QNLI", "RTE", "WNLI"]
    assert results["seeds"] == [0, 1] and results["weights"] == "pretrained weights"
    # Every score is recomputed here from the predictions the run wrote, by the definitions.
    for name, task in results["tasks"].items():
        for i, seed in enumerate(results["seeds"]):
            run = out / name / f"seed-{seed}"
            assert not (run / "checkpoints").exists()  # the scores are the result
            recorded = json.loads((run / "scores.json").read_text())
            assert recorded == task["seeds"][i]
            mine = {}
            for split in GLUE_TASKS[name].evals:
                rows = read_predictions(run / f"predictions_{split}.tsv")
                prefix = f"{split}_" if len(GLUE_TASKS[name].evals) > 1 else ""
                if name == "STS-B":
                    y, p = [float(r["label"]) for r in rows], [float(r["prediction"]) for r in rows]
                    if len(set(p)) == 1:  # a constant prediction: 0 by the library's rule
                        mine[prefix + "pearson"] = mine[prefix + "spearman"] = 0.0
                        continue
                    mine[prefix + "pearson"] = 100 * np.corrcoef(y, p)[0, 1]
                    # ranks, ties given the mean of their places (bf16 predictions tie)
                    ranks = [[sum(u < x for u in v) + (sum(u == x for u in v) + 1) / 2
                              for x in v] for v in (y, p)]
                    mine[prefix + "spearman"] = 100 * np.corrcoef(*ranks)[0, 1]
                    continue
                y, p = [r["label"] for r in rows], [r["prediction"] for r in rows]
                mine[prefix + "accuracy"] = 100 * np.mean([a == b for a, b in zip(y, p)])
                if name == "MRPC":
                    tp = sum(a == b == "1" for a, b in zip(y, p))
                    mine["f1"] = 100 * 2 * tp / (y.count("1") + p.count("1"))
                if name == "CoLA":
                    mine = {"matthews": 100 * np.corrcoef([int(a) for a in y],
                                                          [int(b) for b in p])[0, 1]
                            if len(set(p)) > 1 else 0.0}
            for metric, value in mine.items():
                assert recorded[metric] == pytest.approx(value, abs=1e-6), (name, metric)
            assert recorded["score"] == pytest.approx(np.mean(list(mine.values())))
        values = [r["score"] for r in task["seeds"]]
        assert task["score"]["mean"] == pytest.approx(np.mean(values))
        assert task["score"]["std"] == pytest.approx(np.std(values, ddof=1))
    per_seed = [np.mean([t["seeds"][i]["score"] for t in results["tasks"].values()])
                for i in range(2)]
    assert results["glue"]["per_seed"] == pytest.approx(per_seed)
    assert results["glue"]["mean"] == pytest.approx(np.mean(per_seed))
    table = (out / "results.md").read_text()
    assert_carries(table, "| CoLA | matthews |", "| STS-B | pearson, spearman |", "**GLUE**")
    assert "SST-2: no SST-2/ folder" in caplog.text
    caplog.clear()

    # --resume after a stop: the task runs already scored are read back, not trained again.
    (out / "results.json").unlink()
    (out / "MNLI" / "seed-1" / "scores.json").unlink()
    assert glue_script.main(argv(model_folder, root, out, "--seeds", "2", "--resume")) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["tasks"]["CoLA"] == results["tasks"]["CoLA"]
    assert again["tasks"]["MNLI"]["seeds"][1] == results["tasks"]["MNLI"]["seeds"][1]
    logged = caplog.text
    assert "CoLA, seed 0: already scored" in logged
    assert "MNLI, seed 1: already scored" not in logged

    # A --resume whose settings differ from those a scored task run had is refused, naming
    # the flag, before anything is written: its old scores would be reported under the new.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for extra, named in ((["--lr", "3e-3"], "--lr"), (["--random-weights"], "--random-weights"),
                         (["--dropout", "0.2"], "--dropout the model folder's own")):
        capsys.readouterr()
        assert glue_script.main(argv(model_folder, root, out, "--seeds", "2", "--resume",
                                     *extra)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and named in err, err
        assert_carries(err, "--resume", "CoLA")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_random_weights_keep_the_tokenizer_and_shape(tmp_path, model_folder):
    pytest.importorskip("safetensors")
    root = make_glue(tmp_path / "glue", tasks=("CoLA",))
    data = read_glue_task(GLUE_TASKS["CoLA"], root)
    glue = glue_script.glue
    minibert.set_seed(0)
    pretrained = glue.glue_model(model_folder, data, 0.1, random_weights=False)
    minibert.set_seed(0)
    random_ = glue.glue_model(model_folder, data, 0.1, random_weights=True)
    mlm = minibert.BertForMaskedLM.from_pretrained(model_folder)
    assert random_.config == pretrained.config and random_.config.hidden_dropout == 0.1
    word = "bert.embeddings.word.weight"
    assert pretrained.state_dict()[word].equal(mlm.state_dict()[word])
    assert not random_.state_dict()[word].equal(mlm.state_dict()[word])
    assert {k: v.shape for k, v in random_.state_dict().items()} == \
        {k: v.shape for k, v in pretrained.state_dict().items()}


@pytest.mark.parametrize("random_weights", [False, True])
def test_without_dropout_the_model_folders_own_rate_is_kept(tmp_path, random_weights):
    """As transformers' from_pretrained and the fine-tuning scripts do: 0 from the main job's
    model, which pretrains without dropout, and 0.1 from BERT's; --dropout overrides it.
    --random-weights keeps it too, so that its start differs in the weights alone."""
    pytest.importorskip("safetensors")
    rng = random.Random(0)
    tok = minibert.Tokenizer.train_from_iterator([sentence(rng) for _ in range(300)],
                                                 vocab_size=80)
    config = minibert.BertConfig.preset("tiny", vocab_size=tok.vocab_size,
                                        pad_token_id=tok.pad_id, hidden_dropout=0.0,
                                        attention_dropout=0.05)
    minibert.BertForMaskedLM(config).save_pretrained(tmp_path / "model", tokenizer=tok)
    root = make_glue(tmp_path / "glue", tasks=("CoLA",))
    data = read_glue_task(GLUE_TASKS["CoLA"], root)
    glue = glue_script.glue
    own = glue.glue_model(tmp_path / "model", data, None, random_weights=random_weights)
    assert (own.config.hidden_dropout, own.config.attention_dropout) == (0.0, 0.05)
    given = glue.glue_model(tmp_path / "model", data, 0.25, random_weights=random_weights)
    assert given.config.hidden_dropout == given.config.attention_dropout == 0.25

    out = tmp_path / "out"
    extra = ["--tasks", "CoLA", "--epochs", "1", "--max-train-examples", "16"]
    assert glue_script.main(argv(tmp_path / "model", root, out, *extra,
                                 *(["--random-weights"] if random_weights else []))) == 0
    recipe = json.loads((out / "results.json").read_text())["recipe"]
    assert recipe["dropout"] == {"hidden": 0.0, "attention": 0.05}


@pytest.mark.parametrize("case", ["bad label", "no tasks", "epochs", "unknown task",
                                  "a layer fewer in config.json"])
def test_bad_input_is_refused_before_out_is_written(tmp_path, model_folder, capsys, case):
    root = make_glue(tmp_path / "glue", tasks=("CoLA", "MRPC"))
    extra, facts, model = [], [], model_folder
    if case == "a layer fewer in config.json":  # refused before a task, not when it starts
        model = tmp_path / "model"
        shutil.copytree(model_folder, model)
        stored = json.loads((model / "config.json").read_text())
        layers = stored["num_hidden_layers"] - 1
        (model / "config.json").write_text(json.dumps({**stored, "num_hidden_layers": layers}))
        facts = [str(model / "model.safetensors"), f"bert.encoder.layer.{layers}."]
    elif case == "bad label":
        dev = root / "MRPC" / "dev.tsv"
        lines = dev.read_text().split("\n")
        lines[2] = "yes" + lines[2][1:]
        dev.write_text("\n".join(lines))
        facts = [str(dev), "line 3", "'yes'"]
    elif case == "no tasks":
        root = tmp_path / "nothing"
        root.mkdir()
        facts = ["no GLUE task folder", "CoLA/"]
    elif case == "epochs":
        extra, facts = ["--epochs", "6"], ["--epochs 6", "between 1 and 5"]
    else:
        extra, facts = ["--tasks", "CoLA,SNLI"], ["'SNLI'"]
    out = tmp_path / "out"
    assert glue_script.main(argv(model, root, out, *extra)) == 2
    assert_carries(capsys.readouterr().err, *facts)
    assert not out.exists()


# Every task's files as download_glue_data.py writes them: (header or None, a row).
LAYOUTS = {
    "CoLA": (None, ("gj04", "1", "", "The sailors rode the breeze clear of the rocks.")),
    "SST-2": (("sentence", "label"), ("it 's a charming and often affecting journey . ", "1")),
    "MRPC": (("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
             ("1", "702876", "702977", "Amrozi accused his brother .", "Referring to him .")),
    "STS-B": (("index", "genre", "filename", "year", "old_index", "source1", "source2",
               "sentence1", "sentence2", "score"),
              ("0", "main-captions", "MSRvid", "2012test", "0001", "none", "none",
               "A plane is taking off.", "An air plane is taking off.", "5.000")),
    "QQP": (("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
            ("133273", "213221", "213222", "How is the life of a math student?",
             "Which level of prepration is enough?", "0")),
    "MNLI": (("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2", "label1", "gold_label"),
             ("0", "31193", "31193n", "government", "( ( x ) )", "( y )", "(ROOT x)", "(ROOT y)",
              "Conceptually cream skimming has two basic dimensions.",
              "Product and geography are what make cream skimming work.", "neutral",
              "neutral")),
    "QNLI": (("index", "question", "sentence", "label"),
             ("0", "What came into force after the new constitution was herald?",
              "As of that day, the new constitution heralding the Second Republic came into "
              "force.", "entailment")),
    "RTE": (("index", "sentence1", "sentence2", "label"),
            ("0", "Dana Reeve died of lung cancer.", "Christopher Reeve had an accident.",
             "not_entailment")),
    "WNLI": (("index", "sentence1", "sentence2", "label"),
             ("0", "I stuck a pin through a carrot.", "The carrot had a hole.", "1")),
}


@pytest.mark.parametrize("name", list(GLUE_TASKS))
def test_every_task_reads_its_own_layout(tmp_path, name):
    header, row = LAYOUTS[name]
    task = GLUE_TASKS[name]
    for file in (task.train, *task.evals.values()):
        write(tmp_path / name / file, ([header] if header else []) + [row])
    data = read_glue_task(task, tmp_path)
    columns = header or range(len(row))
    value = dict(zip(columns, row))
    assert data.train.texts == [value[task.text].strip()]  # as every table is read
    assert data.train.pairs == (None if task.pair is None else [value[task.pair]])
    label = value[task.label]
    assert data.train.labels == [float(label) if task.labels is None
                                 else task.labels.index(label)]
    assert list(data.evals) == list(task.evals)
