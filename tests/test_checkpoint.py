"""Atomic checkpoint directories: round trip, crash safety, damage detection, keep-last-K."""

import dataclasses
import hashlib
import json
import logging
import os

import numpy as np
import pytest
import torch

import minibert
from conftest import random_batch, tiny_config
from facts import assert_carries, raises
from minibert.training.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_dir,
)
from minibert.training.optim import build_optimizer
from minibert.training.rng import rng_state


_CONFIG = tiny_config(hidden_dropout=0.0, attention_dropout=0.0)  # same forward twice


def _state(value: float = 1.0) -> dict:
    return {"w": torch.full((4, 4), value), "step": int(value), "nested": {"a": [1, 2.5, None]}}


def _trained_model_and_optimizer():
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(_CONFIG)
    opt = build_optimizer(model, lr=1e-3)
    ids, mask = random_batch()
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.full_like(ids, -100))
    model(ids, mask, labels=labels).loss.backward()
    opt.step()
    return model, opt


def test_round_trip_model_optimizer_and_rng(tmp_path):
    model, opt = _trained_model_and_optimizer()
    config = _CONFIG
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "rng": rng_state(), "data": {"epoch": 0, "position": 48}, "step": 1,
             "config": dataclasses.asdict(config), "dtype": torch.float32}
    path = save_checkpoint(tmp_path, 1, state)
    assert path == tmp_path / "step_00000001" == step_dir(tmp_path, 1)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 1 and meta["format_version"] == 1
    assert meta["files"]["state.pt"]["bytes"] == (path / "state.pt").stat().st_size

    loaded = load_checkpoint(path)
    fresh = minibert.BertForMaskedLM(minibert.BertConfig(**loaded["config"]))
    fresh.load_state_dict(loaded["model"])
    fresh_opt = build_optimizer(fresh, lr=1e-3)
    fresh_opt.load_state_dict(loaded["optimizer"])
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n
    # The restored optimizer takes exactly the same next step as the original.
    ids, mask = random_batch(seed=1)
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(ids, mask, labels=ids).loss.backward()
        o.step()
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    assert loaded["data"] == {"epoch": 0, "position": 48} and loaded["dtype"] is torch.float32


def test_crash_before_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 100, _state(1.0))

    def crash(src, dst):
        raise OSError("simulated crash between write and rename")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, 200, _state(2.0))
    monkeypatch.undo()
    assert not step_dir(tmp_path, 200).exists()  # nothing under the final name
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 100)
    assert torch.equal(load_checkpoint(step_dir(tmp_path, 100))["w"], torch.full((4, 4), 1.0))


def test_killed_save_leaves_only_an_ignored_temporary_directory(tmp_path):
    """A kill -9 after writing but before the rename: the temporary directory stays behind."""
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, _state(1.0))
    # What a kill leaves: step 2 fully written, but still under its temporary name.
    os.rename(save_checkpoint(tmp_path / "elsewhere", 2, _state(2.0)),
              root / ".tmp-step_00000002-0badc0de")
    assert latest_checkpoint(root) == step_dir(root, 1)
    save_checkpoint(root, 3, _state(3.0))  # the next save cleans up
    assert sorted(p.name for p in root.iterdir()) == ["step_00000001", "step_00000003"]


def test_replacing_the_same_step_is_safe(tmp_path, monkeypatch):
    """The new checkpoint of a step fails to move in: the second of two renames fails, the
    old folder having stepped aside. The old one is back."""
    save_checkpoint(tmp_path, 5, _state(1.0))
    real_rename = os.rename
    calls = []

    def second_rename_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the old one has stepped aside, the new one fails to move in
            raise OSError("simulated failure")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", second_rename_fails)
    with pytest.raises(OSError, match="simulated failure"):
        save_checkpoint(tmp_path, 5, _state(2.0))
    monkeypatch.undo()
    assert load_checkpoint(step_dir(tmp_path, 5))["w"][0, 0] == 1.0  # the old one is back
    save_checkpoint(tmp_path, 5, _state(3.0))
    assert load_checkpoint(step_dir(tmp_path, 5))["w"][0, 0] == 3.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005"]


