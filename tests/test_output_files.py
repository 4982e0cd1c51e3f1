"""What the scripts write is the user's: a write that fails names the flag and the path the
user gave and what stopped it, never a temporary name; a killed writer's temporary files go
with the next writer, a live writer's stay; and files and folders get the modes the user's
umask gives any file of theirs."""

import errno
import os
from pathlib import Path

import pytest

from engine_utils import load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries
from script_inputs import SCRIPTS, make_inputs_with_teacher, script_argv
from unwritable import ROOT, inside, refuse

TRAINING = [s for s in SCRIPTS if s != "embed"]
ROOT_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def _beside(out, name):
    """`out/name`, what is under it, and the temporary names it is written under."""
    target = out / name
    return lambda p: p == target or target in p.parents or (
        p.parent == out and p.name.startswith(f".{name}."))


# Each output of a run folder `out`, as the paths whose creation fails when it cannot be written.
OUTPUTS = {
    "--out itself": lambda out: lambda p: p == out,
    "tokenizer/": lambda out: _beside(out, "tokenizer"),
    "metrics.jsonl": lambda out: _beside(out, "metrics.jsonl"),
    "checkpoints/": lambda out: _beside(out, "checkpoints"),
    "final/": lambda out: _beside(out, "final"),
    "eval.json": lambda out: _beside(out, "eval.json"),
    "baseline/": lambda out: _beside(out, "baseline"),
    "loss.png": lambda out: _beside(out, "loss.png"),
}
WRITES = {s: ["--out itself", "tokenizer/", "metrics.jsonl", "checkpoints/", "final/",
              "eval.json"] for s in TRAINING}
WRITES["distill"].append("baseline/")
WRITES["pretrain_wikitext"].append("loss.png")
# The cache each script writes: WikiText's token files, or a tokenizer trained from scratch.
CACHED = {s: "tokenizers" for s in TRAINING} | {"pretrain_wikitext": "tokens",
                                                "distill": "tokens"}


def _error_line(capsys, script, argv):
    got = load_example(script).main(argv)
    err = capsys.readouterr().err.strip()
    assert got != 0 and err.startswith("error: ") and "\n" not in err, (got, err)
    return err


def _no_temporary_name(err):
    assert ".tmp" not in err, err


@pytest.mark.parametrize("code, said", [(errno.EROFS, "read-only file system"),
                                        (errno.EACCES, "permission denied")])
