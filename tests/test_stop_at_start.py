"""Ctrl-C (SIGINT) or SIGTERM at any moment of a script's life is a clean stop: one line on
stderr, exit status 128 + N, and an --out that a run stopped before its first step leaves as
it found it (a resumed run's folder keeps everything it held).

Each script runs in a process of its own, as a user runs it. The signal is sent by the
process to itself as it enters a chosen function, a start-up phase named in the test, so
that each case lands in the same phase every time (a timer would race the phases)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest


from engine_utils import load_example
from script_inputs import SCRIPTS, make_inputs_with_teacher, script_argv

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TRAINING = [s for s in SCRIPTS if s != "embed"]

# Runs examples/SCRIPT.py as `python examples/SCRIPT.py ARGS` does, with MODULE.FUNCTION made
# to send the signal SIGNAME to this process as it is first called.
RUNNER = textwrap.dedent("""
    import importlib, os, runpy, signal, sys
    script, target, signame = sys.argv[1:4]
    *path, name = target.split(".")
    owner, attrs = None, []
    while owner is None:  # the longest importable prefix: a module; the rest, its attributes
        try:
            owner = importlib.import_module(".".join(path))
        except ImportError:
            attrs.insert(0, path.pop())
    for attr in attrs:  # a class, for CLASS.METHOD
        owner = getattr(owner, attr)
    original, sent = getattr(owner, name), []

    def signalled(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), getattr(signal, signame))
        return original(*args, **kwargs)

    setattr(owner, name, signalled)
    sys.argv = [script, *sys.argv[4:]]
    runpy.run_path(script, run_name="__main__")
""")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def _run(script, args, at, signame="SIGINT"):
    """(exit status, stdout, stderr) of `script` with `args`, signalled on entering `at`."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(EXAMPLES / f"{script}.py"), at,
                           signame, *args], capture_output=True, text=True, env=env,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def _files(folder):
    """Every path under `folder`, with a file's bytes (None for a folder)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("script", TRAINING)
def test_ctrl_c_while_training_starts_leaves_no_run_behind(script, inputs, tmp_path):
    """SIGINT while `engine.train` builds the optimizer, before its own handlers are in
    place: once a 74-line KeyboardInterrupt traceback, and an --out holding .lock,
    labels.json and tokenizer/ (which a later start then had to step around)."""
    out = tmp_path / "runs" / "out"
    code, _, err = _run(script, script_argv(script, inputs, out, "--max-steps", "50"),
                        "minibert.training.run.build_optimizer")
    line = _one_line(err)
    assert code == 130 and "SIGINT" in line, (code, err[-3000:])
    assert not out.exists() and not (tmp_path / "runs").exists(), _files(tmp_path)


def test_sigterm_while_training_starts_exits_143(inputs, tmp_path):
    out = tmp_path / "out"
    script = "finetune_classification"
    code, _, err = _run(script, script_argv(script, inputs, out, "--max-steps", "50"),
                        "minibert.training.run.build_optimizer", "SIGTERM")
    assert code == 143 and "SIGTERM" in _one_line(err), (code, err[-3000:])
    assert not out.exists()


@pytest.mark.parametrize("at", ["minibert.cli.finetune.check_args",
                                "minibert.data.tokenizer.Tokenizer.save"])
def test_ctrl_c_before_or_while_writing_the_run_folder(at, inputs, tmp_path):
    """Before anything is written (the flags' checks), and while the run's tokenizer is
    being written into --out."""
    out = tmp_path / "out"
    script = "finetune_classification"
    code, _, err = _run(script, script_argv(script, inputs, out), at)
    assert code == 130 and "SIGINT" in _one_line(err), (code, err[-3000:])
    assert not out.exists(), _files(out)


# After the optimizer is built, then after the checkpoint is loaded (the last phase of start-up)
@pytest.mark.parametrize("script,at", [
    ("finetune_classification", "minibert.training.run.build_optimizer"),
    ("pretrain_wikitext", "minibert.training.run.resolve_warmup")])
def test_ctrl_c_while_a_resume_starts_keeps_everything_the_run_held(script, at, inputs,
                                                                     tmp_path):
    """A resumed run stopped before its first new step: the folder is as it was, byte for
    byte, the log rows a killed run wrote after its last checkpoint included (a resume
    drops those once it trains, not before)."""
    out = tmp_path / "out"
    assert load_example(script).main(script_argv(script, inputs, out, "--log-every",
                                                 "1")) == 0
    with open(out / "metrics.jsonl", "a") as f:  # what a kill -9 after a log row leaves
        f.write('{"step": 2, "loss": 4.0, "lr": 0.001}\n')
    before = _files(out)
    code, _, err = _run(script, script_argv(script, inputs, out, "--resume", "--max-steps",
                                            "3"), at)
    assert code == 130 and "SIGINT" in _one_line(err), (code, err[-3000:])
    assert _files(out) == before


def test_a_signal_during_the_last_save_stops_the_run(inputs, tmp_path):
    """A signal that arrives while the last step's checkpoint is written, after the step
    looked for one: the run once went on to its final evaluation and exited 0."""
    out = tmp_path / "out"
    script = "finetune_classification"
    code, _, err = _run(script, script_argv(script, inputs, out),
                        "minibert.training.run.save_run")
    line = _one_line(err)
    assert code == 130 and "SIGINT" in line and "--resume" in line, (code, err[-3000:])
    assert (out / "checkpoints" / "step_00000001").is_dir() and not (out / "final").exists()


def _holds_back_sigint(pid):
    """Whether process `pid` holds SIGINT back (blocked), from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc (Linux)")
def test_ctrl_c_while_python_loads_torch(inputs, tmp_path):
    """The first seconds of a script, while Python imports torch: SIGINT is sent as soon as
    the script's first lines hold it back, which is before those imports begin."""
    out = tmp_path / "out"
    script = "finetune_classification"
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / f"{script}.py"),
                             *script_argv(script, inputs, out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not _holds_back_sigint(proc.pid):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.001)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "SIGINT" in _one_line(err), (proc.returncode, err)
    assert "before anything was written" in err and not out.exists()


def test_ctrl_c_while_embedding(inputs, tmp_path):
    out = tmp_path / "vectors" / "v.npy"
    args = script_argv("embed", inputs, tmp_path)
    args[args.index("--out") + 1] = str(out)
    code, _, err = _run("embed", args, "minibert.tasks.sentence.SentenceEncoder.encode")
    assert code == 130 and "SIGINT" in _one_line(err), (code, err[-3000:])
    assert not (tmp_path / "vectors").exists()