@pytest.mark.parametrize("damage, facts", [  # the file at fault, and what is wrong with it
    ("truncate", ("state.pt", "truncated")),
    ("flip", ("state.pt", "sha256")),
    ("no_meta", ("meta.json",)),
    ("no_state", ("state.pt",)),
    ("bad_json", ("meta.json", "unreadable")),
    ("foreign", ("meta.json", "'minibert-checkpoint'")),
    ("future", ("format version", "99")),
])
def test_damaged_checkpoint_is_refused_and_skipped(tmp_path, caplog, damage, facts):
    save_checkpoint(tmp_path, 1, _state(1.0))
    path = save_checkpoint(tmp_path, 2, _state(2.0))
    state_file, meta_file = path / "state.pt", path / "meta.json"
    meta = json.loads(meta_file.read_text())
    if damage == "truncate":
        data = state_file.read_bytes()
        state_file.write_bytes(data[: len(data) // 2])
        facts += (f"{len(data) // 2} bytes", str(len(data)))  # the size found, and expected
    elif damage == "flip":
        data = bytearray(state_file.read_bytes())
        data[len(data) // 2] ^= 0x01
        state_file.write_bytes(bytes(data))
    elif damage == "no_meta":
        meta_file.unlink()
    elif damage == "no_state":
        state_file.unlink()
    elif damage == "bad_json":
        meta_file.write_text("{not json")
    elif damage == "foreign":
        meta_file.write_text(json.dumps({"format": "something-else"}))
    elif damage == "future":
        meta_file.write_text(json.dumps(meta | {"format_version": 99}))

    with raises(CheckpointError, str(path), *facts) as info:
        load_checkpoint(path)
    assert isinstance(info.value, ValueError)
    with caplog.at_level(logging.WARNING, logger="minibert.training.checkpoint"):
        assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 1)
    assert_carries(caplog.text, "step_00000002", *facts)


def test_consistent_but_unloadable_file_gives_checkpoint_error(tmp_path):
    """A state.pt that matches its meta.json but is not a torch file (a foreign writer)."""
    path = save_checkpoint(tmp_path, 1, _state())
    (path / "state.pt").write_bytes(b"garbage, not a zip archive")
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["state.pt"] = {"bytes": 26, "sha256": hashlib.sha256(
        b"garbage, not a zip archive").hexdigest()}
    (path / "meta.json").write_text(json.dumps(meta))
    with raises(CheckpointError, str(path), "state.pt", "weights_only=True"):
        load_checkpoint(path)


def test_missing_paths(tmp_path):
    assert latest_checkpoint(tmp_path / "nowhere") is None
    assert latest_checkpoint(tmp_path) is None
    with raises(CheckpointError, str(tmp_path / "step_00000001")):
        load_checkpoint(tmp_path / "step_00000001")


def test_keep_last_k(tmp_path):
    for step in (10, 20, 30, 40, 50):
        save_checkpoint(tmp_path, step, _state(float(step)), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000040", "step_00000050"]
    save_checkpoint(tmp_path, 60, _state(60.0), keep=None)
    assert len(list(tmp_path.iterdir())) == 3
    # The checkpoint just written survives even if a higher (older run's) step exists.
    save_checkpoint(tmp_path, 45, _state(45.0), keep=1)
    assert step_dir(tmp_path, 45).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000045"]
    with raises(ValueError, "keep=0"):
        save_checkpoint(tmp_path, 1, _state(), keep=0)


def test_unloadable_values_are_refused_at_save_time(tmp_path):
    for bad, hint in [({"config": tiny_config()}, "asdict"),
                      ({"x": np.float64(1.0)}, "tolist"),
                      ({"a": {"b": [1, object()]}}, "state['a']['b'][1]")]:
        with raises(TypeError, hint):

            save_checkpoint(tmp_path, 1, bad)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_full_disk_is_one_clear_error_and_keeps_older_checkpoints(tmp_path, monkeypatch):
    """torch.save on a full disk raises an 'unexpected pos' RuntimeError that never says
    'space'; the error names the checkpoint and the free space, and nothing is lost."""
    import minibert.training.checkpoint as checkpoint

    save_checkpoint(tmp_path, 1, {"w": torch.ones(3)})

    def full_disk(obj, f):
        f.write(b"x" * 10)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with raises(OSError, str(tmp_path / "step_00000002"), "MB are free"):
        save_checkpoint(tmp_path, 2, {"w": torch.zeros(3)})
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]


def test_a_failed_first_save_claims_no_earlier_checkpoint(tmp_path, monkeypatch):
    """The first checkpoint of a run, on a full disk: the message said "resume; the earlier
    checkpoints are intact" where there was none to resume from."""
    import errno

    import minibert.training.checkpoint as checkpoint

    def full_disk(obj, f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with raises(OSError, "step_00000001", "no checkpoint was saved before it") as e:
        save_checkpoint(tmp_path, 1, {"w": torch.zeros(3)})
    assert "resume" not in str(e.value) and "intact" not in str(e.value), str(e.value)
    monkeypatch.undo()
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(3)})
    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with raises(OSError, "step_00000002", "resume", "step_00000001"):  # the one to resume
        save_checkpoint(tmp_path, 2, {"w": torch.zeros(3)})


@pytest.mark.skipif(os.name != "posix", reason="a file-size limit is POSIX's setrlimit")
def test_a_file_size_limit_is_named_not_taken_for_a_full_disk(tmp_path):
    """A checkpoint bigger than `ulimit -f` was said to have filled the disk, with the
    (plentiful) free space: the user went freeing space that was never short."""
    import subprocess
    import sys
    from pathlib import Path

    script = """if True:
        import resource, signal, sys, torch
        from minibert.training.checkpoint import save_checkpoint
        root = sys.argv[1]
        save_checkpoint(root, 1, {"w": torch.ones(3)})
        # Ignored, SIGXFSZ no longer kills the process: the write fails with EFBIG instead.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (200_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            save_checkpoint(root, 2, {"w": torch.zeros(100_000)})  # 400 kB
        except OSError as e:
            print(e)
    """
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    said = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert said.returncode == 0, said.stderr
    message = said.stdout.strip()
    assert "step_00000002" in message and "EFBIG" in message, message
    assert_carries(message, "file-size limit", "200000 bytes", "ulimit -f")  # the limit, raised how

    assert "MB are free" not in message, message
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]


def test_a_used_up_quota_is_named_not_taken_for_a_full_disk(tmp_path, monkeypatch):
    import errno

    import minibert.training.checkpoint as checkpoint

    def over_quota(obj, f):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(checkpoint.torch, "save", over_quota)
    with raises(OSError, str(tmp_path / "step_00000001"), "EDQUOT", "quota"):

        save_checkpoint(tmp_path, 1, {"w": torch.zeros(3)})
    assert list(tmp_path.iterdir()) == []
