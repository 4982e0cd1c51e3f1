"""Which examples go in which batch, on which rank: deterministic, shardable, resumable.

* `GlobalBatches` (the training loop's order): one shuffle per epoch from (seed, epoch), cut
  into global batches; rank `r` of `W` takes the `r`-th slice of each, so a global batch is
  the same examples whatever `W` is (docs/walkthrough.md, "6.5 Which examples, on which
  rank"); its position is saved and restored with `position`/`seek`. Given `lengths`, it
  groups similar lengths into a batch (fine-tuning).
* `TaskMixtureBatches` (multi-task): whole global batches, each one task's, with the same
  `next`/`position`/`seek`.
* `ShardedSampler` and `LengthGroupedBatchSampler`: torch `Sampler`s of the same two kinds,
  for a `DataLoader` loop of one's own.
"""
from __future__ import annotations

import logging
from typing import Iterator, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)


def _epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    # SeedSequence mixes the pair; consecutive epochs give unrelated shuffles.
    return np.random.default_rng([int(seed) % 2**63, int(epoch)])


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")


def _check_batch_size(batch_size: int, world_size: int, name: str = "batch_size") -> None:
    if batch_size < 1 or batch_size % world_size:
        raise ValueError(f"{name}={batch_size} must be a positive multiple of "
                         f"world_size={world_size}")


def _sorted_groups(order: np.ndarray, lengths: np.ndarray, group: int) -> list[np.ndarray]:
    """`order` cut into groups of `group`, each sorted longest first (a stable sort keeps
    the shuffled order among equal lengths)."""
    return [chunk[np.argsort(-lengths[chunk], kind="stable")]
            for chunk in (order[g:g + group] for g in range(0, len(order), group))]


def _longest_first(batches: list, lengths: np.ndarray, rng: np.random.Generator) -> list:
    """`batches` shuffled, so training does not go from long to short, then the one holding
    the longest example moved first, so an out-of-memory error shows at the first step."""
    batches = [batches[i] for i in rng.permutation(len(batches))]
    longest = max(range(len(batches)), key=lambda i: lengths[batches[i]].max())
    batches.insert(0, batches.pop(longest))
    return batches


class ShardedSampler(torch.utils.data.Sampler):
    """Per-epoch shuffled indices, this rank's slice of every global batch: a DataLoader
    `sampler` (with `batch_size` the micro-batch); call `set_epoch` before each epoch.
    global_batch_size: examples per optimizer step over all ranks, a multiple of
        `world_size`. shuffle: False keeps the dataset order (evaluation).
    drop_last: drop the final partial global batch; else it is split as evenly as possible."""

    def __init__(self, num_examples: int, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True) -> None:
        if num_examples < 1:
            raise ValueError(f"num_examples={num_examples} must be >= 1")
        _check_rank(rank, world_size)
        _check_batch_size(global_batch_size, world_size, "global_batch_size")
        if drop_last and num_examples < global_batch_size:
            raise ValueError(f"{num_examples} examples are fewer than one global batch of "
                             f"{global_batch_size}; lower the batch size or pass drop_last=False")
        self.num_examples, self.global_batch_size = num_examples, global_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch, and `start`, the examples all ranks consumed in it (resume): with
        several ranks a whole number of global batches."""
        stop = self._stop()
        if not 0 <= start <= stop:
            raise ValueError(f"start={start} must lie in [0, {stop}] for this epoch")
        if self.world_size > 1 and start % self.global_batch_size:
            raise ValueError(f"start={start} must be a multiple of global_batch_size="
                             f"{self.global_batch_size} when world_size > 1")
        self.epoch, self.start = int(epoch), int(start)

    def _stop(self) -> int:
        G = self.global_batch_size
        return (self.num_examples // G) * G if self.drop_last else self.num_examples

    def order(self) -> np.ndarray:
        """The epoch's global order of example indices, `(num_examples,)` int64."""
        if not self.shuffle:
            return np.arange(self.num_examples, dtype=np.int64)
        return _epoch_rng(self.seed, self.epoch).permutation(self.num_examples)

    def __iter__(self) -> Iterator[int]:
        order, G, W, stop = self.order(), self.global_batch_size, self.world_size, self._stop()
        share = G // W
        for b0 in range(self.start, stop, G):
            batch = order[b0:min(b0 + G, stop)]
            if len(batch) == G:
                yield from batch[self.rank * share:(self.rank + 1) * share].tolist()
            else:  # the final partial batch when drop_last=False
                yield from np.array_split(batch, W)[self.rank].tolist()

    def __len__(self) -> int:
        full, rest = divmod(self._stop() - self.start, self.global_batch_size)
        share = self.global_batch_size // self.world_size
        last = len(np.array_split(np.arange(rest), self.world_size)[self.rank]) if rest else 0
        return full * share + last


