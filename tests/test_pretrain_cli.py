"""examples/pretrain_wikitext.py end to end: outputs, preemption, kill -9, and bad input."""

import hashlib
import json
import logging
import os
import platform
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import minibert

from engine_utils import WORDS, from_checkpoint, load_example, weights_file, wikitext_folder
from facts import assert_carries, raises, without

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "pretrain_wikitext.py"
pretrain = load_example("pretrain_wikitext")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"))


def _args(data_dir, out, cache, *extra):
    return from_checkpoint([
        "--data-dir", str(data_dir), "--out", str(out), "--cache-dir", str(cache),
        "--preset", "tiny", "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8",
        "--max-steps", "6", "--log-every", "1", "--no-progress", "--eval-batches", "2",
        "--precision", "fp32", *extra])


def test_end_to_end_outputs(data_dir, tmp_path, allocator_calls):
    out = tmp_path / "run"
    assert pretrain.main(_args(data_dir, out, tmp_path / "cache", "--eval-every", "3",
                               "--whole-word-mask")) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert len([r for r in rows if "eval_loss" in r]) == 2
    summary = json.loads((out / "eval.json").read_text())
    assert set(summary) == {"eval_loss", "eval_accuracy", "perplexity", "steps", "tokens_seen",
                            "wall_seconds", "train_seconds", "precision"}
    assert summary["precision"] == "fp32"
    # the default sequence-length warmup cuts steps 1-3 to 16, 24 and 24 of the 32 positions
    assert summary["steps"] == 6 and summary["tokens_seen"] == 8 * (16 + 24 + 24 + 3 * 32)
    assert allocator_calls == [True]  # a CPU run keeps freed memory unless told not to
    assert (out / "checkpoints" / "step_00000006").is_dir()
    model = minibert.BertForMaskedLM.from_pretrained(out / "final")
    tok = minibert.Tokenizer.from_pretrained(out / "final")
    assert model.config.vocab_size == tok.vocab_size
    # the main job's positions are rotary, whatever the preset's own (tiny's: learned)
    assert model.config.position == "rope"


def test_sequence_length_warmup_by_default_and_as_asked(data_dir, tmp_path):
    """Batches of 8 blocks: 50% of 6 steps (3) grow from 16 positions; here --seq-len is 64,
    so steps 1-3 see 16, 32 and 48 positions, then 64. The token count in eval.json says so."""
    cache = tmp_path / "cache"
    runs = {"default": [], "asked": ["--seq-len-warmup", "3", "--seq-len-start", "16"],
            "off": ["--seq-len-warmup", "0"]}
    seen = {}
    for name, extra in runs.items():
        out = tmp_path / name
        assert pretrain.main(_args(data_dir, out, cache, *extra) + ["--seq-len", "64"]) == 0
        seen[name] = json.loads((out / "eval.json").read_text())["tokens_seen"]
    assert seen["default"] == 8 * (16 + 32 + 48 + 3 * 64)
    assert seen["asked"] == 8 * (16 + 32 + 48 + 3 * 64)  # 16 + 48 * s / 3, multiples of 8
    assert seen["off"] == 8 * 6 * 64


def test_no_keep_freed_memory_leaves_the_allocator_alone(data_dir, tmp_path, allocator_calls):
    assert pretrain.main(_args(data_dir, tmp_path / "run", tmp_path / "cache", "--max-steps",
                               "1", "--no-keep-freed-memory")) == 0
    assert not allocator_calls


def test_evaluation_masks_at_its_own_rate(data_dir, tmp_path, monkeypatch):
    """Eval losses compare across training masking rates: the evaluation masks at
    --eval-mask-prob (15% by default), not at the training --mask-prob."""
    seen = []
    real = pretrain.evaluate

    def counting(model, batches, *a, **k):
        batches = list(batches)
        masked = sum(int((b["labels"] != -100).sum()) for b in batches)
        tokens = sum(int(b["attention_mask"].sum()) for b in batches)
        seen.append(masked / tokens)
        return real(model, batches, *a, **k)

    monkeypatch.setattr(pretrain, "evaluate", counting)
    for extra, share in [(["--mask-prob", "0.45"], 0.15),
                         (["--mask-prob", "0.45", "--eval-mask-prob", "0.3"], 0.3)]:
        seen.clear()
        assert pretrain.main(_args(data_dir, tmp_path / str(share), tmp_path / "cache",
                                   "--max-steps", "1", "--eval-batches", "8", *extra)) == 0
        assert len(seen) == 1 and abs(seen[0] - share) < 0.05, (extra, seen)


