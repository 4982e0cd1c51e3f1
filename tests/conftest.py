"""Shared fixtures: small random-weight transformers checkpoints to compare against."""

import pytest
import torch

import minibert
from minibert.interop.hf import _MINIBERT_ONLY, config_to_hf


@pytest.fixture(autouse=True)
def allocator_calls(monkeypatch):
    """Records `keep_freed_memory()` calls instead of making them, and keeps
    `limit_kernel_cache()` from writing to this process's environment.

    Both settings are process-wide and permanent, and the tests share one process whose
    peak-memory tests need glibc's default behaviour; test_machine.py tests the real
    settings in processes of their own, and scripts run as subprocesses make the real calls.
    """
    import minibert.machine.memory

    calls = []
    monkeypatch.setattr(minibert.machine.memory, "keep_freed_memory",
                        lambda: calls.append(True) or True)
    monkeypatch.setattr(minibert.machine.memory, "limit_kernel_cache", lambda *a, **k: False)
    return calls


@pytest.fixture(autouse=True, scope="session")
def cache_dir(tmp_path_factory):
    """$MINIBERT_CACHE in this test session's own folder, for the tests and the scripts they
    start: what a run records there (its machine's MFU ceiling, a trained tokenizer) must not
    land in the user's ~/.cache/minibert. Session-wide, so it is set before the module-wide
    fixtures that already train, and the ceiling is measured once per session as it is once
    per machine; a test that needs a fresh folder sets its own."""
    folder = tmp_path_factory.getbasetemp() / "minibert-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIBERT_CACHE", str(folder))
        yield folder


def tiny_config(**overrides) -> minibert.BertConfig:
    """A 2-layer model small enough that every test runs in well under a second."""
    fields = dict(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    fields.update(overrides)
    return minibert.BertConfig(**fields)


def hf_config(config: minibert.BertConfig):
    """The transformers BertConfig for a minibert config (fields both libraries know)."""
    transformers = pytest.importorskip("transformers")
    d = config_to_hf(config)
    for key in _MINIBERT_ONLY:
        d.pop(key)
    return transformers.BertConfig(**d)


def random_batch(B=3, T=37, vocab=99, pad_from=None, seed=0):
    """input_ids (B, T) and an attention mask where sequence 1 is padded from `pad_from`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if pad_from is not None:
        mask[1, pad_from:] = 0
        ids[1, pad_from:] = 0
    return ids, mask
