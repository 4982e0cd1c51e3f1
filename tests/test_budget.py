"""--time-budget: a run's length fitted to a time, measured once and kept (training/budget.py).

The measured times are injected (a clock that advances by a fixed amount each time it is
read), so what these tests choose does not depend on this machine's speed."""

import json
import logging
import shutil

import pytest
import torch

from minibert.data.seq_warmup import seq_len_at
from minibert.training import budget
from minibert.training.checkpoint import latest_checkpoint, load_checkpoint
from minibert.training.state import TrainConfig

from engine_utils import load_example, step_clock, weights_file, wikitext_folder
from facts import assert_carries, raises, without

pretrain = load_example("pretrain_wikitext")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"))


def _args(data_dir, out, cache, *extra):
    return ["--data-dir", str(data_dir), "--out", str(out), "--cache-dir", str(cache),
            "--preset", "tiny", "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8",
            "--log-every", "1", "--no-progress", "--eval-batches", "2",
            "--precision", "fp32", *extra]


# ---- the duration -----------------------------------------------------------------------------

def test_durations_as_people_write_them():
    assert budget.parse_duration("90s") == 90.0
    assert budget.parse_duration("45m") == 45 * 60.0
    assert budget.parse_duration("1h") == 3600.0
    assert budget.parse_duration("1.5h") == 5400.0
    assert budget.parse_duration("600") == 600.0
    assert budget.parse_duration(" 2.5 ") == 2.5
    assert budget.parse_duration("2H") == 7200.0
    for bad in ["", "soon", "1d", "h", "1h30m", "-1h", "-5", "1e3", "inf", "nan", "1..5h"]:
        with raises(ValueError, repr(bad), "90s", "1.5h"):
            budget.parse_duration(bad)
    for zero in ["0", "0s", "0.0h"]:
        with raises(ValueError, repr(zero), "more than 0"):
            budget.parse_duration(zero)


# ---- the estimate and the step count ----------------------------------------------------------

def test_the_lengths_of_a_schedule_are_seq_len_at_step_by_step():
    for full, start, warmup, steps in [(32, 16, 4, 12), (128, 16, 500, 1000), (64, 20, 7, 7),
                                       (32, 32, 5, 9), (48, 16, 0, 5), (128, 8, 333, 400)]:
        expected = [seq_len_at(s, full, start, warmup) if warmup else full
                    for s in range(1, steps + 1)]
        assert budget.schedule_lengths(steps, full, start, warmup).tolist() == expected


def test_the_step_count_integrates_the_length_schedule():
    """Lengths 32 with a warmup from 16 over half the run; a step takes 1 s at 16 tokens and
    2 s at 32, so 1.5 s at 24 (between the two measured). By hand (seq_len_at):
      8 steps, warmup 4:  16 24 24 32 | 32 32 32 32       1 + 1.5 + 1.5 + 2 + 4 * 2 = 14
      9 steps, warmup 4 (round(4.5), to even): the same, and one more step at 32  = 16
     10 steps, warmup 5:  16 16 24 24 32 | 32 * 5         1 + 1 + 1.5 + 1.5 + 2 + 10 = 17
    A budget of 16 s fits 9 steps; timed at full length alone, it would fit 8."""
    times = budget.StepTimes({16: 1.0, 32: 2.0}, eval_batch=0.0)
    cfg = TrainConfig(seq_len_warmup=0.5, seq_len_start=16, eval_every=0)
    assert times.at(24) == 1.5 and times.at(8) == 1.0 and times.at(64) == 2.0
    assert [budget.estimate_seconds(n, times, cfg, 32) for n in (8, 9, 10)] == [14, 16, 17]
    assert budget.fit_steps(16.0, times, cfg, 32, reserve=0.0).steps == 9
    assert budget.fit_steps(16.99, times, cfg, 32, reserve=0.0).steps == 9
    assert budget.fit_steps(17.0, times, cfg, 32, reserve=0.0).steps == 10
    flat = budget.StepTimes({32: 2.0}, eval_batch=0.0)
    assert budget.fit_steps(16.0, flat, cfg, 32, reserve=0.0).steps == 8
    # The reserve is held back: 5% of 17.9 s leaves 17.005 s
    assert budget.fit_steps(17.9, times, cfg, 32).steps == 10
    assert budget.fit_steps(17.85, times, cfg, 32).steps == 9


