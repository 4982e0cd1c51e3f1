"""Files and folders written whole or not at all, and failures that say what happened."""

import errno
import os

import pytest

from facts import assert_carries, raises, without
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


def test_a_disk_out_of_inodes_is_named_as_such_not_as_full(tmp_path, monkeypatch):
    """ENOSPC with megabytes free: the disk has no inode left for a new file, and freeing
    "some space" in big files would not help; deleting files would."""
    real = os.statvfs

    def no_inodes(path):
        st = real(path)  # every field as the disk says, but the inodes: none left
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree,
                                  max(st.f_bavail, 2**20), 1000, 0, 0, st.f_flag,
                                  st.f_namemax))

    monkeypatch.setattr(os, "statvfs", no_inodes)

    def write(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    with raises(OSError, str(tmp_path / "final"), "MB are free") as e:
        replace_folder(tmp_path / "final", write)
    said = without(str(e.value), tmp_path)  # the test's folder is named for inodes too
    assert_carries(said, "inode", "delete files")
    assert "free some space" not in said


def test_a_safetensors_write_error_is_reported_as_an_os_error(tmp_path):
    SafetensorError = pytest.importorskip("safetensors").SafetensorError  # os error 28 inside

    def write(folder):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")

    with pytest.raises(OSError, match="code: 28"):
        replace_folder(tmp_path / "final", write)
    assert not (tmp_path / "final").exists()


def test_a_file_size_limit_while_replacing_a_folder_is_named(tmp_path):
    """safetensors says "os error 27"; the message used to call it a full disk."""
    SafetensorError = pytest.importorskip("safetensors").SafetensorError

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


# ---- a refused write names the user's path, never a temporary one ----------------------------

def _stream(target):
    from minibert.atomic import atomic_file

    with atomic_file(target) as f:
        f.write(b"x")


def _publish_folder(target):
    from minibert.atomic import publish_folder

    publish_folder(target, lambda folder: (folder / "a").write_text("x"))


WRITERS = {
    "atomic_file": _stream,
    "write_files_atomically": lambda t: write_files_atomically(t.parent, {t.name: "x"}),
    "replace_folder": lambda t: replace_folder(t, lambda f: (f / "a").write_text("x")),
    "publish_folder": _publish_folder,
}


def _no_temporary_name(message, target):
    assert ".tmp" not in message and f".{target.name}." not in message, message


@pytest.mark.parametrize("code, said", [(errno.EROFS, "read-only file system"),
                                        (errno.EACCES, "permission denied")])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_refused_write_names_its_target_and_the_folder_at_fault(writer, code, said, tmp_path,
                                                                  monkeypatch):
    """The error named the temporary file beside the target, a name the user never gave."""
    from unwritable import refuse

    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "v.npy"
    refuse(monkeypatch, lambda p: p.parent == folder, code)
    with raises(OSError, str(target), said, str(folder)) as info:
        WRITERS[writer](target)
    assert info.value.errno == code
    _no_temporary_name(str(info.value), target)
    # the folders a target needs, when they cannot be made: the same facts
    deeper = folder / "a" / "b" / "v.npy"
    with raises(OSError, str(deeper), said, str(folder)) as info:
        WRITERS[writer](deeper)
    _no_temporary_name(str(info.value), deeper)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into a folder without write permission")
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_folder_without_write_permission_is_named(writer, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with raises(OSError, str(folder / "v.npy"), "permission denied", str(folder)) as info:
            WRITERS[writer](folder / "v.npy")
        _no_temporary_name(str(info.value), folder / "v.npy")
    finally:
        folder.chmod(0o755)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_symlink_loop_and_a_dangling_link_on_the_way_are_named(writer, tmp_path):
    """Real errors even for root: the link at fault is named, not a temporary file."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    gone = tmp_path / "gone"
    gone.symlink_to(tmp_path / "nowhere")
    with raises(OSError, str(loop / "v.npy"), "symbolic link loop", str(loop)) as info:
        WRITERS[writer](loop / "v.npy")
    _no_temporary_name(str(info.value), loop / "v.npy")
    with raises(OSError, str(gone / "v.npy"), str(gone), str(tmp_path / "nowhere"),
                "does not exist") as info:
        WRITERS[writer](gone / "v.npy")
    _no_temporary_name(str(info.value), gone / "v.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone", "loop"]


def test_a_file_on_the_way_is_named(tmp_path):
    (tmp_path / "notes").write_text("mine")
    with raises(OSError, str(tmp_path / "notes"), "not a folder"):
        _stream(tmp_path / "notes" / "sub" / "v.npy")
    assert (tmp_path / "notes").read_text() == "mine"


# ---- no temporary file outlives its writer -------------------------------------------------

def _save_checkpoint(target):
    import torch

    from minibert.training.checkpoint import save_checkpoint

    save_checkpoint(target.parent, int(target.name.rsplit("_", 1)[1]), {"w": torch.ones(2)})


KILLABLE = {**WRITERS, "save_checkpoint": _save_checkpoint}

# A writer that stops once its temporary file or folder holds the content, before it is
# published (its first fsync), until it is killed.
HOLD = """if True:
    import os, sys, time
    from pathlib import Path

    def hold(fd):
        print("writing", flush=True)
        time.sleep(300)

    os.fsync = hold
    sys.path.insert(0, sys.argv[1])
    from test_atomic import KILLABLE

    KILLABLE[sys.argv[2]](Path(sys.argv[3]))
"""


def hold_writer(kind, target):
    """A process writing `target` with `kind`, stopped before publishing it: kill it to see
    what a writer killed mid-write leaves."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(root / "tests"), kind,
                              str(target)], stdout=subprocess.PIPE, env=env)
    if child.stdout.readline().strip() != b"writing":
        child.kill()
        raise AssertionError(f"the {kind} writer of {target} did not start writing")
    return child


