"""How the example scripts end, all of them alike (minibert.cli): the exit status tells the
truth, a diverged run leaves no final/, a refused run leaves --out as it found it, and a
negative number after a flag reaches the flag's own check."""

import json
import math
import shutil
import signal
from pathlib import Path

import pytest
import torch

from minibert import cli
from minibert.training.distributed import DistContext
from minibert.training.engine import TrainingError
from minibert.training.signals import Stopped

from engine_utils import (WORDS, from_checkpoint, load_example, quick_runs,  # noqa: F401
                          wikitext_folder)
from facts import assert_carries, raises, without
from script_inputs import SCRIPTS, argv, make_inputs_with_teacher, script_argv

TRAINING = [s for s in SCRIPTS if s != "embed"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def _one_line(capsys, script, args, code=2):
    got = load_example(script).main(args)
    err = capsys.readouterr().err.strip()
    assert got == code and err.startswith("error: ") and "\n" not in err, (got, err)
    return err


# ---- the exit status, from cli alone ---------------------------------------------------------

def _result(**fields):
    return {"interrupted": False, "stop_signal": None, "steps": 3, "skipped_steps": 0,
            "eval_loss": 0.5, **fields}


def test_finished_tells_a_stop_and_a_divergence_from_a_finished_run(tmp_path):
    ctx = DistContext()
    assert cli.finished(_result(), ctx, 1e-3) is True
    with pytest.raises(Stopped) as stop:
        cli.finished(_result(interrupted=True, stop_signal=signal.SIGINT), ctx, 1e-3)
    assert stop.value.signal == signal.SIGINT
    # what is not finite, and the flag to lower with its value
    for fields, said in [({"eval_loss": math.nan}, ["eval_loss", "nan"]),
                         ({"ner/eval_loss": math.inf}, ["ner/eval_loss", "inf"])]:
        with raises(TrainingError, *said, "final/", "--lr", "0.5"):
            cli.finished(_result(**fields), ctx, 0.5)
    model = torch.nn.Linear(2, 2)
    cli.finished(_result(), ctx, 1e-3, model)
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    with raises(TrainingError, "weights", "not finite"):
        cli.finished(_result(), ctx, 1e-3, model)
    # In eval mode a diverged model may still score a finite loss: the last step says it.
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.7}\n{"step": 2, "loss": '
                                            'NaN}\n{"step": 2, "eval_loss": 1e7}\n')
    with raises(TrainingError, "training step", "nan"):
        cli.finished(_result(eval_loss=1e7), ctx, 1e-3, out=tmp_path)


def _script(args, order, prepare_error=None, error=None, finished=False) -> int:
    """A script's `main`, as the examples write it, with its steps recorded in `order`."""
    with cli.Script(args) as script:
        script.start()
        order.append("prepare")
        if prepare_error:
            raise prepare_error
        if not script.claim([]):
            order.append("finished")
            return 0
        order.append("run")
        if error:
            raise error
    return script.status


def test_script_exit_statuses(tmp_path, capsys):
    def status(error=None, prepare_error=None, out=tmp_path / "out"):
        args = type("Args", (), {"device": "cpu", "out": out, "resume": False})
        return _script(args, [], prepare_error, error)

    assert status() == 0
    assert status(Stopped(signal.SIGTERM, 4)) == 143
    assert status(Stopped(signal.SIGINT, 4)) == 130
    assert status(TrainingError("diverged")) == 1
    assert status(ValueError("bad\n  input")) == 2
    assert capsys.readouterr().err.splitlines() == [
        "stopped by SIGTERM at step 4, its checkpoint saved: continue with the same command "
        "plus --resume",
        "stopped by SIGINT at step 4, its checkpoint saved: continue with the same command "
        "plus --resume",
        "error: diverged", "error: bad input"]
    assert status(prepare_error=ValueError("refused"), out=tmp_path / "new") == 2
    assert not (tmp_path / "new").exists()  # the checks run before the run folder is made
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        status(ZeroDivisionError("a bug"))


