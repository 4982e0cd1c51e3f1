"""--time-budget: a run's length fitted to a time, measured once and kept (training/budget.py).

The measured times are injected (a clock that advances by a fixed amount each time it is
read), so what these tests choose does not depend on this machine's speed."""

import torch

from minibert.data.seq_warmup import seq_len_at
from minibert.training import budget
from minibert.training.state import TrainConfig

from facts import raises


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