def test_evaluations_count_in_the_estimate():
    """An evaluation of 2 batches at 0.5 s costs 1 s: at every --eval-every step before the
    last, and once at the end."""
    times = budget.StepTimes({32: 1.0}, eval_batch=0.5)
    at_end = TrainConfig(seq_len_warmup=0, eval_every=0, eval_batches=2)
    every_4 = TrainConfig(seq_len_warmup=0, eval_every=4, eval_batches=2)
    assert budget.estimate_seconds(9, times, at_end, 32) == 9 + 1
    assert budget.estimate_seconds(9, times, every_4, 32) == 9 + 3  # steps 4, 8 and the end
    assert budget.estimate_seconds(8, times, every_4, 32) == 8 + 2  # step 8 is the end
    fit = budget.fit_steps(12.0, times, every_4, 32, reserve=0.0)
    assert (fit.steps, fit.evaluations, fit.estimate) == (9, 3, 12.0)


def test_an_evaluations_own_scores_count_in_the_estimate():
    """An eval_fn that scores more than the batches (--eval-blimp's pairs): 3 s more at each
    of the 3 evaluations of 9 steps every 4."""
    times = budget.StepTimes({32: 1.0}, eval_batch=0.5, eval_extra=3.0)
    every_4 = TrainConfig(seq_len_warmup=0, eval_every=4, eval_batches=2)
    assert budget.estimate_seconds(9, times, every_4, 32) == 9 + 3 * (1 + 3)
    fit = budget.fit_steps(21.0, times, every_4, 32, reserve=0.0)
    assert (fit.steps, fit.evaluations, fit.estimate) == (9, 3, 21.0)
    assert "evaluation's own scores 3 s" in budget.describe(times)


def test_a_budget_that_fits_no_step_is_refused():
    times = budget.StepTimes({32: 2.0}, eval_batch=1.0)
    cfg = TrainConfig(seq_len_warmup=0, eval_batches=2)
    with raises(ValueError, "3.9 s", "one step", "4 s"):  # a step 2 s, the evaluation 2 s
        budget.fit_steps(3.9, times, cfg, 32, reserve=0.0)
    assert budget.fit_steps(4.0, times, cfg, 32, reserve=0.0).steps == 1


