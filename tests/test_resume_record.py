"""What --resume does to a run's record, in every script: a finished run is left as it is,
byte for byte, and a run stopped and resumed ends with the eval.json of a run never stopped,
its times summed over its starts."""

import json
import os
import signal
import time

import pytest

from engine_utils import load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries
from script_inputs import SCRIPTS, make_inputs_with_teacher, script_argv

TRAINING = [s for s in SCRIPTS if s != "embed"]
TIMES = ("wall_seconds", "train_seconds")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def _listing(folder):
    """Every path under `folder` (the lock file too): a file's bytes and mtime, a folder's
    mtime (which an entry made or removed, a temporary file included, changes)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        st = path.stat()
        found[path.relative_to(folder).as_posix()] = (
            path.read_bytes() if path.is_file() else None, st.st_mtime_ns)
    return found


# ---- a finished run ----------------------------------------------------------------------------

@pytest.mark.parametrize("script", TRAINING)
def test_a_resume_of_a_finished_run_rewrites_nothing(script, inputs, tmp_path, capsys):
    """It exited 0 having written final/, eval.json ("wall_seconds": 0.0 where it held the
    run's time) and the predictions again."""
    out = tmp_path / "out"
    main = load_example(script).main
    assert main(script_argv(script, inputs, out)) == 0
    if script == "pretrain_wikitext":
        assert (out / "loss.png").is_file()
    if script == "distill":
        assert (out / "baseline" / "checkpoints").is_dir()
    before = _listing(out)
    time.sleep(0.01)  # a rewrite now has another mtime, whatever the clock's grain
    capsys.readouterr()
    assert main(script_argv(script, inputs, out, "--resume")) == 0
    said = capsys.readouterr()
    lines = [ln for ln in said.out.splitlines() if "complete" in ln]
    assert len(lines) == 1, said.out
    assert_carries(lines[0], str(out), "step 1")
    assert said.err == ""
    assert _listing(out) == before


@pytest.mark.parametrize("script", TRAINING)
def test_a_resume_of_a_finished_run_with_more_steps_goes_on(script, inputs, tmp_path):
    out = tmp_path / "out"
    main = load_example(script).main
    assert main(script_argv(script, inputs, out)) == 0
    assert main(script_argv(script, inputs, out, "--resume", "--max-steps", "2")) == 0
    record = json.loads((out / "eval.json").read_text())
    steps = ([record["distilled"]["steps"], record["baseline"]["steps"]]
             if script == "distill" else [record["steps"]])
    assert steps == [2] * len(steps)
    assert (out / "checkpoints" / "step_00000002").is_dir()


def test_a_finished_run_whose_outputs_were_not_all_written_is_finished_by_resume(
        inputs, tmp_path):
    """eval.json, written last, marks a run complete: without it (a run stopped while
    writing its outputs) --resume evaluates and writes them."""
    out, script = tmp_path / "out", "finetune_classification"
    main = load_example(script).main
    assert main(script_argv(script, inputs, out)) == 0
    record = (out / "eval.json").read_text()
    (out / "eval.json").unlink()
    assert main(script_argv(script, inputs, out, "--resume")) == 0
    assert json.loads((out / "eval.json").read_text())["steps"] == json.loads(record)["steps"]


def test_an_eval_json_of_fewer_steps_does_not_make_a_longer_run_finished(inputs, tmp_path):
    """A run finished at step 1, resumed to 2 and stopped at its last step (checkpoint 2
    saved, outputs not yet written): eval.json is step 1's, so the run is not complete."""
    out, script = tmp_path / "out", "finetune_classification"
    main = load_example(script).main
    assert main(script_argv(script, inputs, out)) == 0
    args = script_argv(script, inputs, out, "--resume", "--max-steps", "2")
    assert main(args) == 0
    (out / "eval.json").write_text((out / "eval.json").read_text().replace(
        '"steps": 2', '"steps": 1'))
    assert main(args) == 0
    assert json.loads((out / "eval.json").read_text())["steps"] == 2


# ---- a run stopped and resumed keeps its record ------------------------------------------------

SLOW = 0.2  # seconds each step of an interrupted start takes longer


def _stop_at(monkeypatch, call):
    """SIGTERM during the `call`-th optimizer step of this process (a script's second run,
    distillation's without the teacher, counts on), every step SLOW seconds longer until
    then: the stop saves that step's checkpoint and ends the start with status 143."""
    import minibert.training.engine

    real, calls = minibert.training.engine.set_lr, []  # called once at each step's start

    def step(*args, **kwargs):
        calls.append(1)
        time.sleep(SLOW)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGTERM)  # the run's own handler takes it
        return real(*args, **kwargs)

    monkeypatch.setattr(minibert.training.engine, "set_lr", step)


def _timeless(record):
    if isinstance(record, dict):
        return {k: _timeless(v) for k, v in record.items() if k not in TIMES}
    return record


def _times(record, where=()):
    """(where, key, value) of every time in an eval.json."""
    found = []
    for k, v in record.items():
        if isinstance(v, dict):
            found += _times(v, (*where, k))
        elif k in TIMES:
            found.append(((*where, k), v))
    return found


# (script, the optimizer step the first start is stopped in, the steps each of the run's
# trainings took in that start): three steps a run; distillation trains twice, its run
# without the teacher (the baseline) after the distillation.
STOPS = [("finetune_classification", 2, {(): 2}),
         ("finetune_classification", 3, {(): 3}),  # at the last step: only its outputs left
         ("finetune_token_classification", 2, {(): 2}),
         ("finetune_qa", 2, {(): 2}),
         ("finetune_multitask", 2, {(): 2}),
         ("pretrain_wikitext", 2, {(): 2}),
         ("distill", 2, {("distilled",): 2}),
         ("distill", 5, {("distilled",): 3, ("baseline",): 2})]


@pytest.mark.parametrize("script,call,slowed", STOPS, ids=[f"{s}-step{c}" for s, c, _ in STOPS])
def test_a_resumed_run_records_what_an_uninterrupted_one_does(script, call, slowed, inputs,
                                                             tmp_path, monkeypatch):
    """Distillation stopped in its baseline phase and resumed recorded the distilled
    student's wall_seconds as 0.0: the time of that start alone, which only evaluated."""
    main = load_example(script).main
    assert main(script_argv(script, inputs, tmp_path / "ref", "--max-steps", "3")) == 0
    reference = json.loads((tmp_path / "ref" / "eval.json").read_text())
    out = tmp_path / "out"
    args = script_argv(script, inputs, out, "--max-steps", "3")
    _stop_at(monkeypatch, call)
    assert main(args) == 128 + signal.SIGTERM
    assert not (out / "eval.json").exists()
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    record = json.loads((out / "eval.json").read_text())
    assert _timeless(record) == _timeless(reference)
    times = dict(_times(record))
    assert times.keys() == dict(_times(reference)).keys()
    for where, value in times.items():
        # The first start's steps, each SLOW longer, are in the sum: never this start's alone.
        assert value > 0 and value >= SLOW * slowed.get(where[:-1], 0), (where, value)
