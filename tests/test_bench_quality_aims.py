"""bench_quality's verdict on the aims it measures: the main job's model ahead of transformers'
recipe at the budget, and transformers' recipe short of the main job's scores at five times
the budget, each read from the means of the seeds."""

import json
from types import SimpleNamespace

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


def test_the_fifth_counts_a_tie_as_reached(bench):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1, 57.9),
            "main-fifth": _row(38.1, 57.9, minutes=12)}
    assert _verdicts(bench, rows)[bench.FIFTH] is True


def test_glue_averages_over_other_tasks_do_not_compare(bench):
    rows = {"main": _row(41.3, 61.2), "transformers": _row(38.1, 57.9)}
    rows["main"]["tasks"] = {"CoLA": {}, "RTE": {}}
    rows["transformers"]["tasks"] = {"CoLA": {}, "RTE": {}, "MRPC": {}}
    assert _verdicts(bench, rows)[bench.AHEAD] is None


def _results(out, name, glue, blimp=None):
    """What glue.py and blimp.py leave for `name` (the fields report reads)."""
    tasks = {"CoLA": {"score": {"mean": glue}}, "RTE": {"score": {"mean": glue}}}
    (out / f"glue-{name}").mkdir(parents=True)
    (out / f"glue-{name}" / "results.json").write_text(json.dumps(
        {"glue": {"tasks": list(tasks), "mean": glue, "std": 0.5}, "tasks": tasks}))
    if blimp is not None:
        (out / f"blimp-{name}").mkdir()
        (out / f"blimp-{name}" / "results.json").write_text(json.dumps({"overall": blimp / 100}))


def test_the_report_writes_the_verdicts_of_every_candidate(bench, tmp_path, monkeypatch):
    minutes = {"main": 60, "transformers": 60, "transformers-5x": 300, "main-fifth": 12}
    monkeypatch.setattr(bench, "_pretraining_seconds",
                        lambda out, name: (60.0 * minutes.get(name, 0), 0.0))
    monkeypatch.setattr(bench, "plot", lambda out, rows: None)
    _results(tmp_path, "main", 41.3, 61.2)
    _results(tmp_path, "transformers", 38.1, 57.9)
    _results(tmp_path, "transformers-5x", 40.0, 60.0)  # there, though not asked for
    _results(tmp_path, "main-fifth", 37.4, 60.8)
    args = SimpleNamespace(out=tmp_path, candidate=["main=", "other=--flag"],
                           hf_five_times=False)
    bench.report(args)
    found = json.loads((tmp_path / "quality.json").read_text())["aims"]
    met = {c: {a["claim"]: a["met"] for a in aims} for c, aims in found.items()}
    assert met["main"] == {bench.AHEAD: True, bench.FIVE_TIMES: True, bench.FIFTH: False}
    # a candidate whose runs are not there yet: every aim said, none decided
    assert met["other"] == {bench.AHEAD: None, bench.FIVE_TIMES: None, bench.FIFTH: None}
    table = (tmp_path / "quality.md").read_text()
    assert "transformers-5x" in table and "other" in table