def test_a_script_that_fails_before_it_writes_leaves_out_as_it_was(tmp_path):
    """A refusal inside the block, after --out is claimed but before the first write, takes
    the run folder back: the same command, fixed, is a fresh start."""
    out = tmp_path / "out"
    args = type("Args", (), {"device": "cpu", "out": out, "resume": False})
    assert _script(args, [], error=ValueError("refused after the claim")) == 2
    assert not out.exists()
    assert _script(args, []) == 0


def test_script_bounds_the_kernel_cache_before_anything_runs(tmp_path, monkeypatch):
    """oneDNN reads its cache's bound once, at the first bf16 matmul, which the checks
    could already make."""
    import minibert.machine.memory

    order = []
    monkeypatch.setattr(minibert.machine.memory, "limit_kernel_cache",
                        lambda *a: order.append("limit_kernel_cache") or True)
    args = type("Args", (), {"device": "cpu", "out": tmp_path / "out", "resume": False})
    assert _script(args, order) == 0
    assert order == ["limit_kernel_cache", "prepare", "run"]


# ---- a diverged run --------------------------------------------------------------------------

@pytest.mark.parametrize("script", TRAINING)
def test_a_diverged_run_exits_1_and_leaves_no_final(script, inputs, tmp_path, capsys):
    """--lr 1e30: the first step blows the weights up and the next ones are skipped as
    non-finite. The run used to exit 0 with a final/ that computed garbage. (At 1e6 the
    weights came out near 1e6, and whether a later batch's loss still overflowed depended
    on the batch: the run then ended on a finite loss, and this test on chance.)"""
    out = tmp_path / "out"
    err = _one_line(capsys, script, script_argv(script, inputs, out, "--lr", "1e30",
                                                "--max-steps", "3", "--log-every", "1"), 1)
    assert_carries(err, "diverged", "final/", "--lr", "1e+30")
    assert not (out / "final").exists() and not (out / "eval.json").exists()
    assert (out / "checkpoints").is_dir()  # kept, as said


