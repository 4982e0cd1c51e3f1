"""Every fine-tuning script survives an interruption exactly: a real process stopped by
SIGTERM, SIGINT or kill -9 mid-run, then run again with --resume, ends with the weights, the
losses and the scores of a run that was never stopped, and a signal's stop exits 128 + N."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from script_inputs import argv, make_inputs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# (script, how it is stopped): each script once, every way of stopping at least once.
CASES = [("finetune_classification", signal.SIGKILL),
         ("finetune_token_classification", signal.SIGTERM),
         ("finetune_qa", signal.SIGKILL),
         ("finetune_multitask", signal.SIGINT)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"))


def _start(script, inputs, out, *extra):
    # One thread, and MKL never choosing fewer: the runs are compared bit for bit.
    env = dict(os.environ, MKL_DYNAMIC="FALSE", OMP_NUM_THREADS="1")
    # Batches of 4 examples: a checkpoint (and an evaluation) every few steps.
    args = argv(script, inputs, None, out, "--max-steps", "60", "--epochs", "100",
                "--log-every", "1", "--dropout", "0.1", *extra)
    return subprocess.Popen([sys.executable, str(EXAMPLES / f"{script}.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def _outcome(out):
    """What must not depend on the interruption: each step's loss and rate, the final
    scores, and the exported weights."""
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    steps = [(r["step"], r["loss"], r["lr"]) for r in rows if "loss" in r]
    scores = {k: v for k, v in json.loads((out / "eval.json").read_text()).items()
              if k not in ("wall_seconds",)}
    weights = {p.relative_to(out / "final").as_posix(): p.read_bytes()
               for p in sorted((out / "final").rglob("*.safetensors"))}
    return steps, scores, weights


@pytest.mark.parametrize("script,stop", CASES, ids=[f"{s}-{g.name}" for s, g in CASES])
def test_an_interrupted_run_resumes_to_the_same_result(script, stop, inputs, tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "run"
    reference = _start(script, inputs, ref)  # side by side, one thread each
    proc = _start(script, inputs, out)
    deadline = time.time() + 120
    while not any((out / "checkpoints").glob("step_*")):  # the first epoch is saved
        assert proc.poll() is None, _finish(proc)[1][-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    proc.send_signal(stop)
    code, log = _finish(proc)
    if stop == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:  # the step in progress ends, a checkpoint is saved, and the status says so
        assert code == 128 + stop and "--resume" in log, (code, log[-3000:])
    assert not (out / "final").exists() and not (out / "eval.json").exists()
    code, log = _finish(reference)
    assert code == 0, log[-3000:]
    code, log = _finish(_start(script, inputs, out, "--resume"))
    assert code == 0, log[-3000:]
    assert _outcome(out) == _outcome(ref)