def _run(data_dir, out, cache, *extra):
    # MKL may use fewer threads than asked when the machine is busy (MKL_DYNAMIC), which
    # changes a matmul's summation order; these runs are compared bit for bit.
    env = dict(os.environ, MKL_DYNAMIC="FALSE")
    return subprocess.Popen([sys.executable, str(SCRIPT), *_args(data_dir, out, cache, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_checkpoint(out, step, proc, timeout=120):
    target = out / "checkpoints" / f"step_{step:08d}"
    deadline = time.time() + timeout
    while not target.is_dir():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def test_sigterm_and_sigkill_then_resume_match_an_uninterrupted_run(data_dir, tmp_path):
    cache = tmp_path / "cache"
    steps = ("--max-steps", "12", "--save-every", "1")
    ref = _run(data_dir, tmp_path / "ref", cache, *steps)
    assert ref.wait(timeout=300) == 0, ref.communicate()
    expected = json.loads((tmp_path / "ref" / "eval.json").read_text())

    # SIGTERM: the step in progress finishes, a checkpoint is saved, and the exit status is
    # 128 + 15, so that `pretrain && next` does not go on with an unfinished run.
    out = tmp_path / "term"
    proc = _run(data_dir, out, cache, *steps)
    _wait_for_checkpoint(out, 3, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "--resume" in stdout
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
    cases = [  # (the flags, the facts the one line must carry: each flag with its value, ...)
        (["--micro-batch-size", "3"], ["--batch-size 8", "--micro-batch-size 3"]),
        # TrainConfig's own checks, in the flags' names
        (["--batch-size", "0"], ["--batch-size 0", ">= 1"]),
        (["--max-steps", "0"], ["--max-steps 0", ">= 1"]),
        (["--max-grad-norm", "0"], ["--max-grad-norm 0.0", "> 0"]),
        (["--max-grad-norm", "-1"], ["--max-grad-norm -1.0", "> 0"]),
        (["--adam-eps", "0"], ["--adam-eps 0.0", "> 0"]),
        (["--lr", "1e-6"], ["--min-lr <= --lr", "--lr 1e-06", "--min-lr 1e-05"]),
        (["--warmup-steps", "9"], ["--warmup-steps", "9 steps", "--max-steps 6"]),
        (["--seq-len-warmup", "9"], ["--seq-len-warmup", "9 steps", "--max-steps 6"]),
        (["--seq-len-warmup", "-1"], ["--seq-len-warmup -1", ">= 0"]),
        # and the rules no setting checks itself
        (["--mask-prob", "1.5"], ["--mask-prob 1.5", "0 and 1"]),
        (["--seq-len-start", "4"], ["--seq-len-start 4", "8"]),
        (["--seq-len-start", "48"], ["--seq-len-start 48", "--seq-len 32"]),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--preset", "huge"],
         ["--device cuda"] if not torch.cuda.is_available() else ["'huge'"]),
        (["--preset", "huge"], ["--preset", "'huge'", "tiny"]),
        (["--seq-len", "600"], ["600", "max_position_embeddings=512"]),
        (["--precision", "fp16"], ["--precision fp16", "CUDA"]),
        (["--resume"], ["--resume", "<path>"]),  # and the folder that does not exist
    ]
    for extra, facts in cases:
        err = _error_line(capsys, _args(data_dir, out, cache, *extra))
        assert_carries(without(err, out), *facts)
    missing = _args(tmp_path / "nowhere", out, cache)
    assert_carries(_error_line(capsys, missing), str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_carries(_error_line(capsys, _args(empty, out, cache)), str(empty), "*.txt")
    wrong_split = _args(data_dir, out, cache, "--train-split", "test")
    assert_carries(_error_line(capsys, wrong_split), "'test'", str(data_dir), "--train-split")


def test_missing_safetensors_is_said_before_training_not_after(data_dir, tmp_path, capsys,
                                                                monkeypatch):
    """The model folder is written at the end; without safetensors a run would train for
    its whole length and then fail. It is refused at the start instead, touching nothing."""
    import sys

    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    out = tmp_path / "run"
    err = _error_line(capsys, _args(data_dir, out, tmp_path / "cache"))
    assert_carries(err, "safetensors", "pip install 'minibert[examples]'")
    assert not out.exists()


def _digest(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_existing_run_is_never_overwritten_and_damage_is_detected(data_dir, tmp_path, capsys):
    cache, out = tmp_path / "cache", tmp_path / "run"
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "4", "--save-every",
                               "2")) == 0
    before = _digest(out / "checkpoints")
    assert_carries(_error_line(capsys, _args(data_dir, out, cache)), str(out), "--resume",
                   "--out")
    contradiction = _args(data_dir, out, cache, "--max-steps", "8", "--resume",
                          "--batch-size", "16")
    # the flag, its value in the checkpoint and now
    assert_carries(without(_error_line(capsys, contradiction), out), "--batch-size", "8", "16")
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
    assert_carries(_error_line(capsys, _args(data_dir, out, cache, "--max-steps", "8",
                                             "--resume")), "--resume", str(out / "checkpoints"))


def test_continued_pretraining_on_a_folder_of_text_files(data_dir, tmp_path, allocator_calls,
                                                         monkeypatch):
    """--init-from a checkpoint, --data-dir any folder of .txt files (domain adaptation).
    The model is the checkpoint's: a classic BERT stays one, though the main job's own
    positions are rotary."""
    import minibert.interop.hf

    cache = tmp_path / "cache"
    assert pretrain.main(_args(data_dir, tmp_path / "base", cache, "--max-steps", "2",
                               "--position", "learned")) == 0
    reads = []  # the weights' tensors read (a header alone is not a read)
    load = minibert.interop.hf._load_safetensors

    def counted(file, header_only=False):
        if not header_only:
            reads.append(file)
        return load(file, header_only)

    monkeypatch.setattr(minibert.interop.hf, "_load_safetensors", counted)
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
    assert len(reads) == 1  # checked before --out is made by its header alone, then read once
    assert allocator_calls == [True, True]  # asked by both runs (the first by default)
    base_tok = minibert.Tokenizer.from_pretrained(tmp_path / "base" / "final")
    assert minibert.Tokenizer.from_pretrained(out / "final").fingerprint == base_tok.fingerprint
    assert minibert.BertForMaskedLM.from_pretrained(out / "final").config.position == "learned"
    # The before and after: an evaluation at step 0, then the sequences at their full length
    # from the first step (the model learned it); --seq-len-warmup restarts the warmup.
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert rows[0]["step"] == 0 and "eval_loss" in rows[0]
    assert json.loads((out / "eval.json").read_text())["tokens_seen"] == 3 * 8 * 32
    again = tmp_path / "again"
    assert pretrain.main(_args(domain, again, cache, "--init-from",
                               str(tmp_path / "base" / "final"), "--max-steps", "3",
                               "--seq-len-warmup", "2")) == 0
    assert json.loads((again / "eval.json").read_text())["tokens_seen"] == 8 * (16 + 24 + 32)


def test_the_plot_says_which_loss_is_which_and_marks_the_warmup():
    """Training masks 30% of sequences that grow over the warmup, evaluation 15% of full
    blocks: the legend says so of each curve, and the warmup's steps are shaded."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    from minibert.cli.pretrain import loss_figure, train_config

    args = pretrain.parse_args(["--max-steps", "100", "--eval-split", "test"])
    rows = [{"step": s, "loss": 9.0 - s / 50} for s in range(10, 101, 10)] + \
        [{"step": s, "eval_loss": 8.0 - s / 50} for s in (0, 50, 100)]
    fig = loss_figure(rows, train_config(args), args)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert_carries(" | ".join(labels), "training loss (30% masked", "eval loss (15% masked",
                   "128 tokens", "test split", "sequence-length warmup (16 -> 128 tokens)")
    (span,) = ax.patches  # the warmup's steps, shaded
    assert (span.get_x(), span.get_x() + span.get_width()) == (0, 50)
    assert [list(line.get_xdata()) for line in ax.lines][1] == [0, 50, 100]


def test_load_text_folder(tmp_path):
    from minibert.data import load_text_folder

    (tmp_path / "b.txt").write_text("\n\n".join(f"doc b{i}" for i in range(25)))
    (tmp_path / "a.txt").write_text("doc a0 line one\ndoc a0 line two\n\n\ndoc a1\n")
    splits = load_text_folder(tmp_path, holdout_every=10)
    assert splits["train"][0] == "doc a0 line one\ndoc a0 line two"
    assert len(splits["train"]) + len(splits["valid"]) == 27 and len(splits["valid"]) == 2
    assert splits["valid"] == ["doc b7", "doc b17"]  # documents 10 and 20 in name order
    with raises(FileNotFoundError, str(tmp_path / "x")):
        load_text_folder(tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with raises(FileNotFoundError, str(tmp_path / "empty"), ".txt"):
        load_text_folder(tmp_path / "empty")
    with raises(ValueError, str(tmp_path), "27 documents", "at least 100"):

        load_text_folder(tmp_path, holdout_every=100)


def test_numeric_flags_are_checked_before_any_work(data_dir, tmp_path, capsys):
    """A bad number fails at once: no tokenizer trained, nothing written in --out."""
    out = tmp_path / "run"
    _error_line(capsys, _args(data_dir, out, tmp_path / "cache", "--max-grad-norm", "-1"))
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_leftover_tokenizer_never_replaces_this_runs(data_dir, tmp_path, capsys,
                                                       monkeypatch):
    """A tokenizer left in --out/tokenizer by a start that never trained (killed, or of an
    earlier version, which wrote it before tokenizing the corpus): the next start uses it
    only if it is the tokenizer that start would make, and refuses otherwise."""
    import minibert.data.prepare
    from minibert.data import load_corpus

    cache, out = tmp_path / "cache", tmp_path / "run"
    # A start that fails while tokenizing the corpus (a full disk) writes nothing.
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(minibert.data.prepare, "tokenize_to_memmap", full_disk)
        assert "No space left" in _error_line(capsys, _args(data_dir, out, cache))
    assert not out.exists()
    # The tokenizer that start would have written, left behind.
    leftover = minibert.data.prepare.run_tokenizer(out, load_corpus(data_dir).splits["train"],
                                                   vocab_size=200, cache_dir=cache)
    leftover.save(out / "tokenizer")
    err = _error_line(capsys, _args(data_dir, out, cache, "--vocab-size", "100"))
    # the folder, both tokenizers (the one there, the one this run makes), and what to do
    assert_carries(err, str(out / "tokenizer"), leftover.fingerprint[:16], "--vocab-size 100",
                   "--out")
    # --init-from a checkpoint whose tokenizer (its own) is other than the leftover one
    other = minibert.Tokenizer.train_from_iterator(["zebra yak " * 30] * 40, vocab_size=60,
                                                   cache_dir=cache)
    base = tmp_path / "base"
    minibert.BertForMaskedLM(minibert.BertConfig.preset(
        "tiny", vocab_size=other.vocab_size, pad_token_id=other.pad_id)).save_pretrained(
        base, tokenizer=other)
    err = _error_line(capsys, _args(data_dir, out, cache, "--init-from", str(base)))
    assert_carries(err, leftover.fingerprint[:16], other.fingerprint[:16], str(base))
    # The start that made it may use it.
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "2")) == 0


def test_finished_results_are_kept_when_checkpoints_are_deleted(data_dir, tmp_path, capsys):
    cache, out = tmp_path / "cache", tmp_path / "run"
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "2")) == 0
    import shutil

    shutil.rmtree(out / "checkpoints")
    before = {p: p.read_bytes() for p in (out / "eval.json", out / "metrics.jsonl",
                                          weights_file(out / "final"))}
    err = _error_line(capsys, _args(data_dir, out, cache, "--max-steps", "2"))
    # what the run left, that it cannot be resumed, and what to delete to start again
    assert_carries(err, str(out), "final/, eval.json, metrics.jsonl", "no checkpoint", "delete")
    assert all(p.read_bytes() == b for p, b in before.items())


def test_a_warmup_longer_than_the_run_names_its_own_flag_to_shorten(data_dir, tmp_path,
                                                                     capsys):
    """The sequence-length warmup's refusal sent the user to --warmup-steps, the learning
    rate's warmup, which was not the one too long."""
    err = _error_line(capsys, _args(data_dir, tmp_path / "run", tmp_path / "cache",
                                    "--seq-len-warmup", "9"))
    assert "shorten --seq-len-warmup" in err and "--warmup-steps" not in err, err
    err = _error_line(capsys, _args(data_dir, tmp_path / "run", tmp_path / "cache",
                                    "--warmup-steps", "9"))
    assert "shorten --warmup-steps" in err and "--seq-len-warmup" not in err, err


def test_a_second_run_on_the_same_out_is_refused_naming_the_first(data_dir, tmp_path, capsys):
    from minibert.training.rundir import RunLock

    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); "
        "from minibert.training.rundir import RunLock; "
        "lock = RunLock(sys.argv[2]).acquire(); print('held', flush=True); time.sleep(60)"),
        str(Path(__file__).resolve().parents[1]), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        err = _error_line(capsys, _args(data_dir, out, tmp_path / "cache"))
        assert_carries(err, str(holder.pid), str(out), "--out")  # the holder, the folder
        assert not (out / "tokenizer").exists()  # refused before any work
        (out / ".lock").unlink()  # by hand: a --resume still finds the live run
        err = _error_line(capsys, _args(data_dir, out, tmp_path / "cache", "--resume"))
        assert_carries(err, str(out), ".lock", "deleted", "--out")
        assert sorted(p.name for p in out.iterdir()) == []
    finally:
        holder.kill()
        holder.wait()
    # Killed, its lock is gone with it: the next run takes the folder.
    assert pretrain.main(_args(data_dir, out, tmp_path / "cache", "--max-steps", "1")) == 0
    with RunLock(out):  # and this run released it on exit
        pass


def test_resume_refuses_other_data_settings(data_dir, tmp_path, capsys):
    cache, out = tmp_path / "cache", tmp_path / "run"
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "2")) == 0
    # the checkpoint refused, then each flag that differs, with its value then and now
    for extra, facts in [(["--seq-len", "24"], ["--seq-len", "32", "24"]),
                         (["--mask-prob", "0.15"], ["--mask-prob", "0.3", "0.15"]),
                         (["--eval-mask-prob", "0.2"], ["--eval-mask-prob", "0.15", "0.2"]),
                         (["--whole-word-mask"], ["--whole-word-mask", "False", "True"]),
                         (["--eval-split", "train"], ["--eval-split", "'valid'", "'train'"])]:
        err = _error_line(capsys, _args(data_dir, out, cache, "--max-steps", "4", "--resume",
                                        *extra))
        assert_carries(err, str(out / "checkpoints" / "step_00000002"))
        assert_carries(without(err, out), *facts)
    (tmp_path / "other").mkdir()
    other = wikitext_folder(tmp_path / "other", sizes=(("train", 100), ("valid", 20)))
    err = _error_line(capsys, _args(other, out, cache, "--max-steps", "4", "--resume"))
    assert_carries(err, "--train-split train")  # its text differs from the checkpoint's
    # The same run resumes, and its tokenizer is read, never written again (a kill during a
    # rewrite could leave it truncated and the run unresumable).
    tokenizer = out / "tokenizer" / "tokenizer.json"
    before = (tokenizer.read_bytes(), tokenizer.stat().st_mtime_ns)
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "4", "--resume")) == 0
    assert (tokenizer.read_bytes(), tokenizer.stat().st_mtime_ns) == before