class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches of indices whose examples have similar lengths (a DataLoader `batch_sampler`): the
    shuffled examples are cut into groups of `group_batches` batches (larger groups pad less but are
    less random), each sorted by length and batched (`drop_last`: drop each group's short batch).
    Rank `r` takes batches `r, r + W, ...`, every rank as many."""

    def __init__(self, lengths: Sequence[int], batch_size: int, *, group_batches: int = 50,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False, rank: int = 0,
                 world_size: int = 1) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1 or len(self.lengths) == 0:
            raise ValueError("lengths must be a non-empty 1-D sequence of example lengths")
        if batch_size < 1 or group_batches < 1:
            raise ValueError(f"batch_size={batch_size} and group_batches={group_batches} "
                             f"must be >= 1")
        _check_rank(rank, world_size)
        self.batch_size, self.group_batches = batch_size, group_batches
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch; `start` skips that many of this rank's batches (resume)."""
        self.epoch, self.start = int(epoch), int(start)

    def batches(self) -> list[list[int]]:
        """All batches of the epoch, over all ranks, in order."""
        rng = _epoch_rng(self.seed, self.epoch)
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        batches = []
        for chunk in _sorted_groups(order, self.lengths, self.batch_size * self.group_batches):
            for b0 in range(0, len(chunk), self.batch_size):
                b = chunk[b0:b0 + self.batch_size]
                if len(b) == self.batch_size or not self.drop_last:
                    batches.append(b.tolist())
        if self.shuffle and batches:
            batches = _longest_first(batches, self.lengths, rng)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        per_rank = len(batches) // self.world_size
        yield from batches[self.rank:per_rank * self.world_size:self.world_size][self.start:]

    def __len__(self) -> int:  # the number of batches does not depend on the shuffle
        full, rest = divmod(len(self.lengths), self.batch_size * self.group_batches)
        tail = rest // self.batch_size if self.drop_last else -(-rest // self.batch_size)
        return max(0, (full * self.group_batches + tail) // self.world_size - self.start)


class GlobalBatches:
    """The run's global batches in order, from a saved position: the training loop's data. Each
    epoch is cut into global batches by a shuffle or, given `lengths`, length groups. Every example
    is used once per epoch (the last batch may be smaller: the engine's `micro_step_weight` keeps
    its gradient exact), but a last batch smaller than the world. The position is `epoch` and
    `consumed` (its examples used, over all ranks): `next()` gives this rank's slice of the next
    batch, `position()` and `seek()` save and restore."""

    def __init__(self, num_examples: int, batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, lengths: Sequence[int] | None = None,
                 group_batches: int = 50) -> None:
        _check_batch_size(batch_size, world_size)
        if num_examples < batch_size:
            raise ValueError(f"the training set has {num_examples} examples, fewer than one "
                             f"batch of {batch_size}; lower the batch size")
        if lengths is not None and len(lengths) != num_examples:
            raise ValueError(f"lengths has {len(lengths)} entries for {num_examples} examples")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.rank, self.world_size, self.group_batches = rank, world_size, group_batches
        self.lengths = None if lengths is None else np.asarray(lengths, dtype=np.int64)
        self.epoch, self.consumed = 0, 0
        self._cached: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches)
        dropped = num_examples - self.examples_per_epoch()
        if dropped and rank == 0:
            logger.warning("each epoch's last batch would hold %d example(s), fewer than the "
                           "%d processes: it is dropped (other examples each epoch)", dropped,
                           world_size)

    def examples_per_epoch(self) -> int:
        """Examples one epoch uses: all of them, but a last batch smaller than the world."""
        full, rest = divmod(self.num_examples, self.batch_size)
        return self.num_examples if rest >= self.world_size else full * self.batch_size

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """All global batches of `epoch` in order, each `(batch_size,)` example indices but
        the last, which may be smaller (and comes last, so positions stay whole batches)."""
        if self._cached is None or self._cached[0] != epoch:
            B, rng = self.batch_size, _epoch_rng(self.seed, epoch)
            order = rng.permutation(self.num_examples)
            if self.lengths is not None:
                order = np.concatenate(_sorted_groups(order, self.lengths, B * self.group_batches))
            order = order[:self.examples_per_epoch()]
            batches = [order[b:b + B] for b in range(0, len(order), B)]
            last = [batches.pop()] if len(batches[-1]) < B else []
            if self.lengths is not None:  # the full batches only
                batches = _longest_first(batches, self.lengths, rng)
            self._cached = (epoch, batches + last)
        return self._cached[1]

    def next(self) -> tuple[int, list[int]]:
        """(epoch, this rank's example indices) of the next global batch; moves the position."""
        if self.consumed >= self.examples_per_epoch():  # the epoch is used up
            self.epoch, self.consumed = self.epoch + 1, 0
        batch = self.epoch_batches(self.epoch)[self.consumed // self.batch_size]
        # This rank's contiguous slice; a smaller last batch is split as evenly as it goes.
        mine = np.array_split(batch, self.world_size)[self.rank]
        self.consumed += len(batch)
        return self.epoch, mine.tolist()

    def position(self) -> dict[str, int]:
        """Where the next batch comes from: `{"epoch", "consumed"}`, for a checkpoint."""
        return {"epoch": self.epoch, "consumed": self.consumed}

    def seek(self, epoch: int, consumed: int) -> None:
        """Continue from a saved `position()`."""
        if epoch < 0 or consumed < 0 or (consumed % self.batch_size and
                                         consumed != self.examples_per_epoch()):
            raise ValueError(f"position (epoch {epoch}, consumed {consumed}) is not a "
                             f"whole number of batches of {self.batch_size} into an epoch")
        self.epoch, self.consumed = int(epoch), int(consumed)


class TaskMixtureBatches:
    """Global batches for several tasks, each batch all one task's: multi-task fine-tuning's order,
    with `GlobalBatches`' protocol (`next`, `position`, `seek`). Task `t` holds the indices
    `sum(sizes[:t]) ... sum(sizes[:t + 1]) - 1`; a batch is its with probability ∝ `sqrt(sizes[t])`,
    temperature-scaled mixing with T = 2 (Raffel et al. 2020, T5, section 3.5.2; docs/multitask.md).
    Batch `b`'s task is drawn from a stream keyed by (seed, b // BLOCK), each task's shuffle per
    epoch by (seed, task, epoch); `position()` is always epoch 0 and the examples drawn, and
    `next()` returns the epoch of the batch's own task."""
    BLOCK = 1024  # draws per random stream; any fixed value gives a pure function of (seed, b)

    def __init__(self, sizes: Sequence[int], batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, task_names: Sequence[str] | None = None) -> None:
        self.names = [str(n) for n in task_names] if task_names is not None else \
            [f"task {t}" for t in range(len(sizes))]
        if len(sizes) == 0 or len(self.names) != len(sizes):
            raise ValueError(f"need one size per task, got sizes={list(sizes)} for tasks "
                             f"{self.names}")
        _check_batch_size(batch_size, world_size)
        _check_rank(rank, world_size)
        for name, n in zip(self.names, sizes):
            if n < batch_size:
                raise ValueError(f"{name} has {n} examples, fewer than one batch of "
                                 f"{batch_size}; lower the batch size")
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])  # first index of each
        self.per_epoch = self.sizes // batch_size  # full batches in one epoch of each task
        weights = np.sqrt(self.sizes.astype(np.float64))
        self.probabilities = weights / weights.sum()
        self._edges = np.cumsum(self.probabilities)  # a uniform u falls in task searchsorted(u)
        self._edges[-1] = 1.0  # no u in [0, 1) may fall past the last task by rounding
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.done = 0  # global batches drawn so far
        self.drawn = np.zeros(len(sizes), dtype=np.int64)  # of them, each task's
        self._orders: dict[int, tuple[int, np.ndarray]] = {}  # task -> (epoch, its shuffle)
        self._cached_block: tuple[int, np.ndarray] | None = None  # (block, its tasks)

    def tasks_of(self, start: int, stop: int) -> np.ndarray:
        """The task of each global batch `start ... stop - 1`, `(stop - start,)` int64."""
        B = self.BLOCK
        blocks = [self._block(k) for k in range(start // B, -(-stop // B))]
        tasks = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
        return tasks[start % B:][:stop - start]

    def _block(self, k: int) -> np.ndarray:
        """The tasks of batches `k * BLOCK ... (k + 1) * BLOCK - 1` (the last block cached)."""
        if self._cached_block is None or self._cached_block[0] != k:
            u = np.random.default_rng([int(self.seed) % 2**63, 0, int(k)]).random(self.BLOCK)
            tasks = np.searchsorted(self._edges, u, side="right").astype(np.int64)
            self._cached_block = (k, tasks)
        return self._cached_block[1]

    def task_order(self, task: int, epoch: int) -> np.ndarray:
        """Task `task`'s shuffle in its epoch `epoch`: `(sizes[task],)` dataset indices."""
        cached = self._orders.get(task)
        if cached is None or cached[0] != epoch:
            rng = np.random.default_rng([int(self.seed) % 2**63, 1, int(task), int(epoch)])
            cached = (epoch, self.offsets[task] + rng.permutation(int(self.sizes[task])))
            self._orders[task] = cached
        return cached[1]

    def next(self) -> tuple[int, list[int]]:
        """(the task's epoch, this rank's example indices) of the next global batch."""
        t = int(self.tasks_of(self.done, self.done + 1)[0])
        epoch, b = divmod(int(self.drawn[t]), int(self.per_epoch[t]))
        batch = self.task_order(t, epoch)[b * self.batch_size:(b + 1) * self.batch_size]
        share = self.batch_size // self.world_size
        mine = batch[self.rank * share:(self.rank + 1) * share]  # this rank's slice
        self.done += 1
        self.drawn[t] += 1
        return epoch, mine.tolist()

    def position(self) -> dict[str, int]:
        """`{"epoch": 0, "consumed": examples drawn over all ranks}` (no global epochs)."""
        return {"epoch": 0, "consumed": self.done * self.batch_size}

    def seek(self, epoch: int, consumed: int) -> None:
        """Continue from a saved `position()`: replay the draws to rebuild each task's place."""
        if epoch != 0 or consumed < 0 or consumed % self.batch_size:
            raise ValueError(f"position (epoch {epoch}, consumed {consumed}) is not one of a "
                             f"task mixture: epoch 0 and whole batches of {self.batch_size}")
        self.done = consumed // self.batch_size
        self.drawn = np.bincount(self.tasks_of(0, self.done), minlength=len(self.sizes))


def batches_per_epoch(num_examples: int, batch_size: int, world_size: int = 1) -> int:
    """Global batches (optimizer steps) in one epoch of `GlobalBatches`: every example once,
    but a last batch with fewer examples than processes, which is dropped."""
    full, rest = divmod(num_examples, batch_size)
    return full + (1 if rest >= world_size else 0)