@pytest.mark.parametrize("script, output", [(s, o) for s in TRAINING for o in WRITES[s]])
def test_every_output_that_cannot_be_written_names_out_and_the_problem(
        script, output, code, said, inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    refuse(monkeypatch, OUTPUTS[output](out), code)
    err = _error_line(capsys, script, script_argv(script, inputs, out))
    assert_carries(err, f"--out {out}", said)
    _no_temporary_name(err)


@pytest.mark.parametrize("script", TRAINING)
def test_a_cache_that_cannot_be_written_names_cache_dir(script, inputs, tmp_path, monkeypatch,
                                                        capsys):
    cache = tmp_path / "cache"
    argv = script_argv(script, inputs, tmp_path / "run")
    argv[argv.index("--cache-dir") + 1] = str(cache)
    refuse(monkeypatch, inside(cache / CACHED[script]), errno.EROFS)
    err = _error_line(capsys, script, argv)
    assert_carries(err, f"--cache-dir {cache}", "read-only file system")
    _no_temporary_name(err)


@pytest.mark.parametrize("code, said", [(errno.EROFS, "read-only file system"),
                                        (errno.EACCES, "permission denied")])
def test_embed_out_that_cannot_be_written_names_out_and_the_problem(code, said, inputs,
                                                                    tmp_path, monkeypatch,
                                                                    capsys):
    folder = tmp_path / "vectors"
    folder.mkdir()
    refuse(monkeypatch, lambda p: p.parent == folder, code)
    err = _error_line(capsys, "embed", script_argv("embed", inputs, folder))
    assert_carries(err, f"--out {folder / 'v.npy'}", said, str(folder))
    _no_temporary_name(err)
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(os.name != "posix" or ROOT, reason="root writes into a read-only folder")
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_without_write_permission_is_named_with_its_flag(script, inputs, tmp_path,
                                                                  capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        err = _error_line(capsys, script, script_argv(script, inputs, folder / "run"))
    finally:
        folder.chmod(0o755)
    assert_carries(err, "--out", str(folder / "run"), "permission denied", str(folder))
    _no_temporary_name(err)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_symlink_loop_in_out_is_named_with_its_flag(script, inputs, tmp_path, capsys):
    """A real error, root or not."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    err = _error_line(capsys, script, script_argv(script, inputs, loop / "run"))
    assert_carries(err, "--out", str(loop / "run"), "symbolic link loop", str(loop))
    _no_temporary_name(err)


# ---- no temporary file outlives its writer -------------------------------------------------

def _temporaries(*roots):
    return sorted(str(p) for root in roots for p in Path(root).rglob("*") if ".tmp" in p.name)


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_writers_killed_in_the_cache_and_in_out_leave_nothing_after_the_next_run(inputs,
                                                                               tmp_path):
    """A start killed while tokenizing left its temporary token file in the cache, still
    there after the next run had finished; so did writers of --out killed mid-write. A live
    writer's temporary file is another matter: it stays."""
    from test_atomic import hold_writer

    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = script_argv("pretrain_wikitext", inputs, out)
    argv[argv.index("--cache-dir") + 1] = str(cache)
    live = hold_writer("atomic_file", cache / "tokens" / "fedcba9876543210-0123.tok")
    try:
        killed = hold_writer("atomic_file", cache / "tokens" / "0123456789abcdef-0123.tok")
        killed.kill()
        killed.wait()
        assert len(_temporaries(cache)) == 2
        assert load_example("pretrain_wikitext").main(argv) == 0
        assert [Path(p).name.split(".")[1] for p in _temporaries(cache)] == [
            "fedcba9876543210-0123"]
    finally:
        live.kill()
        live.wait()
    killed = [hold_writer("write_files_atomically", out / "eval.json"),
              hold_writer("write_files_atomically", out / "tokenizer" / "train.key"),
              hold_writer("replace_folder", out / "final"),
              hold_writer("save_checkpoint", out / "checkpoints" / "step_00000002")]
    for child in killed:
        child.kill()
        child.wait()
    assert len(_temporaries(out)) == len(killed)
    argv[argv.index("--max-steps") + 1] = "2"
    assert load_example("pretrain_wikitext").main([*argv, "--resume"]) == 0
    assert _temporaries(out) == []


# ---- what is written has the modes the user's umask gives ------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002], ids=lambda m: f"umask {m:03o}")
def test_every_file_and_folder_of_a_run_has_the_modes_of_the_umask(umask, inputs, tmp_path):
    """final/, checkpoints, the cache's entries and the exports were drwx------, readable by
    their owner alone, and model.safetensors -rw-------, whatever the umask said."""
    import minibert
    from minibert.interop.export import export_checkpoint
    from test_atomic import assert_modes

    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = script_argv("pretrain_wikitext", inputs, out)
    argv[argv.index("--cache-dir") + 1] = str(cache)
    old = os.umask(umask)
    try:
        assert load_example("pretrain_wikitext").main(argv) == 0
        export_checkpoint(out / "checkpoints" / "step_00000001", tmp_path / "export")
        model = minibert.BertForMaskedLM.from_pretrained(out / "final")
        tok = minibert.Tokenizer.from_pretrained(out / "final")
        model.save_pretrained(tmp_path / "saved", tokenizer=tok)
        assert load_example("embed").main(script_argv("embed", inputs, tmp_path / "vectors")) == 0
        for script in TRAINING:
            if script != "pretrain_wikitext":
                assert load_example(script).main(script_argv(
                    script, inputs, tmp_path / script, "--cache-dir", str(cache))) == 0
    finally:
        os.umask(old)
    assert_modes(umask, *[p for p in tmp_path.iterdir()])