def test_measuring_leaves_the_model_and_every_generator_as_they_were(tmp_path):
    from engine_utils import tiny_corpus, tiny_model
    from minibert.data import MLMCollator
    from minibert.training.distributed import DistContext
    tok, data = tiny_corpus(tmp_path)
    model = tiny_model(tok, dropout=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    draws = torch.rand(3)
    torch.manual_seed(123)
    times = budget.measure_step_times(model, data, MLMCollator(tok, seed=0),
                                      TrainConfig(batch_size=4, precision="fp32"),
                                      DistContext(), [16, 32], "fp32", repeats=2)
    assert torch.equal(torch.rand(3), draws)  # the run draws what it would have
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert set(times.by_length) == {16, 32} and times.eval_batch > 0
    assert all(t > 0 for t in times.by_length.values())
    assert budget.measured_lengths(128, 16) == [16, 72, 128]
    assert budget.measured_lengths(32, 32) == [32] and budget.measured_lengths(32, 48) == [32]


# ---- the main job -----------------------------------------------------------------------------

def _error_line(capsys, argv):
    code = pretrain.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_refusals_name_the_flags_and_leave_no_out(data_dir, tmp_path, capsys, monkeypatch):
    readings = step_clock(monkeypatch, 1.0)
    out, cache = tmp_path / "run", tmp_path / "cache"
    cases = [
        (["--time-budget", "1h", "--max-steps", "6"], ["--time-budget", "--max-steps"]),
        (["--time-budget", "1h", "--decay-steps", "6"], ["--time-budget", "--decay-steps"]),
        (["--time-budget", "soon"], ["--time-budget", "'soon'", "1.5h"]),
        (["--time-budget", "0"], ["--time-budget", "'0'", "more than 0"]),
        (["--time-budget=-1h"], ["--time-budget", "'-1h'"]),
        # measured, then refused: one step and the final evaluation take 1 + 2 s
        (["--time-budget", "2s"], ["--time-budget 2s", "one step"]),
        # a warmup in steps longer than the steps the budget fits (9)
        (["--time-budget", "12s", "--warmup-steps", "10"], ["--warmup-steps", "10 steps",
                                                             "--time-budget"]),
    ]
    for extra, facts in cases:
        assert_carries(without(_error_line(capsys, _args(data_dir, out, cache, *extra)), out),
                       *facts)
        assert not out.exists(), extra
    assert readings  # the last two were measured before they were refused


def _run(data_dir, out, cache, *extra) -> None:
    assert pretrain.main(_args(data_dir, out, cache, *extra)) == 0


def _saved_config(out) -> dict:
    saved = load_checkpoint(latest_checkpoint(out / "checkpoints"))
    return saved["train_config"], saved["data_identity"]


def test_the_budget_sets_the_steps_and_the_schedule_fits_them(data_dir, tmp_path, monkeypatch,
                                                              caplog):
    """Each step measures 1 s and each evaluation batch 1 s: 23.2 s less 5% is 22.04 s, the
    final evaluation of 2 batches takes 2, so 20 steps fit. The main job's fractions then
    apply to 20: a learning-rate warmup of 2 steps and a sequence-length warmup of 10."""
    step_clock(monkeypatch, 1.0)
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        _run(data_dir, out, tmp_path / "cache", "--time-budget", "23.2s")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert_carries(said, "--time-budget 23.2s", "20 steps", "--max-steps 20",
                   "warmup to 0.001 over 2 steps", "16 -> 32 tokens over steps 1-10")
    train_config, identity = _saved_config(out)
    assert train_config["max_steps"] == train_config["decay_steps"] == 20
    assert identity["--time-budget"] == {"seconds": 23.2, "steps": 20}
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    lr = {r["step"]: r["lr"] for r in rows if "lr" in r}
    assert lr[1] == pytest.approx(1e-3 / 2) and lr[2] == pytest.approx(1e-3)
    assert lr[20] == pytest.approx(1e-5)  # decayed to --min-lr at the budget's last step
    summary = json.loads((out / "eval.json").read_text())
    # 16 + 32 * (s - 1) / 10 ... in multiples of 8 over steps 1-10, then 32
    lengths = [seq_len_at(s, 32, 16, 10) for s in range(1, 21)]
    assert summary["steps"] == 20 and summary["tokens_seen"] == 8 * sum(lengths)


def test_the_budget_counts_eval_blimps_scoring(data_dir, tmp_path, monkeypatch, caplog):
    """--eval-blimp scores 10 pairs of each of 2 paradigms at each evaluation. A tenth of them
    is timed, at 1 s, so an evaluation costs its 2 batches and 10 s of scoring: 23.2 s less
    5% (22.04 s) then fits 10 steps, where without it 20 fit (test_the_budget_sets_...)."""
    from engine_utils import blimp_folder
    step_clock(monkeypatch, 1.0)
    (tmp_path / "blimp").mkdir()
    blimp = blimp_folder(tmp_path / "blimp")
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        _run(data_dir, out, tmp_path / "cache", "--time-budget", "23.2s",
             "--eval-blimp", str(blimp), "--eval-blimp-pairs", "10")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert_carries(said, "10 steps fit", "--max-steps 10", "evaluation's own scores 10 s")
    assert _saved_config(out)[0]["max_steps"] == 10


def test_every_fresh_start_says_its_plan_and_the_time_it_will_take(data_dir, tmp_path,
                                                                   monkeypatch, caplog):
    """Each step measures 1 s and each evaluation batch 1 s: 6 steps and the final evaluation
    of 2 batches make 8 s (how the lengths count: test_the_step_count_integrates_...)."""
    step_clock(monkeypatch, 1.0)
    with caplog.at_level(logging.INFO):
        _run(data_dir, tmp_path / "run", tmp_path / "cache", "--max-steps", "6")
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert_carries(said, "plan: 6 steps of 8 sequences, about 8 s",
                   "16 -> 32 tokens over steps 1-3", "decay to 1e-05 at step 6")


def test_a_budget_run_is_a_max_steps_run_of_its_steps_bit_for_bit(data_dir, tmp_path,
                                                                   monkeypatch):
    """Measuring trains a copy, and puts every generator back: with dropout drawing from
    torch's generator, the budget's 20 steps give the very weights --max-steps 20 gives."""
    readings = step_clock(monkeypatch, 1.0)
    cache = tmp_path / "cache"
    _run(data_dir, tmp_path / "budget", cache, "--time-budget", "23.2s", "--dropout", "0.1")
    assert readings
    _run(data_dir, tmp_path / "steps", cache, "--max-steps", "20", "--dropout", "0.1")
    for name in (weights_file(tmp_path / "budget" / "final").name, "config.json"):
        assert (tmp_path / "budget" / "final" / name).read_bytes() == \
            (tmp_path / "steps" / "final" / name).read_bytes(), name


def test_a_resume_keeps_the_steps_and_never_measures_again(data_dir, tmp_path, monkeypatch,
                                                           capsys, caplog):
    """A budget run cut short after its checkpoint at step 15, resumed on a machine now ten
    times slower, goes on to its 20 steps and ends with the uninterrupted run's weights."""
    step_clock(monkeypatch, 1.0)
    cache, out, whole = tmp_path / "cache", tmp_path / "run", tmp_path / "whole"
    flags = ["--time-budget", "23.2s", "--save-every", "5"]
    _run(data_dir, whole, cache, *flags)
    shutil.copytree(whole, out)  # the same run again (a run is its own record: run.json)
    # What a stop after step 15's checkpoint leaves: no step 20, no outputs.
    for path in ("checkpoints/step_00000020", "final", "eval.json"):
        target = out / path
        for child in sorted(target.rglob("*"), reverse=True) if target.is_dir() else []:
            child.unlink() if child.is_file() else child.rmdir()
        target.rmdir() if target.is_dir() else target.unlink()

    readings = step_clock(monkeypatch, 10.0)  # measured now, 20 steps would not fit
    _run(data_dir, out, cache, *flags, "--resume")
    assert not readings  # nothing measured
    assert _saved_config(out)[0]["max_steps"] == 20
    assert weights_file(out / "final").read_bytes() == \
        weights_file(whole / "final").read_bytes()
    capsys.readouterr()
    # A finished budget run resumed: nothing to do, at its own 20 steps.
    _run(data_dir, out, cache, *flags, "--resume")
    said = capsys.readouterr().out
    assert_carries(said, "complete", "step 20")
    assert "--max-steps" not in said  # beside a budget it is refused: no such advice
    # Another budget, or none, is another run: refused by name, and not said to be kept.
    for extra, facts in [(["--time-budget", "1h"], ["--time-budget", "23.2", "3600"]),
                         ([], ["--time-budget", "not set"])]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            err = _error_line(capsys, _args(data_dir, out, cache, "--resume", *extra))
        assert_carries(err, *facts)
        assert "fitted at its start" not in caplog.text and "plan:" not in caplog.text
