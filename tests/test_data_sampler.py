"""Samplers: per-epoch shuffles, disjoint DDP slices, exact resume, length grouping."""
import numpy as np
import pytest
import torch

from minibert.data import (LengthGroupedBatchSampler, MLMCollator, PackedMLMDataset,
                           ShardedSampler, tokenize_to_memmap)
from facts import raises



class ToyTokenizer:
    """Ids 0-4 special, 5.. ordinary; "12 7 99" encodes to [12, 7, 99]."""

    vocab_size, fingerprint = 1000, "toy"
    pad_id, unk_id, cls_id, sep_id, mask_id = 0, 1, 2, 3, 4
    special_ids = (0, 1, 2, 3, 4)

    def encode_batch(self, texts, add_special_tokens=True):
        return [[int(w) for w in t.split()] for t in texts]


def test_each_epoch_is_a_seeded_permutation():
    s = ShardedSampler(103, 10, seed=5)
    e0 = list(s)
    assert len(e0) == len(s) == 100 and len(set(e0)) == 100 and set(e0) <= set(range(103))
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0
    again = ShardedSampler(103, 10, seed=5)
    assert list(again) == e0
    assert list(ShardedSampler(103, 10, seed=6)) != e0
    assert list(ShardedSampler(103, 10, shuffle=False)) == list(range(100))
    keep = ShardedSampler(103, 10, seed=5, drop_last=False)
    assert sorted(keep) == list(range(103)) and len(keep) == 103


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_get_disjoint_slices_of_every_global_batch(world_size):
    G = 16
    single = list(ShardedSampler(100, G, seed=1))
    ranks = [list(ShardedSampler(100, G, seed=1, rank=r, world_size=world_size))
             for r in range(world_size)]
    share = G // world_size
    assert all(len(r) == len(single) // world_size for r in ranks)
    for b in range(len(single) // G):
        glob = [i for r in ranks for i in r[b * share:(b + 1) * share]]
        assert glob == single[b * G:(b + 1) * G]  # same examples, in rank order
    flat = [i for r in ranks for i in r]
    assert len(set(flat)) == len(flat)


def test_partial_last_batch_is_split_when_kept():
    ranks = [ShardedSampler(21, 8, world_size=2, rank=r, drop_last=False) for r in range(2)]
    got = [list(s) for s in ranks]
    assert [len(g) for g in got] == [len(s) for s in ranks] == [11, 10]
    assert sorted(got[0] + got[1]) == list(range(21))


@pytest.mark.parametrize("world_size,start", [(1, 0), (1, 7), (1, 48), (2, 32), (2, 96)])
def test_resume_from_position_k_equals_skipping_k(world_size, start):
    G = 16
    for rank in range(world_size):
        full = ShardedSampler(100, G, seed=3, rank=rank, world_size=world_size)
        full.set_epoch(2)
        resumed = ShardedSampler(100, G, seed=3, rank=rank, world_size=world_size)
        resumed.set_epoch(2, start=start)
        skip = start // world_size
        assert list(resumed) == list(full)[skip:]
        assert len(resumed) == len(full) - skip


def test_resume_reads_no_skipped_example():
    class Counting(torch.utils.data.Dataset):
        def __init__(self):
            self.read = []

        def __len__(self):
            return 64

        def __getitem__(self, i):
            self.read.append(i)
            return i

    ds = Counting()
    s = ShardedSampler(len(ds), 8, seed=0)
    s.set_epoch(0, start=40)
    list(torch.utils.data.DataLoader(ds, batch_size=4, sampler=s))
    assert len(ds.read) == 24 and set(ds.read) == set(s.order()[40:].tolist())


def test_sampler_errors():
    with raises(ValueError, "global_batch_size=10", "world_size=4"):
        ShardedSampler(100, 10, world_size=4, rank=0)
    with pytest.raises(ValueError, match="rank"):
        ShardedSampler(100, 8, world_size=2, rank=2)
    with raises(ValueError, "5 examples", "8", "drop_last=False"):
        ShardedSampler(5, 8)
    s = ShardedSampler(100, 8, world_size=2)
    with raises(ValueError, "start=4", "global_batch_size=8"):
        s.set_epoch(0, start=4)
    with pytest.raises(ValueError, match="start"):
        s.set_epoch(0, start=200)


def _global_batches(ds, collate, world_size, micro, G, epoch, start=0):
    """Run the data path as `world_size` ranks would; return the global batches' tensors."""
    per_rank = []
    for rank in range(world_size):
        s = ShardedSampler(len(ds), G, seed=9, rank=rank, world_size=world_size)
        s.set_epoch(epoch, start=start)
        collate.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_size=micro, sampler=s, collate_fn=collate)
        per_rank.append(list(loader))
    steps = G // world_size // micro  # micro-batches per rank per optimizer step
    out = []
    for step in range(len(per_rank[0]) // steps):
        parts = [mb for r in per_rank for mb in r[step * steps:(step + 1) * steps]]
        out.append({k: torch.cat([p[k] for p in parts]) for k in ("input_ids", "labels")})
    return out


def test_batches_identical_across_ranks_micro_batches_and_resume(tmp_path):
    rng = np.random.default_rng(0)
    docs = [" ".join(map(str, rng.integers(5, 1000, size=int(n))))
            for n in rng.integers(5, 80, 60)]
    tf = tokenize_to_memmap(docs, ToyTokenizer(), tmp_path / "t.tok")
    ds = PackedMLMDataset(tf, 16)
    assert len(ds) >= 128
    collate = MLMCollator(ToyTokenizer(), seed=1)
    G = 16
    ref = _global_batches(ds, collate, world_size=1, micro=16, G=G, epoch=1)
    for world_size, micro in [(1, 4), (2, 8), (2, 4), (4, 2)]:
        got = _global_batches(ds, collate, world_size, micro, G, epoch=1)
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert torch.equal(a["input_ids"], b["input_ids"])
            assert torch.equal(a["labels"], b["labels"])
    resumed = _global_batches(ds, collate, world_size=2, micro=4, G=G, epoch=1, start=3 * G)
    for a, b in zip(resumed, ref[3:]):
        assert torch.equal(a["labels"], b["labels"])
    other_epoch = _global_batches(ds, collate, world_size=1, micro=16, G=G, epoch=2)
    assert not torch.equal(other_epoch[0]["input_ids"], ref[0]["input_ids"])


def test_length_grouping_covers_everything_and_cuts_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 500, size=1000)
    s = LengthGroupedBatchSampler(lengths, 16, seed=1)
    batches = list(s)
    assert len(batches) == len(s) == 63
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1000))
    assert lengths[batches[0]].max() == lengths.max()  # the longest batch first

    def padded(bs):
        return sum(len(b) * lengths[b].max() for b in bs)

    random_batches = [list(range(i, min(i + 16, 1000))) for i in range(0, 1000, 16)]
    assert padded(batches) < 0.6 * padded(random_batches)
    assert list(LengthGroupedBatchSampler(lengths, 16, seed=1)) == batches
    s.set_epoch(1)
    assert list(s) != batches
    assert list(LengthGroupedBatchSampler(lengths, 16, seed=1, shuffle=False))[0] == \
        sorted(range(800), key=lambda i: -lengths[i])[:16]


