"""minibert.paths.check_readable: each way a path can fail to be read, said as what it is."""

import os

import pytest

from facts import raises
from minibert.paths import check_readable


def test_a_path_that_can_be_read_is_passed(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f.txt")
    for p in (tmp_path, tmp_path / "f.txt", tmp_path / "link", str(tmp_path / "link")):
        assert check_readable(p, "--x").st_size >= 0


def test_each_failure_is_named_with_the_flag_and_the_path_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("self", "self")
    os.symlink("b", "a")
    os.symlink("a", "b")
    os.symlink("moved/away.tsv", "old.tsv")
    os.symlink("old.tsv", "older.tsv")  # a link to a link to nothing: the whole chain
    os.mkdir("d")
    os.symlink("../gone", "d/sub")
    (tmp_path / "file.tsv").write_text("x")
    cases = [
        ("self", OSError, ["--train self", "loop of symbolic links", "self -> self"]),
        ("a", OSError, ["--train a", "loop of symbolic links", "a -> b -> a"]),
        ("a/x.tsv", OSError, ["--train a/x.tsv", "a on the way", "loop"]),
        ("old.tsv", FileNotFoundError, ["--train old.tsv", "symbolic link to nothing",
                                        "moved/away.tsv", "does not exist"]),
        ("older.tsv", FileNotFoundError, ["older.tsv -> old.tsv -> moved/away.tsv"]),
        ("d/sub/x.tsv", FileNotFoundError, ["--train d/sub/x.tsv", "d/sub on the way",
                                            "../gone", "does not exist"]),
        ("file.tsv/x", NotADirectoryError, ["--train file.tsv/x", "file.tsv is a file"]),
        ("nowhere/x.tsv", FileNotFoundError, ["--train nowhere/x.tsv not found",
                                              "there is no nowhere", str(tmp_path)]),
    ]
    for path, kind, facts in cases:
        with raises(kind, *facts) as e:
            check_readable(path, "--train")
        if "loop" in facts[-1] or "does not exist" in facts[-1]:  # it is there, but broken
            assert "not found" not in str(e.value), e.value
    with raises(OSError, "self is a loop") as e:  # without a flag: the path alone
        check_readable("self")
    assert not str(e.value).startswith("None")


@pytest.mark.parametrize("folder", [False, True])
def test_a_permission_refused_is_said_as_one(tmp_path, monkeypatch, folder):
    """What os.access answers for a user without the right (root has every right)."""
    path = tmp_path / "d" if folder else tmp_path / "f.tsv"
    path.mkdir() if folder else path.write_text("x")
    asked = []
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: not asked.append(mode) and False
                        if os.fspath(p) == str(path) else real(p, mode, *a, **k))
    with raises(PermissionError, f"--x {path}", "permission denied",
                "list or enter this folder" if folder else "read this file"):
        check_readable(path, "--x")
    assert asked == [os.R_OK | os.X_OK if folder else os.R_OK]


def test_a_folder_on_the_way_that_may_not_be_entered(tmp_path, monkeypatch):
    real = os.stat
    locked = tmp_path / "locked"
    locked.mkdir()

    def stat(p, *a, **k):
        if os.fspath(p).startswith(str(locked) + os.sep):
            raise PermissionError(13, "Permission denied", os.fspath(p))
        return real(p, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    with raises(PermissionError, f"--x {locked / 'f.tsv'}", "permission denied",
                f"enter the folder {locked}"):
        check_readable(locked / "f.tsv", "--x")
