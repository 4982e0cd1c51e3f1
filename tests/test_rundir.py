"""RunLock keeps two runs out of one directory; run_exists says whether a run lives there."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import minibert.training.rundir
from facts import assert_carries, raises
from minibert.training.rundir import RunLock, RunLockedError, run_exists

RUNDIR_PY = Path(minibert.training.rundir.__file__)

# A child process that takes the lock, says so, and holds it until its stdin closes. It loads
# rundir.py by path: the module needs only the standard library, and importing the minibert
# package (and torch) would make each child take seconds to start.
HOLDER = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("rundir", sys.argv[1])
    rundir = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rundir)
    with rundir.RunLock(sys.argv[2]):
        print("locked", flush=True)
        sys.stdin.read()
""")


def _holder(out_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(RUNDIR_PY), str(out_dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_creates_the_directory_records_the_holder_and_releases_on_exit(tmp_path):
    out = tmp_path / "runs" / "x"
    with RunLock(out) as lock:
        holder = json.loads((out / ".lock").read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert holder["started"] and lock.previous is None
    with RunLock(out) as again:  # released: the next run takes it at once
        assert again.previous is None  # a clean release leaves nothing that looks stale


def test_second_lock_in_the_same_process_is_refused(tmp_path):
    """flock belongs to an open file description, so a second open + flock in one process
    conflicts too (a script that starts two runs in one process is caught as well)."""
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError) as e:
            RunLock(tmp_path).acquire()
        assert_carries(str(e.value), str(os.getpid()), socket.gethostname())  # the holder
    with RunLock(tmp_path):
        pass


@pytest.mark.parametrize("resume", [False, True])
def test_a_live_runs_folder_is_refused_by_its_lock_before_what_it_holds(tmp_path, resume):
    """A second start into the folder of a run still training, which had logged a row and
    saved no checkpoint yet, was told to delete that run's metrics.jsonl to start again."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.0}\n')
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunLockedError) as e:
            minibert.training.rundir.open_run(tmp_path, resume).check()
        assert_carries(str(e.value), str(proc.pid), "--out")
        assert "delete" not in str(e.value)
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    with pytest.raises(FileExistsError if not resume else FileNotFoundError) as gone:
        minibert.training.rundir.open_run(tmp_path, resume).check()  # its holder is gone
    assert "delete metrics.jsonl" in str(gone.value)


def test_lock_held_by_another_process_is_refused_with_its_pid(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(OSError) as e:  # what the scripts catch, to print one line
            with RunLock(tmp_path):
                pytest.fail("two runs got the same directory")
        assert isinstance(e.value, RunLockedError)
        # who holds the folder (process, host, since when), the folder, and the flag to change
        assert_carries(str(e.value), str(proc.pid), socket.gethostname(),
                       e.value.holder["started"], str(tmp_path), "--out")
        assert e.value.holder["pid"] == proc.pid
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    with RunLock(tmp_path) as lock:  # the holder finished: free again
        assert lock.previous is None


def test_a_lock_file_deleted_by_hand_still_keeps_a_second_run_out(tmp_path):
    """The lock is the folder's, not only its file's: a second start (a --resume) into a
    live run's folder whose .lock was deleted would lock a new file, and two runs would
    then write one log."""
    proc = _holder(tmp_path)
    try:
        (tmp_path / ".lock").unlink()
        for start in (lambda: RunLock(tmp_path).acquire(),
                      lambda: minibert.training.rundir.open_run(tmp_path, True).check()):
            with raises(RunLockedError, str(tmp_path), ".lock", "deleted", "--out"):
                start()
        assert not (tmp_path / ".lock").exists()  # a refused start writes nothing
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    with RunLock(tmp_path) as lock:  # its holder finished: the folder is free
        assert lock.previous is None


def test_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
    proc = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up; the kernel drops the flock
    proc.wait(timeout=30)
    proc.stdin.close()
    with caplog.at_level(logging.INFO, logger="minibert.training.rundir"):
        with RunLock(tmp_path) as lock:
            assert lock.previous["pid"] == proc.pid
            assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert f"process {proc.pid}" in caplog.text and "gone" in caplog.text


def test_without_fcntl_the_lock_does_nothing_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(minibert.training.rundir, "fcntl", None)
    with caplog.at_level(logging.WARNING, logger="minibert.training.rundir"):
        with RunLock(tmp_path), RunLock(tmp_path):  # not exclusive, but the run goes on
            pass
    assert "cannot lock" in caplog.text


def test_run_exists_lists_what_a_run_leaves(tmp_path):
    assert run_exists(tmp_path / "missing") == []
    assert run_exists(tmp_path) == []
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "final").mkdir()
    with RunLock(tmp_path):
        pass
    assert run_exists(tmp_path) == []  # empty folders and a released lock are no run
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "checkpoints" / "step_00000010").mkdir()
    assert run_exists(tmp_path) == ["metrics.jsonl", "checkpoints/"]
    (tmp_path / "final" / "config.json").write_text("{}")
    (tmp_path / "eval.json").write_text("{}")
    assert run_exists(tmp_path) == ["final/", "eval.json", "metrics.jsonl", "checkpoints/"]


def test_a_run_without_a_checkpoint_is_named_as_such_both_ways(tmp_path):
    """A run stopped before its first checkpoint: a fresh start was told to pass --resume,
    and --resume that there was no checkpoint, with no way out named."""
    from minibert.training.rundir import open_run

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0, "lr": 0.001}\n')
    (tmp_path / "checkpoints" / ".tmp-step_00000001").mkdir(parents=True)  # a save killed
    for resume in (False, True):
        # the folder, that no checkpoint was saved, and what to delete to start again
        with raises(OSError, str(tmp_path), "no checkpoint", "delete",
                    "metrics.jsonl, checkpoints/"):
            with open_run(tmp_path, resume=resume):
                pass
    (tmp_path / "checkpoints" / ".tmp-step_00000001").rmdir()
    # Checkpoints that are there but damaged: never advise deleting them.
    (tmp_path / "checkpoints" / "step_00000001").mkdir(parents=True)
    for resume in (False, True):
        with pytest.raises(OSError) as e:
            with open_run(tmp_path, resume=resume):
                pass
        assert "delete" not in str(e.value)
    (tmp_path / "checkpoints" / "step_00000001").rmdir()
    (tmp_path / "metrics.jsonl").unlink()
    with raises(FileNotFoundError, "--resume", str(tmp_path / "checkpoints")) as e:
        with open_run(tmp_path, resume=True):  # nothing there at all: no advice needed
            pass
    assert str(e.value).endswith(str(tmp_path / "checkpoints"))


def test_a_refused_resume_of_a_folder_that_does_not_exist_makes_none(tmp_path):
    """The lock was taken first and made the folder, so a refused --resume left --out
    behind, which a pipeline checking for it would take for a run."""
    from minibert.training.rundir import open_run

    with raises(FileNotFoundError, "--resume", str(tmp_path / "out"), "--out"):

        with open_run(tmp_path / "out", resume=True):
            pass
    assert not (tmp_path / "out").exists()


def test_a_start_that_ends_before_training_leaves_the_folder_as_it_found_it(tmp_path):
    """Refused, failed or stopped (Ctrl-C) before its run trained, a start takes back what
    it made: an --out it made (parents included) and its lock file go; in a folder it did
    not make, only what it added, and it names a file it wrote over."""
    from minibert.training.rundir import open_run

    out = tmp_path / "runs" / "new"
    with pytest.raises(KeyboardInterrupt):
        with open_run(out, resume=False) as folder:
            (out / "labels.json").write_text("{}")
            (out / "tokenizer").mkdir()
            (out / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
            raise KeyboardInterrupt
    assert not (tmp_path / "runs").exists()
    assert folder.made and folder.trained is False and folder.left == []

    out.mkdir(parents=True)
    (out / "notes.txt").write_text("the user's")
    (out / "labels.json").write_text("left by an earlier start")
    with pytest.raises(ValueError):
        with open_run(out, resume=False) as folder:
            (out / "labels.json").write_text("this start's")
            (out / "tokenizer").mkdir()
            raise ValueError("refused after writing")
    assert sorted(p.name for p in out.iterdir()) == ["labels.json", "notes.txt"]
    assert folder.left == ["labels.json"] and not folder.made

    # A run that trained keeps all it wrote, for --resume.
    with pytest.raises(KeyboardInterrupt):
        with open_run(out, resume=False) as folder:
            (out / "checkpoints" / "step_00000001").mkdir(parents=True)
            (out / "checkpoints" / "step_00000001" / "state.pt").write_bytes(b"weights")
            (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
            raise KeyboardInterrupt
    assert folder.trained and (out / ".lock").is_file()
    assert (out / "checkpoints" / "step_00000001" / "state.pt").read_bytes() == b"weights"


def test_a_start_that_could_not_write_keeps_only_a_run_that_can_resume(tmp_path):
    """A write that a full disk stopped: the log rows and the files of a start with no
    intact checkpoint are taken back (no resume could go on from them, and a fresh start
    would be refused with them there); with one, everything stays, for --resume."""
    import errno

    import torch

    from minibert.training.checkpoint import save_checkpoint
    from minibert.atomic import writing
    from minibert.training.rundir import open_run

    out = tmp_path / "out"
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError):
        with open_run(out, resume=False) as folder:
            (out / "labels.json").write_text("{}")
            (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
            (out / "checkpoints").mkdir()
            raise full  # an errno says it: no `writing` needed
    assert not out.exists() and not folder.kept and folder.resume_from is None
    assert folder.trained and folder.made

    with pytest.raises(OSError):
        with open_run(out, resume=False) as folder:
            save_checkpoint(out / "checkpoints", 1, {"w": torch.ones(2)})
            (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
            with writing(out / "final"):
                raise OSError("could not write it")  # no errno: `writing` says it
    assert folder.kept and folder.resume_from == out / "checkpoints" / "step_00000001"
    assert sorted(p.name for p in out.iterdir()) == [".lock", "checkpoints", "metrics.jsonl"]


def test_a_lock_file_removed_by_its_holder_is_not_held(tmp_path, monkeypatch):
    """A start that leaves no trace removes the lock file while it holds it; a start that
    opened that file just before locks a file nobody else will find, so it takes the lock
    again on the file the path names."""
    first = RunLock(tmp_path).acquire()
    stale = os.open(tmp_path / ".lock", os.O_RDWR)  # opened before the removal
    first.release(remove=True)
    assert not (tmp_path / ".lock").exists()
    original_open = os.open
    calls = []

    def open_stale_first(path, *args, **kwargs):  # the race, made certain
        if Path(path).name != ".lock":  # the folder, which it locks too
            return original_open(path, *args, **kwargs)
        calls.append(path)
        return stale if len(calls) == 1 else original_open(path, *args, **kwargs)

    monkeypatch.setattr(minibert.training.rundir.os, "open", open_stale_first)
    with RunLock(tmp_path):
        assert len(calls) == 2 and (tmp_path / ".lock").is_file()
        with pytest.raises(RunLockedError):  # the lock is on the file others find
            RunLock(tmp_path).acquire()
