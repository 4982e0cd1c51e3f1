"""The main job's --eval-blimp: BLiMP accuracy logged at each evaluation beside the loss, the
same pairs every time and on a resume, read and checked before --out is touched."""

import json

import pytest

import minibert
from engine_utils import blimp_folder, load_example, quick_runs, wikitext_folder  # noqa: F401
from facts import assert_carries
from minibert.tasks.blimp import evaluate_blimp, read_blimp, sample_pairs

pretrain = load_example("pretrain_wikitext")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"))


@pytest.fixture(scope="module")
def blimp_dir(tmp_path_factory):
    return blimp_folder(tmp_path_factory.mktemp("blimp"))


def _args(data_dir, blimp_dir, out, cache, *extra):
    return ["--data-dir", str(data_dir), "--out", str(out), "--cache-dir", str(cache),
            "--preset", "tiny", "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8",
            "--max-steps", "4", "--eval-every", "2", "--no-progress", "--eval-batches", "2",
            "--precision", "fp32", "--eval-blimp", str(blimp_dir), "--eval-blimp-pairs", "5",
            *extra]


def test_blimp_accuracy_is_logged_at_each_evaluation(data_dir, blimp_dir, tmp_path):
    pytest.importorskip("safetensors")
    out = tmp_path / "run"
    assert pretrain.main(_args(data_dir, blimp_dir, out, tmp_path / "cache")) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    logged = [(r["step"], r["blimp_accuracy"]) for r in rows if "blimp_accuracy" in r]
    assert [step for step, _ in logged] == [2, 4]
    assert [r["step"] for r in rows if "eval_loss" in r] == [2, 4]
    # The last one is the final model's accuracy on the same 5 pairs of each paradigm.
    model = minibert.BertForMaskedLM.from_pretrained(out / "final")
    tok = minibert.Tokenizer.from_pretrained(out / "final")
    sample = sample_pairs(read_blimp(blimp_dir), 5)
    assert logged[-1][1] == pytest.approx(evaluate_blimp(model, tok, sample).overall)
    assert (out / "loss.png").is_file() or pytest.importorskip("matplotlib") is None


def test_a_resume_must_score_the_same_pairs(data_dir, blimp_dir, tmp_path, capsys):
    pytest.importorskip("safetensors")
    out, cache = tmp_path / "run", tmp_path / "cache"
    assert pretrain.main(_args(data_dir, blimp_dir, out, cache, "--max-steps", "2",
                               "--save-every", "2")) == 0
    assert pretrain.main(_args(data_dir, blimp_dir, out, cache, "--resume",
                               "--eval-blimp-pairs", "6")) == 2
    assert_carries(capsys.readouterr().err, "--eval-blimp")
    assert pretrain.main(_args(data_dir, blimp_dir, out, cache, "--resume")) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "blimp_accuracy" in r] == [2, 4]


@pytest.mark.parametrize("case", ["no folder", "pairs"])
def test_a_bad_blimp_folder_is_refused_before_out(data_dir, blimp_dir, tmp_path, capsys, case):
    out = tmp_path / "run"
    if case == "no folder":
        argv, facts = _args(data_dir, tmp_path / "missing", out, tmp_path / "cache"), \
            ["--eval-blimp", "missing"]
    else:
        argv, facts = _args(data_dir, blimp_dir, out, tmp_path / "cache",
                            "--eval-blimp-pairs", "0"), ["--eval-blimp-pairs 0", "at least 1"]
    assert pretrain.main(argv) == 2
    assert_carries(capsys.readouterr().err, *facts)
    assert not out.exists()
