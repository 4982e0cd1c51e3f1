"""examples/pretrain_wikitext.py end to end: outputs, preemption, kill -9, and bad input."""

import hashlib
import json
import platform
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minibert

from engine_utils import WORDS, load_example, wikitext_folder

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "pretrain_wikitext.py"
pretrain = load_example("pretrain_wikitext")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"))


def _args(data_dir, out, cache, *extra):
    return ["--data-dir", str(data_dir), "--out", str(out), "--cache-dir", str(cache),
            "--preset", "tiny", "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8",
            "--max-steps", "6", "--log-every", "1", "--no-progress", "--eval-batches", "2",
            *extra]


def test_end_to_end_outputs(data_dir, tmp_path, allocator_calls):
    out = tmp_path / "run"
    assert pretrain.main(_args(data_dir, out, tmp_path / "cache", "--eval-every", "3")) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert len([r for r in rows if "eval_loss" in r]) == 2
    summary = json.loads((out / "eval.json").read_text())
    assert set(summary) == {"eval_loss", "eval_accuracy", "perplexity", "steps", "tokens_seen",
                            "wall_seconds"}
    assert summary["steps"] == 6 and summary["tokens_seen"] == 6 * 8 * 32
    assert not allocator_calls  # the allocator is left alone unless asked
    assert (out / "checkpoints" / "step_00000006").is_dir()
    model = minibert.BertForMaskedLM.from_pretrained(out / "final")
    tok = minibert.Tokenizer.from_pretrained(out / "final")
    assert model.config.vocab_size == tok.vocab_size
    transformers = pytest.importorskip("transformers")
    transformers.BertForMaskedLM.from_pretrained(out / "final")


