"""bench_quality's verdict on the aims it measures: the main job's model ahead of transformers'
recipe at the budget, and transformers' recipe short of the main job's scores at five times
the budget, each read from the means of the seeds."""

import pytest

from engine_utils import load_example


@pytest.fixture(scope="module")
def bench():
    return load_example("bench_quality", "benchmarks")


def _row(glue, blimp=None, minutes=60):
    row = {"glue": {"mean": glue, "std": 0.5}, "tasks": {}, "budget_seconds": 60.0 * minutes}
    if blimp is not None:
        row["blimp"] = blimp / 100
    return row


def _verdicts(bench, rows):
    return {a.claim: a.met for a in bench.aims(rows, "main")}


def test_ahead_at_the_budget_needs_both_scores(bench):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1, 57.9)}
    assert _verdicts(bench, rows)[bench.AHEAD] is True
    rows["transformers"] = _row(38.1, 62.0)  # ahead on GLUE alone
    assert _verdicts(bench, rows)[bench.AHEAD] is False
    rows["transformers"] = _row(41.4, 57.9)  # ahead on BLiMP alone
    assert _verdicts(bench, rows)[bench.AHEAD] is False


def test_five_times_is_met_while_transformers_stays_below_both_scores(bench):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1, 57.9),
            "transformers-5x": _row(40.0, 60.0, minutes=300)}
    assert _verdicts(bench, rows)[bench.FIVE_TIMES] is True
    rows["transformers-5x"] = _row(41.5, 60.0, minutes=300)  # reached the GLUE score
    assert _verdicts(bench, rows)[bench.FIVE_TIMES] is False
    rows["transformers-5x"] = _row(40.0, 61.2, minutes=300)  # level is reached
    assert _verdicts(bench, rows)[bench.FIVE_TIMES] is False


def test_an_aim_not_measured_says_so_rather_than_passing(bench):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1)}  # no BLiMP, no 5x, no fifth
    verdicts = _verdicts(bench, rows)
    assert verdicts[bench.AHEAD] is None
    assert verdicts[bench.FIVE_TIMES] is None
    assert verdicts[bench.FIFTH] is None


def test_the_fifth_reads_the_same_ratio_from_the_main_jobs_side(bench):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1, 57.9),
            "main-fifth": _row(37.4, 60.8, minutes=12)}
    assert _verdicts(bench, rows)[bench.FIFTH] is False  # behind on GLUE
    rows["main-fifth"] = _row(38.2, 60.8, minutes=12)
    assert _verdicts(bench, rows)[bench.FIFTH] is True


def test_the_report_writes_the_verdicts(bench, tmp_path):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1, 57.9),
            "transformers-5x": _row(40.0, 60.0, minutes=300)}
    lines = bench.aim_lines(bench.aims(rows, "main"))
    assert len(lines) == 3
    assert "41.3" in lines[0] and "38.1" in lines[0]
    assert "40.0" in lines[1] and "300" in lines[1]
