"""Files and folders written whole or not at all, and failures that say what happened."""

import errno

import pytest

from facts import raises
from minibert.atomic import replace_folder, write_files_atomically



def test_a_full_disk_while_replacing_a_folder_keeps_the_old_one(tmp_path):
    target = tmp_path / "final"
    write_files_atomically(target, {"a.txt": "old a\n", "notes.txt": "mine\n"})

    def write_then_run_out_of_space(folder):
        (folder / "a.txt").write_text("new a, half")
        raise OSError(errno.ENOSPC, "No space left on device")

    # the folder, the free space, and that the old one is kept
    with raises(OSError, str(target), "MB are free", "intact"):

        replace_folder(target, write_then_run_out_of_space, owns=lambda name: name == "a.txt")
    assert (target / "a.txt").read_text() == "old a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temporaries left


def test_a_safetensors_write_error_is_reported_as_an_os_error(tmp_path):
    class SafetensorError(Exception):  # what safetensors raises, os error 28 inside
        pass

    def write(folder):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")

    with pytest.raises(OSError, match="code: 28"):
        replace_folder(tmp_path / "final", write)
    assert not (tmp_path / "final").exists()


def test_a_file_size_limit_while_replacing_a_folder_is_named(tmp_path):
    """safetensors says "os error 27"; the message used to call it a full disk."""
    class SafetensorError(Exception):
        pass

    def write(folder):
        raise SafetensorError("Error while serializing: I/O error: File too large (os error 27)")

    with pytest.raises(OSError) as e:
        replace_folder(tmp_path / "final", write)
    assert "EFBIG" in str(e.value) and "file-size limit" in str(e.value)
    assert "MB are free" not in str(e.value)
    # and an error that is no matter of space is not said to be one
    with pytest.raises(OSError) as e:
        replace_folder(tmp_path / "final", lambda f: (_ for _ in ()).throw(
            PermissionError(errno.EACCES, "Permission denied")))
    assert "EACCES" in str(e.value) and "MB are free" not in str(e.value)


def test_replace_folder_keeps_what_the_writer_does_not_own(tmp_path):
    target = tmp_path / "final"
    write_files_atomically(target, {"weights": "1", "tokenizer.json": "{}"})
    replace_folder(target, lambda f: (f / "weights").write_text("2"),
                   owns=lambda name: name == "weights")
    assert (target / "weights").read_text() == "2"
    assert (target / "tokenizer.json").read_text() == "{}"


def test_only_atomic_py_publishes_by_renaming():
    """Every file or folder written whole goes through atomic.py: no other module of the
    package renames something into place or makes its own temporary file. (WikiText's
    extraction moves the zip's entries inside the fresh folder replace_folder gives it.)"""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "minibert"
    pattern = re.compile(r"os\.replace\(|os\.rename\(|\.rename\(|mkstemp|mkdtemp|NamedTemporary")
    found = {f"{path.relative_to(package)}:{number}": line.strip()
             for path in sorted(package.rglob("*.py")) if path.name != "atomic.py"
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if pattern.search(line)}
    assert list(found.values()) == ["os.replace(entry, new / entry.name)"], found


def test_publish_file_and_publish_folder(tmp_path):
    from minibert.atomic import publish_file, publish_folder

    part = tmp_path / "data.zip.part"
    part.write_bytes(b"whole")
    publish_file(part, tmp_path / "data.zip")
    assert (tmp_path / "data.zip").read_bytes() == b"whole" and not part.exists()
    assert publish_folder(tmp_path / "entry", lambda d: (d / "f").write_text("first"))
    assert not publish_folder(tmp_path / "entry", lambda d: (d / "f").write_text("second"))
    assert (tmp_path / "entry" / "f").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zip", "entry"]
