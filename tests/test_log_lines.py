"""A run's log as a file holds it: a run whose output goes to a file (`> run.log 2>&1`, as
a practitioner keeps one) draws no progress bar, whose frames joined by carriage returns
would make one long line of the whole run; each logged step and each notice is a line of
its own, and nothing is said twice. `--no-progress` (`progress=False`) drops the bar alone."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from engine_utils import wikitext_folder
from minibert.training.runlog import read_rows

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "pretrain_wikitext.py"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"))


def _logged(argv: list, log: Path) -> list:
    """Run `argv` with stdout and stderr into the file `log` (no terminal), and its lines."""
    with open(log, "w") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=300)
    text = log.read_bytes().decode()  # as written: read_text() would turn "\r" into "\n"
    assert done.returncode == 0, text
    assert "\r" not in text, "a carriage return: bar frames, or a line drawn over"
    return text.split("\n")


def _step_lines(lines: list, rows: list) -> None:
    """Each row of metrics.jsonl is one line of the log, `step N | ...`, in order."""
    said = [line for line in lines if "train_seconds" in line]
    assert all(line.startswith("step ") for line in said), said
    for key in ("loss", "eval_loss"):
        logged = [int(line.split()[1]) for line in said if f" | {key} " in line]
        assert logged == [row["step"] for row in rows if key in row], (key, lines)


def _said_once(lines: list) -> None:
    twice = [line for line, n in Counter(lines).items() if n > 1 and line.strip()]
    assert not twice, twice


@pytest.mark.parametrize("extra", [[], ["--no-progress"]])
def test_a_redirected_pretraining_logs_a_line_per_step_and_per_notice(data_dir, tmp_path,
                                                                      extra):
    out = tmp_path / "run"
    lines = _logged([sys.executable, str(SCRIPT), "--data-dir", str(data_dir), "--out",
                     str(out), "--cache-dir", str(tmp_path / "cache"), "--preset", "tiny",
                     "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8",
                     "--max-steps", "4", "--log-every", "1", "--eval-every", "2",
                     "--save-every", "2", "--eval-batches", "2", "--precision", "fp32",
                     *extra], tmp_path / "run.log")
    rows = read_rows(out / "metrics.jsonl")
    assert [row["step"] for row in rows if "loss" in row] == [1, 2, 3, 4]
    _step_lines(lines, rows)
    # notices: a line each, never glued to something else
    saved = [line for line in lines if "saved checkpoint" in line]
    assert len(saved) == 2 and all(line.startswith("saved checkpoint ") for line in saved)
    final = [line for line in lines if "perplexity" in line and "train_seconds" not in line]
    assert len(final) == 1 and final[0].startswith("eval loss "), lines
    # each split said once: its documents, characters and tokens on one line
    for split in ("train", "valid"):
        said = [line for line in lines if f"split {split}" in line]
        assert len(said) == 1, said
        assert "documents" in said[0] and "characters" in said[0] and "tokens" in said[0]
    _said_once(lines)


LIBRARY_RUN = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import minibert
from engine_utils import collator, tiny_corpus, tiny_model, train_config
tmp = Path(sys.argv[2])
tok, data = tiny_corpus(tmp)
minibert.train(tiny_model(tok), data, collator(tok),
               train_config(max_steps=3, save_every=2, progress=sys.argv[3] == "on"),
               tmp / "run")
"""


@pytest.mark.parametrize("progress", ["on", "off"])
def test_a_library_run_logs_its_steps_without_a_terminal_bar_or_not(tmp_path, progress):
    """`train` where nobody set logging up, its output in a file: progress on or off, each
    step is a line (no bar without a terminal; progress=False drops the bar alone)."""
    lines = _logged([sys.executable, "-c", LIBRARY_RUN, str(ROOT / "tests"), str(tmp_path),
                     progress], tmp_path / "run.log")
    _step_lines(lines, read_rows(tmp_path / "run" / "metrics.jsonl"))
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1", "2", "3"]
    _said_once(lines)


# A script's start, in a process of its own (console.py needs only the standard library, so
# it loads by its path, without torch): its console set up, logging to stdout as the
# scripts' is, then lines logged and printed, and a path given on the command line said on
# stderr, as a one-line error says it.
CONSOLE = """
import importlib.util, logging, sys
spec = importlib.util.spec_from_file_location("console", sys.argv[1])
console = importlib.util.module_from_spec(spec)
spec.loader.exec_module(console)
console.set_up()
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
for i in range(20):
    logging.getLogger("minibert").info("step %d | loss 5.0", i)
    print("a print", i)
print("error:", sys.argv[2], "does not exist", file=sys.stderr)
"""


def _console(stdout, path: str = "x", **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CONSOLE,
                           str(ROOT / "minibert" / "cli" / "console.py"), path],
                          stdout=stdout, stderr=subprocess.PIPE, timeout=60,
                          env={**os.environ, **env})


@pytest.mark.parametrize("into", ["a closed pipe", "a full disk"])
def test_a_stdout_that_cannot_be_written_goes_quiet_after_one_line(into):
    """`| head -1`, `> /dev/full`: every log line was a "Logging error" traceback on stderr."""
    if into == "a closed pipe":
        read, stdout = os.pipe()
        os.close(read)  # the reader has left
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full here")
        stdout = os.open("/dev/full", os.O_WRONLY)
    try:
        done = _console(stdout)
    finally:
        os.close(stdout)
    err = done.stderr.decode().splitlines()
    assert done.returncode == 0, err
    assert len(err) == 2 and "stdout cannot be written" in err[0], err  # and the error line
    assert ("EPIPE" if into == "a closed pipe" else "ENOSPC") in err[0]
    assert err[1] == "error: x does not exist"


def test_a_path_is_said_on_stderr_as_it_was_typed_under_any_locale(tmp_path):
    """Under LC_ALL=C and PYTHONUTF8=0 Python holds the bytes of é as surrogate escapes,
    which stderr wrote as `\\udcc3\\udca9`."""
    from minibert.cli.console import AS_TYPED
    # an escape is its byte again; any other character the encoding lacks, a backslash escape
    assert "é→\udcc3\udca9!".encode("ascii", AS_TYPED) == b"\\xe9\\u2192\xc3\xa9!"
    typed = str(tmp_path / "é")
    done = _console(subprocess.DEVNULL, typed, LC_ALL="C", PYTHONUTF8="0")
    assert done.returncode == 0, done.stderr
    assert done.stderr == b"error: " + os.fsencode(typed) + b" does not exist\n"



def test_a_script_into_a_closed_pipe_under_the_c_locale_says_two_lines(data_dir, tmp_path):
    """The scripts set their console up: a pretraining whose reader left before its first
    line (`| head -1`), refused for a --resume of a folder that does not exist, says that
    stdout is closed, then the refusal, naming --out as it was typed, and nothing else."""
    out = tmp_path / "é" / "run"
    read, stdout = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--data-dir", str(data_dir), "--out", str(out),
             "--cache-dir", str(tmp_path / "cache"), "--preset", "tiny", "--vocab-size", "100",
             "--max-steps", "1", "--no-progress", "--resume"], stdout=stdout,
            stderr=subprocess.PIPE, timeout=300, env={**os.environ, "LC_ALL": "C",
                                                      "PYTHONUTF8": "0"})
    finally:
        os.close(stdout)
    err = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr  # bad input, as with stdout open
    assert len(err) == 2 and b"stdout cannot be written" in err[0], done.stderr
    assert err[1].startswith(b"error: --resume") and os.fsencode(str(out)) in err[1], err