def test_a_damaged_token_cache_is_rebuilt(data_dir, tmp_path, caplog):
    cache = tmp_path / "cache"
    assert pretrain.main(_args(data_dir, tmp_path / "a", cache, "--max-steps", "1")) == 0
    token_files = sorted((cache / "tokens").glob("*.tok"))
    assert token_files
    for f in token_files:
        f.write_bytes(f.read_bytes()[:100])  # truncated
    with caplog.at_level("WARNING"):
        assert pretrain.main(_args(data_dir, tmp_path / "b", cache, "--max-steps", "1")) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for f in token_files:  # each damaged file is named once, as damaged
        assert [m for m in warnings if str(f) in m and "damaged" in m] != [], (f, warnings)
    assert len([m for m in warnings if "damaged" in m]) == len(token_files), warnings
    a = json.loads((tmp_path / "a" / "eval.json").read_text())
    b = json.loads((tmp_path / "b" / "eval.json").read_text())
    assert a["eval_loss"] == b["eval_loss"]


def test_a_mixed_folder_is_refused_and_every_file_read_is_logged(data_dir, tmp_path, capsys,
                                                                 caplog):
    """A valid.txt beside other text files once made the folder WikiText and dropped them."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "valid.txt").write_text((data_dir / "valid.txt").read_text())
    (mixed / "corpus_a.txt").write_text((data_dir / "train.txt").read_text())
    err = _error_line(capsys, _args(mixed, tmp_path / "run", tmp_path / "cache"))
    assert "corpus_a.txt" in err and "valid.txt" in err
    with caplog.at_level("INFO"):
        assert pretrain.main(_args(data_dir, tmp_path / "ok", tmp_path / "cache",
                                   "--max-steps", "1")) == 0
    text = "\n".join(caplog.messages)
    assert "train.txt -> train" in text and "valid.txt -> valid" in text
    assert "split train:" in text and " tokens" in text


def test_damaged_weights_checkpoints_and_a_full_disk_are_one_line(data_dir, tmp_path, capsys,
                                                                  monkeypatch):
    import shutil

    cache = tmp_path / "cache"
    assert pretrain.main(_args(data_dir, tmp_path / "base", cache, "--max-steps", "2")) == 0
    # --init-from a folder whose weights were cut short by a bad copy
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "base" / "final", cut)
    weights = weights_file(cut)
    weights.write_bytes(weights.read_bytes()[:5000])
    err = _error_line(capsys, _args(data_dir, tmp_path / "a", cache, "--init-from", str(cut)))
    assert_carries(err, str(weights), "damaged")
    # --init-from a training checkpoint: say what it is and how to export it
    step = tmp_path / "base" / "checkpoints" / "step_00000002"
    err = _error_line(capsys, _args(data_dir, tmp_path / "b", cache, "--init-from", str(step)))
    assert_carries(err, str(step), "training checkpoint", "export_checkpoint")
    # A full disk while writing final/: one line, exit status 3, and the run's last
    # checkpoint, intact, to resume from (or to export).
    import safetensors.torch

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    out = tmp_path / "c"
    assert pretrain.main(_args(data_dir, out, cache, "--max-steps", "2")) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert_carries(err, str(out / "final"), "MB are free", "--resume",
                   str(out / "checkpoints" / "step_00000002"))
    monkeypatch.undo()
    from minibert.interop.export import export_checkpoint

    export_checkpoint(out / "checkpoints" / "step_00000002", out / "final")
    assert minibert.BertForMaskedLM.from_pretrained(out / "final").config.vocab_size > 0


def test_the_tokenizer_trains_on_a_sample_of_a_big_train_split(data_dir, tmp_path, monkeypatch,
                                                                caplog):
    import minibert.data.prepare

    monkeypatch.setattr(minibert.data.prepare, "TOKENIZER_SAMPLE_CHARS", 20_000)
    with caplog.at_level(logging.INFO, logger="minibert.data.prepare"):
        assert pretrain.main(_args(data_dir, tmp_path / "run", tmp_path / "cache",
                                   "--max-steps", "1")) == 0
    assert re.search(r"training the tokenizer on every \d+(st|nd|rd|th) document of train",
                     caplog.text), caplog.text


def test_the_main_job_trains_the_modern_family_and_its_switches(data_dir, tmp_path, caplog):
    """--preset modernbert-tiny trains and exports a folder transformers' ModernBERT loads;
    a switch given as a flag reaches the config; a bad one is named as the flag. The last
    line says whether transformers loads final/: a mix of switches it has no class for
    (BERT with rotary positions, the main job's default) loads in minibert alone, classic
    BERT (`--position learned`) in transformers' BertForMaskedLM too."""
    caplog.set_level(logging.INFO)
    out = tmp_path / "modern"
    assert pretrain.main(_args(data_dir, out, tmp_path / "cache", "--preset",
                               "modernbert-tiny", "--local-window", "16")) == 0
    assert "transformers' ModernBertForMaskedLM loads too" in caplog.records[-1].getMessage()
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["local_attention"] == 16
    transformers = pytest.importorskip("transformers")
    transformers.ModernBertForMaskedLM.from_pretrained(out / "final")
    out = tmp_path / "rope"  # the main job's own positions
    assert pretrain.main(_args(data_dir, out, tmp_path / "cache", "--no-bias",
                               "--max-steps", "2")) == 0
    model = minibert.BertForMaskedLM.from_pretrained(out / "final")
    assert (model.config.position, model.config.bias, model.config.mlp) == ("rope", False,
                                                                            "gelu")
    said = caplog.records[-1].getMessage()
    assert "transformers has no class for" in said and "loads too" not in said, said
    out = tmp_path / "classic"  # classic BERT, which transformers' BertForMaskedLM loads
    assert pretrain.main(_args(data_dir, out, tmp_path / "cache", "--position", "learned",
                               "--max-steps", "2")) == 0
    assert "transformers' BertForMaskedLM loads too" in caplog.records[-1].getMessage()
    transformers.BertForMaskedLM.from_pretrained(out / "final")
    assert pretrain.main(_args(data_dir, tmp_path / "bad", tmp_path / "cache",
                               "--global-every", "0")) == 2
    assert not (tmp_path / "bad").exists()


def test_a_resumed_auto_run_evaluates_in_the_precision_it_trains_in(data_dir, tmp_path,
                                                                    monkeypatch):
    """--precision auto decides by the CPU's flags; a resume on a machine whose CPU decides
    otherwise (the run's folder moved, or is shared) keeps training in the run's precision
    (engine), and must evaluate in it too: eval.json then equals the uninterrupted run's."""
    import minibert.machine.precision as precision

    def run(out, flags, *extra):
        monkeypatch.setattr(precision, "_read_cpuinfo", lambda: f"flags\t\t: fpu avx2 {flags}\n")
        precision.cpu_bf16_flags.cache_clear()
        args = _args(data_dir, tmp_path / out, tmp_path / "cache", *extra)
        args[args.index("--precision") + 1] = "auto"
        assert pretrain.main(args) == 0

    try:
        run("ref", "avx512_bf16")
        run("run", "avx512_bf16", "--max-steps", "3", "--decay-steps", "6")
        run("run", "", "--resume")  # a CPU without bf16 instructions now
    finally:
        precision.cpu_bf16_flags.cache_clear()
    ref, resumed = (json.loads((tmp_path / o / "eval.json").read_text()) for o in ("ref", "run"))
    assert ref["precision"] == resumed["precision"] == "bf16"
    assert resumed["eval_loss"] == ref["eval_loss"]


def test_help_shows_every_default_and_no_none(capsys):
    """argparse's own formatter left out the default of every flag without help text (most
    of them) and printed "(default: None)" after defaults the help text explains."""
    with pytest.raises(SystemExit):
        pretrain.main(["--help"])
    out = capsys.readouterr().out
    for flag, default in (("--lr LR", "0.001"), ("--seq-len SEQ_LEN", "128"),
                          ("--max-grad-norm MAX_GRAD_NORM", "1.0"), ("--mask-prob MASK_PROB",
                                                                     "0.3")):
        assert re.search(rf"{flag}\s[^-]*\(default:\s+{re.escape(default)}\)", out), flag
    assert "default: None" not in out and "default: False" not in out