def test_steps_that_keep_being_skipped_stop_the_run_with_status_1(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    err = _one_line(capsys, "finetune_classification", script_argv(
        "finetune_classification", inputs, out, "--lr", "1e6", "--max-steps", "12"), 1)
    assert_carries(err, "consecutive", "non-finite", "learning rate", "1e+06")
    assert not (out / "final").exists()


# ---- refused before --out is touched ---------------------------------------------------------

REFUSALS = [
    # (script, flags, the facts its message must carry: the file, the value, the flag to
    # change); each was once refused after --out was written
    ("finetune_classification", ["--batch-size", "256"], ["train.tsv", "16", "--batch-size"]),
    ("finetune_classification", ["--seq-len", "600"],
     ["--seq-len 600", "max_position_embeddings=512"]),
    ("finetune_token_classification", ["--batch-size", "256"],
     ["train.conll", "16", "--batch-size"]),
    ("finetune_token_classification", ["--seq-len", "600"],
     ["--seq-len 600", "max_position_embeddings=512"]),
    ("finetune_qa", ["--batch-size", "256"], ["train.json", "40", "--batch-size"]),
    # "cat ?" leaves a window of 16 tokens 11 for context: no more than the overlap; said in
    # the flags that set them, not encode_qa's arguments
    ("finetune_qa", ["--doc-stride", "11"],
     ["'q0'", "--seq-len 16", "11 context tokens", "--doc-stride 11"]),
    ("finetune_multitask", ["--seq-len", "600"], ["--seq-len 600", "max_position_embeddings=512"]),
    ("pretrain_wikitext", ["--seq-len", "600"], ["--seq-len 600", "max_position_embeddings=512"]),
    ("distill", ["--seq-len", "100"], ["--seq-len 100", "teacher", "max_position_embeddings=64"]),
    ("finetune_classification", ["--batch-size", "17"], ["train.tsv", "16", "--batch-size"]),
    # a global batch that does not split into whole micro-batches: one check, the engine's,
    # said in the flags
    ("pretrain_wikitext", ["--batch-size", "8", "--micro-batch-size", "3"],
     ["--batch-size 8", "--micro-batch-size 3"]),
    ("finetune_classification", ["--batch-size", "8", "--micro-batch-size", "3"],
     ["--batch-size 8", "--micro-batch-size 3"]),
    ("distill", ["--batch-size", "8", "--micro-batch-size", "3"],
     ["--batch-size 8", "--micro-batch-size 3"]),
    # the label read as input text
    ("finetune_classification", ["--text-pair-column", "label"],
     ["--text-pair-column", "--label-column", "'label'"]),
    ("finetune_classification", ["--text-column", "label"],
     ["--text-column", "--label-column", "'label'"]),
    ("finetune_multitask", ["--text-column", "label", "--label-column", "label"],
     ["--text-column", "--label-column", "'label'"]),
    # nan compares false with everything: no question would ever go unanswered
    ("finetune_qa", ["--version-2", "--null-score-diff-threshold", "nan"],
     ["--null-score-diff-threshold nan", "finite"]),
    # the corpus and --init-from's weights, checked before the run folder is made
    ("pretrain_wikitext", ["--train-split", "nosuch"], ["'nosuch'", "train, valid",
                                                        "--train-split"]),
    ("pretrain_wikitext", ["--data-dir", "/nonexistent/wiki"], ["/nonexistent/wiki"]),
    ("distill", ["--train-split", "nosuch"], ["'nosuch'", "train, valid", "--train-split"]),
]


@pytest.mark.parametrize("script,flags,facts", REFUSALS,
                         ids=[f"{s}:{f[0]}" for s, f, _ in REFUSALS])
def test_a_refused_run_leaves_out_as_it_found_it(script, flags, facts, inputs, tmp_path,
                                                 capsys):
    out = tmp_path / "out"
    err = _one_line(capsys, script, script_argv(script, inputs, out, *flags))
    assert_carries(without(err, inputs, tmp_path), *facts)
    assert not out.exists()


@pytest.mark.parametrize("script", TRAINING)
def test_an_out_that_is_a_file_is_named(script, inputs, tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("results of another kind\n")
    assert_carries(_one_line(capsys, script, script_argv(script, inputs, out)), "--out",
                   str(out), "file")
    assert out.read_text() == "results of another kind\n"


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_init_from_without_readable_weights_is_refused_before_out(script, inputs, tmp_path,
                                                                   capsys):
    """--init-from (pretraining) or --teacher (distillation) holding a config and a tokenizer
    but no weights, or damaged ones: refused before the run folder or its tokenizer exist."""
    import shutil

    for damage in ("missing", "truncated"):
        folder = tmp_path / damage
        shutil.copytree(inputs / "teacher", folder)
        weights = folder / "model.safetensors"
        if damage == "missing":
            weights.unlink()
        else:
            weights.write_bytes(weights.read_bytes()[:100])
        out = tmp_path / f"out-{damage}"
        args = script_argv(script, inputs, out)
        if script == "distill":
            args[args.index("--teacher") + 1] = str(folder)
        else:
            args = [a for a in args if a not in ("--preset", "tiny", "--vocab-size", "100")]
            args += ["--init-from", str(folder)]
        err = _one_line(capsys, script, args)
        assert str(folder) in err, err
        assert not out.exists()


@pytest.mark.parametrize("flags,facts", [  # the flag given, and the checkpoint's, as a flag
    (["--norm", "pre"], ["--norm pre", "--norm post"]),
    (["--global-every", "3"], ["--global-every 3", "--global-every 1"])])
def test_an_architecture_flag_against_init_from_is_refused_before_out(flags, facts, inputs,
                                                                      tmp_path, capsys):
    out = tmp_path / "out"
    args = argv("pretrain_wikitext", inputs, inputs / "teacher", out, *flags)
    err = _one_line(capsys, "pretrain_wikitext", args)
    assert_carries(err, str(inputs / "teacher"))
    assert_carries(without(err, inputs), *facts)
    assert not out.exists()


@pytest.mark.parametrize("script,flags,facts", [  # the flag, its value then (and now)
    ("finetune_classification", ["--warmup-ratio", "0.2"], ["--warmup-ratio", "0.1", "0.2"]),
    ("pretrain_wikitext", ["--lr", "0.002"], ["--lr", "0.001", "0.002"]),
    ("pretrain_wikitext", ["--seq-len-warmup", "0"], ["--seq-len-warmup", "0.5"]),
])
def test_a_resume_with_other_settings_names_the_flags(script, flags, facts, inputs, tmp_path,
                                                      capsys):
    out = tmp_path / "out"
    assert load_example(script).main(script_argv(script, inputs, out)) == 0
    err = _one_line(capsys, script, script_argv(script, inputs, out, "--resume",
                                                "--max-steps", "2", *flags))
    assert_carries(without(err, tmp_path), *facts)


def test_a_refused_resume_leaves_the_run_as_it_was(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    main = load_example("finetune_qa").main
    assert main(script_argv("finetune_qa", inputs, out, "--log-every", "1")) == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    for flags, facts in [(["--doc-stride", "11"], ["--doc-stride 11"]),
                         (["--batch-size", "256"], ["train.json", "40", "--batch-size"])]:
        err = _one_line(capsys, "finetune_qa", script_argv(
            "finetune_qa", inputs, out, "--resume", "--max-steps", "2", *flags))
        assert_carries(without(err, inputs, tmp_path), *facts)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def _files(folder):
    """Every path under `folder`, with a file's bytes (None for a folder)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def finished_runs(inputs, tmp_path_factory):
    """A finished one-step run of a multi-task and of a pretraining script, to resume into."""
    runs = tmp_path_factory.mktemp("runs")
    for script in ("finetune_multitask", "pretrain_wikitext"):
        assert load_example(script).main(script_argv(script, inputs, runs / script)) == 0
    return runs


FOREIGN = [  # (script, whose run folder it is told to resume, the checkpoint's class, its own)
    ("finetune_classification", "finetune_multitask", "BertMultiTask",
     "BertForSequenceClassification"),
    ("finetune_classification", "pretrain_wikitext", "BertForMaskedLM",
     "BertForSequenceClassification"),
    ("finetune_token_classification", "pretrain_wikitext", "BertForMaskedLM",
     "BertForTokenClassification"),
    ("finetune_qa", "pretrain_wikitext", "BertForMaskedLM", "BertForQuestionAnswering"),
    ("finetune_multitask", "pretrain_wikitext", "BertForMaskedLM", "BertMultiTask"),
    ("pretrain_wikitext", "finetune_multitask", "BertMultiTask", "BertForMaskedLM"),
    ("distill", "finetune_multitask", "BertMultiTask", "Distiller"),
]


@pytest.mark.parametrize("script,other,saved,now", FOREIGN,
                         ids=[f"{s}-into-{o}" for s, o, _, _ in FOREIGN])
def test_a_resume_into_another_scripts_run_is_refused_before_writing(
        script, other, saved, now, inputs, finished_runs, tmp_path, capsys):
    """The model class of a resume is checked before --out is written: the classification
    script wrote labels.json into a multi-task run's folder, and the token-classification
    script into a pretraining run's, before the engine refused them."""
    out = tmp_path / "out"
    shutil.copytree(finished_runs / other, out)
    before = _files(out)
    err = _one_line(capsys, script, script_argv(script, inputs, out, "--resume",
                                                "--max-steps", "2"))
    assert f"model class: checkpoint {saved!r}, now {now!r}" in err, err
    assert _files(out) == before


def test_a_resume_on_other_data_is_refused_before_writing(inputs, finished_runs, tmp_path,
                                                         capsys):
    """Pretraining resumed on another corpus: the run's key files were rewritten with the
    new corpus's before the engine refused it."""
    out, other = tmp_path / "out", tmp_path / "wiki"
    shutil.copytree(finished_runs / "pretrain_wikitext", out)
    other.mkdir()
    wikitext_folder(other, (("train", 30), ("valid", 4)))
    before = _files(out)
    args = script_argv("pretrain_wikitext", inputs, out, "--resume", "--max-steps", "2")
    args[args.index("--data-dir") + 1] = str(other)
    line = _one_line(capsys, "pretrain_wikitext", args)
    assert_carries(line, "the text of --train-split train", "checkpoint '")  # flag and split
    assert _files(out) == before


def test_a_resume_with_other_labels_is_refused_before_writing(inputs, tmp_path, capsys):
    out, train = tmp_path / "out", tmp_path / "train.tsv"
    script = "finetune_classification"
    assert load_example(script).main(script_argv(script, inputs, out)) == 0
    train.write_text((inputs / "train.tsv").read_text().replace("\tb\n", "\tc\n"))
    before = _files(out)
    args = script_argv(script, inputs, out, "--resume", "--max-steps", "2")
    args[args.index("--train") + 1] = args[args.index("--eval") + 1] = str(train)
    err = _one_line(capsys, script, args)
    assert "['a', 'b']" in err and "['a', 'c']" in err, err
    assert _files(out) == before


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_a_corpus_that_cannot_be_downloaded_is_refused_before_out(script, inputs, tmp_path,
                                                                  capsys, monkeypatch):
    """Without --data-dir the corpus is downloaded, which was done once the run held --out:
    offline, the refusal left the folder and its lock behind."""
    monkeypatch.setenv("MINIBERT_WIKITEXT_URL", (tmp_path / "no-mirror").as_uri())
    out = tmp_path / "out"
    args = script_argv(script, inputs, out, "--cache-dir", str(tmp_path / "cache"))
    del args[args.index("--data-dir"):args.index("--data-dir") + 2]
    assert "no-mirror" in _one_line(capsys, script, args)
    assert not out.exists()


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resumed"])
def test_a_run_that_fails_at_its_first_step_leaves_out_as_it_found_it(
        resume, inputs, tmp_path, capsys, monkeypatch):
    """A failure no check foresaw, at the first step (a batch the model cannot take): what
    the start wrote (the lock, labels.json, tokenizer/) goes with it."""
    import minibert.training.engine

    out, script = tmp_path / "out", "finetune_classification"
    flags = ["--resume", "--max-steps", "2"] if resume else []
    if resume:
        assert load_example(script).main(script_argv(script, inputs, out)) == 0
    before = _files(out) if resume else None

    def cannot(*args, **kwargs):
        raise ValueError("this batch cannot be computed")

    monkeypatch.setattr(minibert.training.engine, "loss_of", cannot)
    assert "cannot be computed" in _one_line(capsys, script,
                                             script_argv(script, inputs, out, *flags))
    if resume:
        assert _files(out) == before
    else:
        assert not out.exists(), _files(out)


# ---- numbers after a flag --------------------------------------------------------------------

@pytest.mark.parametrize("script", TRAINING)
def test_a_negative_rate_is_refused_by_its_rule_not_by_the_parser(script, inputs, tmp_path,
                                                                  capsys):
    """argparse took `-1e-4` for a flag and said only "expected one argument"."""
    for lr in (["--lr", "-1e-4"], ["--lr=-1e-4"]):
        err = _one_line(capsys, script, script_argv(script, inputs, tmp_path / "out", *lr))
        assert "--lr > 0" in err and "--lr -0.0001" in err
    assert not (tmp_path / "out").exists()


def test_negative_values_reach_every_number_flag_and_nothing_else():
    p = cli.ArgumentParser("test")
    p.add_argument("--lr", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--name")
    p.add_argument("-x", action="store_true")
    args = p.parse_args(["--lr", "-1e-4", "--steps", "-3", "--name", "n"])
    assert (args.lr, args.steps, args.name) == (-1e-4, -3, "n")
    assert p.parse_args(["--lr", "-inf"]).lr == -math.inf
    with pytest.raises(SystemExit):  # a text flag keeps argparse's rule
        p.parse_args(["--name", "-1e-4"])


def test_settings_errors_are_said_in_flag_names():
    from minibert.training.state import TrainConfig

    flags = {"lr": "--lr", "min_lr": "--min-lr", "batch_size": "--batch-size",
             "warmup": "--warmup-steps"}
    for fields, said in [({"batch_size": 0}, ["--batch-size 0", ">= 1"]),
                         ({"lr": 1e-3, "min_lr": 1e-2},
                          ["--min-lr <= --lr", "--lr 0.001", "--min-lr 0.01"]),
                         ({"warmup": 9, "max_steps": 4, "decay_steps": 4},
                          ["--warmup-steps", "9 steps", "total_steps=4"])]:
        with raises(ValueError, *said) as e:
            cli.in_flag_names(lambda: TrainConfig(**fields), flags)
        assert not {"batch_size", "min_lr"} & set(str(e.value).split()), str(e.value)


# ---- SQuAD 2.0 questions without --version-2 ---------------------------------------------------

@pytest.mark.parametrize("flag,said", [(True, "true"), ("True", '"True"')])
def test_an_unanswerable_question_is_named_with_its_flags_value(flag, said, inputs, tmp_path,
                                                               capsys):
    doc = json.loads((inputs / "train.json").read_text())
    doc["data"][0]["paragraphs"][3]["qas"][0].update(is_impossible=flag, answers=[])
    (tmp_path / "v2.json").write_text(json.dumps(doc))
    args = script_argv("finetune_qa", inputs, tmp_path / "out")
    args[args.index("--train") + 1] = str(tmp_path / "v2.json")
    err = _one_line(capsys, "finetune_qa", args)
    assert_carries(err, "v2.json", "'q3'", "is_impossible", said, "--version-2")
    assert not (tmp_path / "out").exists()


# ---- the evaluation data belongs to the run ----------------------------------------------------

def _fewer(src, dst):
    """`dst`: the file `src` with about half its examples, as another evaluation set."""
    text = src.read_text()
    if src.suffix == ".json":
        doc = json.loads(text)
        doc["data"][0]["paragraphs"] = doc["data"][0]["paragraphs"][:4]
        dst.write_text(json.dumps(doc))
    elif src.suffix == ".conll":
        dst.write_text("\n\n".join(text.strip().split("\n\n")[:8]) + "\n")
    else:
        dst.write_text("".join(text.splitlines(keepends=True)[:9]))
    return dst


@pytest.mark.parametrize("script,said", [  # the setting, named as the command gives it
    ("finetune_classification", "--eval file"),
    ("finetune_token_classification", "--eval file"),
    ("finetune_qa", "--eval file"),
    ("finetune_multitask", "t eval file")])
def test_a_resume_on_other_evaluation_data_is_refused(script, said, inputs, tmp_path, capsys):
    """A resume scored its later epochs on another --eval file than its first ones, and
    metrics.jsonl mixed the two with nothing to tell them apart."""
    out = tmp_path / "out"
    assert load_example(script).main(script_argv(script, inputs, out)) == 0
    rows = (out / "metrics.jsonl").read_text()
    args = script_argv(script, inputs, out, "--resume", "--max-steps", "2")
    original = {"finetune_classification": "train.tsv", "finetune_qa": "train.json"}.get(
        script, "train.conll")
    other = str(_fewer(inputs / original, tmp_path / f"other{Path(original).suffix}"))
    if script == "finetune_multitask":
        at = args.index("--task") + 1
        args[at] = args[at].rsplit(":", 1)[0] + ":" + other
    else:
        args[args.index("--eval") + 1] = other
    assert_carries(_one_line(capsys, script, args), str(out / "checkpoints"), said)
    assert (out / "metrics.jsonl").read_text() == rows


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_a_resume_on_another_eval_split_or_share_of_it_is_refused(script, inputs, tmp_path,
                                                                 capsys):
    """The evaluation split's text, and --eval-batches (how much of it is scored), are the
    run's: the same text in another folder resumes, other text or another count does not."""
    out = tmp_path / "out"
    assert load_example(script).main(script_argv(script, inputs, out)) == 0
    wiki = tmp_path / "wiki"
    shutil.copytree(inputs / "wiki", wiki)
    args = script_argv(script, inputs, out, "--resume", "--max-steps", "2", "--data-dir",
                       str(wiki))
    articles = (wiki / "valid.txt").read_text().split(" = Article ")
    (wiki / "valid.txt").write_text(" = Article ".join(articles[:-1]))
    assert_carries(_one_line(capsys, script, args), "--eval-split valid")  # its text differs
    shutil.copy(inputs / "wiki" / "valid.txt", wiki / "valid.txt")
    err = _one_line(capsys, script, [*args, "--eval-batches", "2"])
    assert_carries(without(err, tmp_path), "--eval-batches", "1", "2")


# ---- messages that name the way out ------------------------------------------------------------

@pytest.mark.parametrize("script", ["finetune_classification", "finetune_token_classification",
                                    "finetune_qa", "finetune_multitask"])
@pytest.mark.parametrize("flag", ["--train", "--eval"])
def test_a_data_file_flag_given_a_folder_says_it_is_a_folder(script, flag, inputs, tmp_path,
                                                            capsys):
    """It was said to be "not found", and the user went looking for a typo."""
    folder = tmp_path / "data"
    folder.mkdir()
    args = script_argv(script, inputs, tmp_path / "out")
    if script == "finetune_multitask":
        at = args.index("--task") + 1
        name, kind, train, evaluation = args[at].split(":")
        args[at] = ":".join([name, kind, *((str(folder), evaluation) if flag == "--train"
                                           else (train, str(folder)))])
    else:
        args[args.index(flag) + 1] = str(folder)
    err = _one_line(capsys, script, args)
    assert_carries(err, str(folder), "folder")
    assert "not found" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_a_wikitext_folder_without_a_train_split_names_the_flags_that_choose_one(
        script, inputs, tmp_path, capsys):
    """The copy of WikiText-2 found offline holds only valid.txt and test.txt."""
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    for split in ("valid", "test"):
        shutil.copy(inputs / "wiki" / "valid.txt", wiki / f"{split}.txt")
    out = tmp_path / "out"
    args = script_argv(script, inputs, out, "--data-dir", str(wiki))
    err = _one_line(capsys, script, args)
    assert_carries(err, "'train'", str(wiki), "test, valid", "--train-split", "--eval-split")
    assert not out.exists()
    # and the flags it names are the way out
    assert load_example(script).main([*args, "--train-split", "valid",
                                      "--eval-split", "test"]) == 0


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_a_split_wikitext_lacks_is_refused_before_the_download(script, inputs, tmp_path,
                                                               capsys, monkeypatch):
    """Without --data-dir the corpus is downloaded; a split WikiText has no such name is
    said by its flag before anything is fetched or written."""
    import minibert.data.wikitext as wikitext

    monkeypatch.setattr(wikitext, "download_wikitext", lambda *a, **k: pytest.fail("fetched"))
    out = tmp_path / "out"
    args = script_argv(script, inputs, out)
    args = [a for i, a in enumerate(args) if a != "--data-dir" and
            (i == 0 or args[i - 1] != "--data-dir")]
    err = _one_line(capsys, script, [*args, "--eval-split", "validation"])
    assert "--eval-split" in err and "'validation'" in err and "valid" in err, err
    assert not out.exists()


@pytest.mark.parametrize("script,flag", [("finetune_classification", "--init-from"),
                                         ("pretrain_wikitext", "--init-from"),
                                         ("distill", "--teacher"), ("embed", "--model")])
def test_a_model_folder_flag_given_a_file_says_it_is_a_file(script, flag, inputs, tmp_path,
                                                            capsys):
    """The weights file of a model folder, given for the folder, was "not found"."""
    weights = inputs / "teacher" / "model.safetensors"
    out = tmp_path / "out"
    args = script_argv(script, inputs, out)
    if flag in args:
        args[args.index(flag) + 1] = str(weights)
    else:
        args += [flag, str(weights)]
    err = _one_line(capsys, script, from_checkpoint(args))
    assert_carries(err, str(weights), "file")
    assert not out.exists()
