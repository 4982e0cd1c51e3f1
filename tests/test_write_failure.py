"""A run that cannot write (a full disk, a quota, a file-size limit) after it has started
says what it left in --out and the way on that works, and exits 3: --resume where an intact
checkpoint is there to continue from; otherwise the start takes back what it wrote, so that
the same command works once the write can go through.

Every writer a script's run uses is failed in turn, in process, by making it meet a full
disk (ENOSPC, raised as the writer's own layer raises it); a few are failed for real, in a
process of its own under a file-size limit (`setrlimit(RLIMIT_FSIZE)`: Python ignores
SIGXFSZ, so the write fails with EFBIG rather than killing the process)."""

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine_utils import load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries
from script_inputs import make_inputs_with_teacher, script_argv

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def _full(*_):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def full_disk_at(monkeypatch, target: str, out: Path) -> None:
    """Make the write of `target` into the run folder `out` meet a full disk, the way that
    writer meets one: a text file's temporary copy, a log row's append, torch.save's
    "unexpected pos" with the OSError behind it, safetensors' error naming os error 28, or
    matplotlib's file. `target`: labels.json, tokenizer, metrics.jsonl, checkpoint, final,
    eval.json, a predictions file, loss.png; baseline/metrics.jsonl and baseline/checkpoint,
    the distillation's run without the teacher."""
    import matplotlib.pyplot
    import safetensors.torch
    import torch

    import minibert.atomic
    import minibert.data.prepare
    import minibert.cli.finetune
    import minibert.cli.pretrain
    import minibert.training.runlog
    import minibert.data.tokenizer

    folder = out / target.rsplit("/", 1)[0] if "/" in target else out
    name = target.rsplit("/", 1)[-1]
    texts = minibert.atomic.write_files_atomically

    def write_texts(directory, contents):
        directory = Path(directory)
        hit = (name in contents and directory == folder or
               name == "tokenizer" and "tokenizer.json" in contents and
               directory == out / "tokenizer")
        if hit:
            _full()
        return texts(directory, contents)

    for module in (minibert.cli.finetune, minibert.cli.pretrain, minibert.data.tokenizer,
                   minibert.data.prepare):
        monkeypatch.setattr(module, "write_files_atomically", write_texts)

    class FullFile:  # opened, as on a full disk; its first write finds no space
        def __init__(self, f):
            self.f = f

        def write(self, data):
            _full()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def open_log(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        hit = name == "metrics.jsonl" and Path(path) == folder / name and "a" in mode
        return FullFile(f) if hit else f

    monkeypatch.setattr(minibert.training.runlog, "open", open_log, raising=False)
    save = torch.save

    def torch_save(obj, f, *args, **kwargs):
        if name == "checkpoint" and folder / "checkpoints" in Path(f.name).parents:
            f.write(b"partial")
            try:
                _full()
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected "
                                   "pos 64 vs 0")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", torch_save)
    save_file = safetensors.torch.save_file

    SafetensorError = safetensors.SafetensorError  # what it raises, os error 28 inside

    def weights(tensors, filename, *args, **kwargs):
        if name == "final" and folder in Path(filename).parents:
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                                  "StorageFull, message: \"No space left on device\" })")
        return save_file(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", weights)
    savefig = matplotlib.pyplot.savefig

    def figure(fname, *args, **kwargs):
        if name == "loss.png":
            _full()
        return savefig(fname, *args, **kwargs)

    monkeypatch.setattr(matplotlib.pyplot, "savefig", figure)


FINE = ["finetune_classification", "finetune_token_classification", "finetune_qa",
        "finetune_multitask"]
# (script, the writer that meets the full disk, what the message calls it, whether an intact
# checkpoint is there when it does). One step: the log's row, then the checkpoint of step 1,
# then the outputs.
CASES = [
    *[("finetune_classification", "labels.json", "labels.json", False)],
    *[("finetune_token_classification", "labels.json", "labels.json", False)],
    *[(s, "tokenizer", "tokenizer", False) for s in FINE + ["pretrain_wikitext", "distill"]],
    *[(s, "metrics.jsonl", "metrics.jsonl", False)
      for s in FINE + ["pretrain_wikitext", "distill"]],
    *[(s, "checkpoint", "step_00000001", False) for s in FINE + ["pretrain_wikitext", "distill"]],
    *[(s, "final", "final", True) for s in FINE + ["pretrain_wikitext", "distill"]],
    *[(s, "eval.json", "eval.json", True) for s in FINE + ["pretrain_wikitext", "distill"]],
    ("finetune_classification", "predictions.tsv", "predictions.tsv", True),
    ("finetune_token_classification", "predictions.conll", "predictions.conll", True),
    ("finetune_qa", "predictions.json", "predictions.json", True),
    ("pretrain_wikitext", "loss.png", "loss.png", True),
    ("distill", "baseline/metrics.jsonl", "metrics.jsonl", True),
    ("distill", "baseline/checkpoint", "step_00000001", True),
]


def _line(capsys):
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out ") and "\n" not in err, err
    assert ": cannot write " in err and ".tmp" not in err, err
    # One cause and one way on: a writer's own line ("save again; what final held before is
    # intact", where there was none) is not nested in the run's.
    assert err.count("cannot write") == 1 and "save again" not in err, err
    return err


@pytest.mark.parametrize("script,target,named,resumable", CASES,
                         ids=[f"{s}:{t}" for s, t, _, _ in CASES])
def test_a_write_that_meets_a_full_disk_says_what_is_left_and_the_way_on(
        script, target, named, resumable, inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "runs" / "out"
    args = script_argv(script, inputs, out)
    main = load_example(script).main
    full_disk_at(monkeypatch, target, out)
    assert main(args) == 3
    err = _line(capsys)
    assert_carries(err, named, "MB are free")
    monkeypatch.undo()
    if resumable:  # the checkpoint of step 1 is there: --resume goes on from it
        assert_carries(err, "--resume", str(out / "checkpoints" / "step_00000001"))
        assert "taken back" not in err, err
        assert main([*args, "--resume"]) == 0
    else:  # nothing to resume from: the start took back all it wrote
        assert "--resume" not in err, err
        assert_carries(err, "the same command", str(out))
        assert not (tmp_path / "runs").exists(), sorted(tmp_path.rglob("*"))
        assert main(args) == 0
    assert (out / "eval.json").is_file() and (out / "final").is_dir()


def test_a_start_taken_back_leaves_what_the_folder_held_before(inputs, tmp_path,
                                                                monkeypatch, capsys):
    """In a folder it did not make, a start takes back only what it added."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's\n")
    script = "finetune_classification"
    full_disk_at(monkeypatch, "checkpoint", out)
    assert load_example(script).main(script_argv(script, inputs, out)) == 3
    assert_carries(_line(capsys), "the same command", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_resumed_run_that_cannot_write_goes_on_from_its_newest_checkpoint(
        inputs, tmp_path, monkeypatch, capsys):
    """A resume whose next checkpoint meets the full disk: the earlier checkpoint and the
    earlier outputs stay, and --resume (the same command) goes on from the earlier one."""
    out, script = tmp_path / "out", "finetune_classification"
    main = load_example(script).main
    assert main(script_argv(script, inputs, out)) == 0
    args = script_argv(script, inputs, out, "--resume", "--max-steps", "2")
    full_disk_at(monkeypatch, "checkpoint", out)
    assert main(args) == 3
    assert_carries(_line(capsys), "--resume", "step_00000001")
    assert (out / "checkpoints" / "step_00000001").is_dir()
    monkeypatch.undo()
    assert main(args) == 0
    assert (out / "checkpoints" / "step_00000002").is_dir()


# ---- a file-size limit, for real -------------------------------------------------------------

# Runs examples/SCRIPT.py as `python examples/SCRIPT.py ARGS` does, with this process's
# file-size limit lowered to LIMIT bytes as MODULE.FUNCTION is first called.
LIMITED = textwrap.dedent("""
    import importlib, resource, runpy, sys
    script, target, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    *path, name = target.split(".")
    owner, attrs = None, []
    while owner is None:
        try:
            owner = importlib.import_module(".".join(path))
        except ImportError:
            attrs.insert(0, path.pop())
    for attr in attrs:
        owner = getattr(owner, attr)
    original = getattr(owner, name)

    def limited(*args, **kwargs):
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return original(*args, **kwargs)

    setattr(owner, name, limited)
    sys.argv = [script, *sys.argv[4:]]
    runpy.run_path(script, run_name="__main__")
""")


def _limited(script, args, target, limit):
    """(exit status, its one line on stderr) of `script` under a file-size limit of `limit`
    bytes: from the process's start (`target` None: set before Python starts, as `ulimit
    -f` does), or from the first call of `target`."""
    import resource

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def lower():  # in the child, before it runs Python
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    command = ([sys.executable, str(EXAMPLES / f"{script}.py")] if target is None else
               [sys.executable, "-c", LIMITED, str(EXAMPLES / f"{script}.py"), target,
                str(limit)])
    proc = subprocess.run([*command, *args], capture_output=True, text=True, env=env,
                          timeout=300, preexec_fn=lower if target is None else None)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, lines[0]


@pytest.mark.skipif(os.name != "posix", reason="a file-size limit is POSIX's setrlimit")
def test_a_file_size_limit_at_the_first_checkpoint(inputs, tmp_path):
    """Under `ulimit -f 3072` the first checkpoint (6 MB of weights and AdamW's moments)
    cannot be written. The line said "resume; the earlier checkpoints are intact" where
    there were none, --resume was then refused, and the run exited 2, as bad input does;
    metrics.jsonl, labels.json and tokenizer/ were left in --out."""
    out, script = tmp_path / "out", "finetune_classification"
    args = script_argv(script, inputs, out)
    code, line = _limited(script, args, None, 3 * 2**20)
    assert code == 3, line
    assert_carries(line, str(out / "checkpoints" / "step_00000001"), "EFBIG",
                   "file-size limit", "ulimit -f", "the same command")
    assert "--resume" not in line and "earlier checkpoints" not in line, line
    assert not out.exists(), sorted(out.rglob("*"))
    assert load_example(script).main(args) == 0  # the way on the line names, once raised


@pytest.mark.skipif(os.name != "posix", reason="a file-size limit is POSIX's setrlimit")
def test_embed_under_a_file_size_limit_names_out_and_the_limit(inputs, tmp_path):
    """numpy's short write said only "960000 requested and 786400 written", with exit 2:
    no flag, no path, no cause. The vectors are written as any output is: the line names
    --out, the cause and its fix; nothing of --out is left, and the status is 3."""
    out = tmp_path / "made" / "v.npy"
    code, line = _limited("embed", script_argv("embed", inputs, tmp_path / "made"), None, 256)
    assert code == 3, line
    assert_carries(line, f"--out {out}", "EFBIG", "ulimit -f")
    assert "requested" not in line and ".tmp" not in line, line
    assert not (tmp_path / "made").exists()


@pytest.mark.skipif(os.name != "posix", reason="a file-size limit is POSIX's setrlimit")
@pytest.mark.parametrize("script,target,named", [
    ("finetune_classification", "minibert.interop.pretrained.PretrainedMixin.save_pretrained",
     "final"),
    ("pretrain_wikitext", "minibert.cli.pretrain.write_json", "eval.json")])
def test_a_file_size_limit_after_training_leaves_a_run_to_resume(script, target, named,
                                                                 inputs, tmp_path):
    """The limit meets final/ (safetensors says "os error 27") or eval.json (a plain
    file's write): the checkpoint of the last step is there, and --resume writes what is
    missing."""
    out = tmp_path / "out"
    args = script_argv(script, inputs, out)
    code, line = _limited(script, args, target, 10)  # bytes: less than any file written
    assert code == 3, line
    assert_carries(line, named, "EFBIG", "file-size limit", "--resume", "step_00000001")
    assert load_example(script).main([*args, "--resume"]) == 0
    assert (out / "eval.json").is_file() and (out / "final" / "config.json").is_file()