def _hidden(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
@pytest.mark.parametrize("kind", sorted(KILLABLE))
def test_a_killed_writers_temporary_goes_with_the_next_writer_a_live_ones_stays(kind, tmp_path):
    folder = tmp_path / "out"
    live, killed = hold_writer(kind, folder / "step_00000001"), None
    try:
        killed = hold_writer(kind, folder / "step_00000002")
        temps = _hidden(folder)
        assert len(temps) == 2, temps
        killed.kill()
        killed.wait()
        KILLABLE[kind](folder / "step_00000003")  # the next writer
        assert _hidden(folder) == [t for t in temps if t.startswith(".step_00000001.")]
    finally:
        live.kill()
        live.wait()
        if killed is not None and killed.poll() is None:
            killed.kill()
    KILLABLE[kind](folder / "step_00000003")
    assert _hidden(folder) == []
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000003"]


# ---- what is written has the modes the user's umask gives ------------------------------------

@pytest.fixture(params=[0o022, 0o027, 0o002], ids=lambda m: f"umask {m:03o}")
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def assert_modes(umask, *roots):
    """Every folder under `roots` (and each root) is 0o777 less the umask, every file 0o666."""
    import stat
    from pathlib import Path

    wrong = []
    for root in map(Path, roots):
        for p in [root, *root.rglob("*")]:
            st = p.lstat()
            want = (0o777 if stat.S_ISDIR(st.st_mode) else 0o666) & ~umask
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != want:
                wrong.append(f"{p}: {stat.S_IMODE(st.st_mode):o}, not {want:o}")
    assert not wrong, "\n".join(wrong)


def test_every_writer_gives_the_modes_of_the_umask(umask, tmp_path):
    for kind, writer in sorted(KILLABLE.items()):
        writer(tmp_path / kind / "step_00000001")
    replace_folder(tmp_path / "replace_folder" / "step_00000001",
                   lambda f: (f / "b").write_text("y"))  # a folder replaced
    assert_modes(umask, *tmp_path.iterdir())