def _run(data_dir, out, cache, *extra):
    return subprocess.Popen([sys.executable, str(SCRIPT), *_args(data_dir, out, cache, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(out, step, proc, timeout=120):
    target = out / "checkpoints" / f"step_{step:08d}"
    deadline = time.time() + timeout
    while not target.is_dir():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def test_sigterm_and_sigkill_then_resume_match_an_uninterrupted_run(data_dir, tmp_path):
    cache = tmp_path / "cache"
    steps = ("--max-steps", "40", "--save-every", "1")
    ref = _run(data_dir, tmp_path / "ref", cache, *steps)
    assert ref.wait(timeout=300) == 0, ref.communicate()
    expected = json.loads((tmp_path / "ref" / "eval.json").read_text())

    # SIGTERM: the step in progress finishes, a checkpoint is saved, the exit is clean.
    out = tmp_path / "term"
    proc = _run(data_dir, out, cache, *steps)
    _wait_for_checkpoint(out, 3, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "--resume" in stdout
    assert not (out / "eval.json").exists()
    done = _run(data_dir, out, cache, *steps, "--resume")
    assert done.wait(timeout=300) == 0, done.communicate()
    resumed = json.loads((out / "eval.json").read_text())
    assert resumed["eval_loss"] == expected["eval_loss"]

    # SIGKILL at an arbitrary moment: --resume starts from the last complete checkpoint.
    out = tmp_path / "kill"
    proc = _run(data_dir, out, cache, *steps)
    _wait_for_checkpoint(out, 5, proc)
    proc.kill()
    proc.communicate()
    # resumed with the allocator keeping freed memory: where memory comes from changes
    # nothing that is computed
    done = _run(data_dir, out, cache, *steps, "--resume", "--keep-freed-memory")
    stdout, _ = done.communicate(timeout=300)
    assert done.returncode == 0, stdout
    if platform.libc_ver()[0] == "glibc":
        assert "freed memory is kept" in stdout
    resumed = json.loads((out / "eval.json").read_text())
    assert resumed["eval_loss"] == expected["eval_loss"]
    assert resumed["tokens_seen"] == expected["tokens_seen"]


def _error_line(capsys, argv):
    code = pretrain.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_bad_input_gets_one_line(data_dir, tmp_path, capsys):
    cache = tmp_path / "cache"
    out = tmp_path / "run"
    cases = [
        (["--micro-batch-size", "3"], "--micro-batch-size 3 must divide"),
        (["--preset", "huge"], "unknown --preset 'huge'"),
        (["--seq-len", "600"], "--seq-len 600 exceeds"),
        (["--precision", "fp16"], "fp16 needs a CUDA device"),
        (["--resume"], "no intact checkpoint"),
    ]
    for extra, words in cases:
        assert words in _error_line(capsys, _args(data_dir, out, cache, *extra))
    missing = _args(tmp_path / "nowhere", out, cache)
    assert "nowhere" in _error_line(capsys, missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "looked for" in _error_line(capsys, _args(empty, out, cache))
    wrong_split = _args(data_dir, out, cache, "--train-split", "test")
    assert "split 'test' not found" in _error_line(capsys, wrong_split)


def _digest(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_existing_run_is_never_overwritten_and_damage_is_detected(data_dir, tmp_path, capsys):
    cache, out = tmp_path / "cache", tmp_path / "run"
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "4", "--save-every",
                               "2")) == 0
    before = _digest(out / "checkpoints")
    assert "already holds a run" in _error_line(capsys, _args(data_dir, out, cache))
    contradiction = _args(data_dir, out, cache, "--max-steps", "8", "--resume",
                          "--batch-size", "16")
    assert "batch_size: checkpoint 8, now 16" in _error_line(capsys, contradiction)
    assert _digest(out / "checkpoints") == before

    # Damage the newest checkpoint: resume falls back to the older intact one, and says so.
    state = out / "checkpoints" / "step_00000004" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    code = pretrain.main(_args(data_dir, out, cache, "--max-steps", "6", "--resume"))
    assert code == 0
    assert json.loads((out / "eval.json").read_text())["steps"] == 6
    # Damage every checkpoint: a clear refusal, not a traceback.
    for d in (out / "checkpoints").iterdir():
        (d / "state.pt").write_bytes(b"garbage")
    assert "no intact checkpoint" in _error_line(
        capsys, _args(data_dir, out, cache, "--max-steps", "8", "--resume"))


def test_continued_pretraining_on_a_folder_of_text_files(data_dir, tmp_path, allocator_calls):
    """--init-from a checkpoint, --data-dir any folder of .txt files (domain adaptation)."""
    cache = tmp_path / "cache"
    assert pretrain.main(_args(data_dir, tmp_path / "base", cache, "--max-steps", "2")) == 0
    domain = tmp_path / "domain"
    domain.mkdir()
    rng = random.Random(1)
    for name in ("notes.txt", "reports.txt"):
        docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 90)))
                for _ in range(30)]
        (domain / name).write_text("\n\n".join(docs) + "\n")
    out = tmp_path / "adapted"
    args = _args(domain, out, cache, "--init-from", str(tmp_path / "base" / "final"),
                 "--max-steps", "3", "--keep-freed-memory")
    assert pretrain.main(args) == 0
    assert allocator_calls == [True]
    base_tok = minibert.Tokenizer.from_pretrained(tmp_path / "base" / "final")
    assert minibert.Tokenizer.from_pretrained(out / "final").fingerprint == base_tok.fingerprint
    assert json.loads((out / "eval.json").read_text())["steps"] == 3


def test_load_text_folder(tmp_path):
    from minibert.data import load_text_folder

    (tmp_path / "b.txt").write_text("\n\n".join(f"doc b{i}" for i in range(25)))
    (tmp_path / "a.txt").write_text("doc a0 line one\ndoc a0 line two\n\n\ndoc a1\n")
    splits = load_text_folder(tmp_path, holdout_every=10)
    assert splits["train"][0] == "doc a0 line one\ndoc a0 line two"
    assert len(splits["train"]) + len(splits["valid"]) == 27 and len(splits["valid"]) == 2
    assert splits["valid"] == ["doc b7", "doc b17"]  # documents 10 and 20 in name order
    with pytest.raises(FileNotFoundError, match="text folder not found"):
        load_text_folder(tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .txt files"):
        load_text_folder(tmp_path / "empty")
    with pytest.raises(ValueError, match="at least 100"):
        load_text_folder(tmp_path, holdout_every=100)
