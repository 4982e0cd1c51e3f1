"""The chunked-attention tile picked by timing: a larger tile wins only when clearly faster."""

import pytest
import torch

import minibert.machine.autotune as autotune
from minibert.machine.autotune import CHUNK_CANDIDATES, pick_chunk_size, time_chunk_sizes


def test_pick_chunk_size_takes_a_larger_tile_only_when_clearly_faster(monkeypatch):
    fake = {64: 3.0, 128: 2.0, 256: 1.0, 512: 1.0}
    seen = []

    def fake_seconds(q, k, v, grad, chunk, repeats):
        seen.append(chunk)
        assert q.shape == (1, 4, 1000, 32) and repeats == 2
        return fake[chunk]

    monkeypatch.setattr(autotune, "_median_seconds", fake_seconds)
    assert pick_chunk_size(4, 32, 1000, repeats=2) == 256  # a tie: the smaller tile
    assert seen == [64, 128, 256, 512]
    fake[512] = 0.95  # 5% faster is within a run-to-run spread: not worth twice the memory
    assert pick_chunk_size(4, 32, 1000, repeats=2) == 256
    fake[512] = 0.85  # clearly faster
    assert pick_chunk_size(4, 32, 1000, repeats=2) == 512
    fake.update({128: 0.5, 512: 1.0})
    assert pick_chunk_size(4, 32, 1000, repeats=2) == 128


def test_tiles_longer_than_the_sequence_are_not_timed(monkeypatch):
    monkeypatch.setattr(autotune, "_median_seconds", lambda *a: 1.0 / a[4])
    assert set(time_chunk_sizes(2, 8, 200)) == {64, 128}
    assert pick_chunk_size(2, 8, 200) == 128  # 256 and 512 would be one tile of 200
    assert time_chunk_sizes(2, 8, 40) == {64: 1.0 / 64}  # every tile covers it: the smallest


def test_time_chunk_sizes_really_times_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    timings = time_chunk_sizes(2, 8, 96, candidates=(16, 32), repeats=1)
    assert torch.equal(torch.get_rng_state(), before)  # a seeded run draws the same numbers
    assert set(timings) == {16, 32} and all(t > 0 for t in timings.values())
    assert pick_chunk_size(2, 8, 96, candidates=(16, 32), repeats=1) in (16, 32)
    assert max(CHUNK_CANDIDATES) <= 512  # the memory bound O(T * chunk) needs a constant cap


@pytest.mark.parametrize("kwargs, words", [
    ({"candidates": ()}, "candidates"), ({"candidates": (0, 64)}, "candidates"),
    ({"seq_len": 0}, "seq_len 0"), ({"repeats": 0}, "repeats 0")])
def test_time_chunk_sizes_refuses_bad_input_by_name(kwargs, words):
    args = {"num_heads": 2, "head_dim": 8, "seq_len": 64, **kwargs}
    with pytest.raises(ValueError, match=words):
        time_chunk_sizes(**args)