def test_length_grouping_ranks_drop_last_and_resume():
    lengths = np.arange(1, 206)
    s = LengthGroupedBatchSampler(lengths, 8, group_batches=4, drop_last=True)
    assert all(len(b) == 8 for b in s) and len(list(s)) == len(s) == 25
    ranks = [LengthGroupedBatchSampler(lengths, 8, group_batches=4, world_size=3, rank=r)
             for r in range(3)]
    got = [list(r) for r in ranks]
    assert len({len(g) for g in got}) == 1 and len(got[0]) == len(ranks[0])
    flat = [i for g in got for b in g for i in b]
    assert len(flat) == len(set(flat))
    ranks[1].set_epoch(0, start=2)
    assert list(ranks[1]) == got[1][2:]
    with pytest.raises(ValueError, match="lengths"):
        LengthGroupedBatchSampler([], 8)
    with pytest.raises(ValueError, match="batch_size"):
        LengthGroupedBatchSampler([3, 4], 0)


def test_global_batches_ranks_partition_the_batch_and_resume_exactly():
    from minibert.data.sampler import GlobalBatches

    one = GlobalBatches(50, 8, seed=3)
    ranks = [GlobalBatches(50, 8, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(16):  # 7 batches per epoch (the last of 2): crosses two epochs
        epoch, whole = one.next()
        parts = [b.next() for b in ranks]
        assert [e for e, _ in parts] == [epoch, epoch]
        assert parts[0][1] + parts[1][1] == whole
    assert one.position() == {"epoch": 2, "consumed": 16}

    # An interrupted reader continues from its saved position with the same batches, also
    # from the end of an epoch whose last batch was small.
    ref = GlobalBatches(50, 8, seed=3)
    first = [ref.next() for _ in range(10)]
    for cut in (4, 7):
        resumed, interrupted = GlobalBatches(50, 8, seed=3), GlobalBatches(50, 8, seed=3)
        head = [interrupted.next() for _ in range(cut)]
        resumed.seek(**interrupted.position())
        assert head + [resumed.next() for _ in range(10 - cut)] == first
    # Every example of an epoch appears exactly once.
    epoch0 = [i for e, b in first if e == 0 for i in b]
    assert sorted(epoch0) == list(range(50))


@pytest.mark.parametrize("lengths", [None, "grouped"])
def test_every_example_is_trained_on_every_epoch(lengths):
    """39 examples at batch 8: four full batches and one of 7, in every epoch. (Length
    grouping used to drop the 7 shortest examples in every epoch, never training on them.)"""
    from minibert.data.sampler import GlobalBatches, batches_per_epoch

    sizes = list(range(1, 40)) if lengths else None  # example i has i + 1 tokens
    batches = GlobalBatches(39, 8, seed=0, lengths=sizes)
    assert batches_per_epoch(39, 8) == 5
    last_batches = []
    for epoch in range(3):
        seen = [batches.next() for _ in range(5)]
        assert {e for e, _ in seen} == {epoch}
        assert [len(b) for _, b in seen] == [8, 8, 8, 8, 7]  # the small one comes last
        assert sorted(i for _, b in seen for i in b) == list(range(39))
        last_batches.append(sorted(seen[-1][1]))
    if lengths is None:  # a plain shuffle: other examples in the small batch each epoch
        assert last_batches[0] != last_batches[1] != last_batches[2]
    else:  # one length group: the 7 shortest, sorted together
        assert last_batches[0] == list(range(7))


def test_a_last_batch_smaller_than_the_world_is_dropped_and_changes(caplog):
    """With 2 processes, 33 examples at batch 8 leave one example over: a process would have
    nothing to compute, so that example is dropped, logged, and another one each epoch."""
    from minibert.data.sampler import GlobalBatches, batches_per_epoch

    with caplog.at_level("WARNING", logger="minibert.data.sampler"):
        ranks = [GlobalBatches(33, 8, seed=0, rank=r, world_size=2) for r in range(2)]
    assert "1 example(s)" in caplog.text
    assert batches_per_epoch(33, 8, world_size=2) == 4
    dropped = []
    for epoch in range(3):
        seen = [i for _ in range(4) for r in ranks for i in r.next()[1]]
        assert len(seen) == len(set(seen)) == 32
        dropped.append(set(range(33)) - set(seen))
    assert len({min(d) for d in dropped}) > 1
    # 34 examples leave 2 over: one for each process, nothing dropped.
    assert batches_per_epoch(34, 8, world_size=2) == 5
    two = [GlobalBatches(34, 8, seed=0, rank=r, world_size=2) for r in range(2)]
    seen = [i for _ in range(5) for r in two for i in r.next()[1]]
    assert sorted(seen) == list(range(34))


def test_global_batches_refuse_bad_positions_and_small_sets():
    from minibert.data.sampler import GlobalBatches

    with raises(ValueError, "5 examples", "8"):
        GlobalBatches(5, 8)
    with raises(ValueError, "epoch 0", "consumed 3", "8"):
        GlobalBatches(50, 8).seek(0, 3)


def _task_of(index, sizes):
    return int(np.searchsorted(np.cumsum(sizes), index, side="right"))


def test_task_mixture_batches_are_one_task_and_ranks_partition_them():
    from minibert.data.sampler import TaskMixtureBatches

    sizes = [20, 45, 90]
    one = TaskMixtureBatches(sizes, 8, seed=4)
    ranks = [TaskMixtureBatches(sizes, 8, seed=4, rank=r, world_size=2) for r in range(2)]
    seen = {t: [] for t in range(3)}  # task -> its batches' (epoch, indices), in order
    for b in range(60):  # task 0 has 2 batches an epoch: several of its epochs go by
        epoch, whole = one.next()
        parts = [r.next() for r in ranks]
        assert [e for e, _ in parts] == [epoch, epoch]
        assert parts[0][1] + parts[1][1] == whole and len(whole) == 8
        tasks = {_task_of(i, sizes) for i in whole}
        assert tasks == {int(one.tasks_of(b, b + 1)[0])}  # one task, the drawn one
        seen[tasks.pop()].append((epoch, whole))
    for t, batches in seen.items():  # each task walks its own epochs, no example twice in one
        per_epoch = sizes[t] // 8
        assert [e for e, _ in batches] == [k // per_epoch for k in range(len(batches))]
        for e in {e for e, _ in batches}:
            idx = [i for ep, w in batches if ep == e for i in w]
            assert len(idx) == len(set(idx))
    assert one.position() == {"epoch": 0, "consumed": 480}


def test_task_mixture_resumes_exactly_and_draws_sqrt_proportionally():
    from minibert.data.sampler import TaskMixtureBatches

    sizes = [16, 64, 256, 1024]  # square roots 4 : 8 : 16 : 32
    ref = TaskMixtureBatches(sizes, 4, seed=7)
    first = [ref.next() for _ in range(300)]
    interrupted = TaskMixtureBatches(sizes, 4, seed=7)
    head = [interrupted.next() for _ in range(137)]
    resumed = TaskMixtureBatches(sizes, 4, seed=7)
    resumed.seek(**interrupted.position())
    assert head + [resumed.next() for _ in range(163)] == first
    assert TaskMixtureBatches(sizes, 4, seed=8).tasks_of(0, 300).tolist() != \
        ref.tasks_of(0, 300).tolist()
    # The draws are a pure function of (seed, batch): any window equals the whole's slice.
    many = ref.tasks_of(0, 40_000)
    assert ref.tasks_of(1500, 2600).tolist() == many[1500:2600].tolist()
    freq = np.bincount(many, minlength=4) / len(many)
    want = np.sqrt(sizes) / np.sqrt(sizes).sum()  # 1/15, 2/15, 4/15, 8/15
    assert np.abs(freq - want).max() < 0.01
    assert np.abs(freq - np.asarray(sizes) / sum(sizes)).max() > 0.1  # not proportional
    with raises(ValueError, "epoch 1", "task mixture"):
        resumed.seek(1, 0)
    with raises(ValueError, "tiny", "3 examples", "4"):

        TaskMixtureBatches([3, 50], 4, task_names=["tiny", "big"])
