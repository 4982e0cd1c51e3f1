"""Which examples go in which batch, on which rank: deterministic, shardable, resumable.

* `ShardedSampler` (pretraining): one shuffle of all examples per epoch,
  drawn from (seed, epoch). The shuffled order is cut into *global* batches of
  `global_batch_size` examples, and rank `r` of `W` receives the `r`-th
  contiguous slice of each. The union over ranks of one global batch is therefore
  the same set of examples whatever `W` is; with `MLMCollator`
  keying its masks on the example index, the global batch is identical too.
  Resuming at global position `k` only slices the permutation: skipped
  examples are never read.
* `LengthGroupedBatchSampler` (fine-tuning): batches of examples of
  similar length, so dynamic padding has little to add. Examples are shuffled,
  cut into groups of `batch_size * group_batches`, sorted by length inside each
  group and batched; the batch order is shuffled again so training does not go
  from short to long.
* `GlobalBatches` (the training loop's batch order) and `TaskMixtureBatches`
  (multi-task fine-tuning: each batch one task's, tasks drawn by the square root of their
  size): whole global batches from a saved position, with `next`/`position`/`seek`.

Kept apart from `mlm.py` because neither sampler knows anything about masking.
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


class ShardedSampler(torch.utils.data.Sampler):
    """Per-epoch shuffled indices, this rank's slice of every global batch.

    Args:
        num_examples: size of the dataset.
        global_batch_size: examples per optimizer step over all ranks
            (`world_size * grad_accum * micro_batch`); a multiple of `world_size`.
        rank, world_size: this process and the number of processes.
        seed: fixes the shuffle of every epoch.
        shuffle: `False` keeps the dataset order (evaluation).
        drop_last: drop the final partial global batch (default). If `False` it
            is split as evenly as possible, and some ranks may get one example fewer.

    Use it as a DataLoader `sampler` with `batch_size` = micro-batch size:
    rank `r` yields `global_batch_size // world_size` indices per global batch.
    Call `set_epoch` before each epoch, with `start` when resuming.
    """

    def __init__(self, num_examples: int, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True) -> None:
        if num_examples < 1:
            raise ValueError(f"num_examples={num_examples} must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        if global_batch_size < 1 or global_batch_size % world_size:
            raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple "
                             f"of world_size={world_size}")
        if drop_last and num_examples < global_batch_size:
            raise ValueError(f"{num_examples} examples are fewer than one global batch of "
                             f"{global_batch_size}; lower the batch size or pass drop_last=False")
        self.num_examples, self.global_batch_size = num_examples, global_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch, and the global position in it to start from (resume).

        `start` counts examples consumed by all ranks together in this epoch. With
        several ranks it must fall on a global-batch boundary, since the examples a
        rank had already consumed inside a global batch are not known here.
        """
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
        order, G, W = self.order(), self.global_batch_size, self.world_size
        stop = self._stop()
        if W == 1:
            yield from order[self.start:stop].tolist()
            return
        share = G // W
        for b0 in range(self.start, stop, G):
            batch = order[b0:min(b0 + G, stop)]
            if len(batch) == G:
                yield from batch[self.rank * share:(self.rank + 1) * share].tolist()
            else:  # the final partial batch when drop_last=False
                yield from np.array_split(batch, W)[self.rank].tolist()

    def __len__(self) -> int:
        remaining = self._stop() - self.start
        if self.world_size == 1:
            return remaining
        full, rest = divmod(remaining, self.global_batch_size)
        share = self.global_batch_size // self.world_size
        last = len(np.array_split(np.arange(rest), self.world_size)[self.rank]) if rest else 0
        return full * share + last


class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches of indices whose examples have similar lengths (a DataLoader `batch_sampler`).

    Args:
        lengths: token count of every example.
        batch_size: examples per batch on each rank.
        group_batches: how many batches are sorted together; larger groups pad
            less but are less random.
        seed, shuffle: as for `ShardedSampler`.
        drop_last: drop the short batches left at the end of each group.
        rank, world_size: rank `r` takes batches `r, r + W, ...`; every rank
            gets the same number of batches (extra batches are dropped).

    The batch holding the longest example is put first, so an out-of-memory
    error shows up in the first step rather than hours in.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, *, group_batches: int = 50,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False, rank: int = 0,
                 world_size: int = 1) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1 or len(self.lengths) == 0:
            raise ValueError("lengths must be a non-empty 1-D sequence of example lengths")
        if batch_size < 1 or group_batches < 1:
            raise ValueError(f"batch_size={batch_size} and group_batches={group_batches} "
                             f"must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
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
        group = self.batch_size * self.group_batches
        batches = []
        for g0 in range(0, n, group):
            chunk = order[g0:g0 + group]
            # stable sort keeps the shuffled order among equal lengths
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            for b0 in range(0, len(chunk), self.batch_size):
                b = chunk[b0:b0 + self.batch_size]
                if len(b) == self.batch_size or not self.drop_last:
                    batches.append(b.tolist())
        if self.shuffle and batches:
            perm = rng.permutation(len(batches))
            batches = [batches[i] for i in perm]
            longest = max(range(len(batches)), key=lambda i: self.lengths[batches[i]].max())
            batches.insert(0, batches.pop(longest))
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        per_rank = len(batches) // self.world_size
        mine = batches[self.rank:per_rank * self.world_size:self.world_size]
        yield from mine[self.start:]

    def __len__(self) -> int:
        # number of batches does not depend on the shuffle
        n = len(self.lengths)
        group = self.batch_size * self.group_batches
        full, rest = divmod(n, group)
        per_group = self.group_batches
        count = full * per_group
        if rest:
            count += rest // self.batch_size + (0 if self.drop_last or rest % self.batch_size == 0
                                                else 1)
        return max(0, count // self.world_size - self.start)


class GlobalBatches:
    """The run's global batches in order, from a saved position: the training loop's data.

    Epoch `e` is cut into global batches of `batch_size` example indices, by a plain shuffle
    (packed pretraining blocks) or, given `lengths`, by length groups (fine-tuning: the
    shuffled examples are cut into groups of `group_batches` batches, each group is sorted by
    length, and the sorted groups are cut into batches, so a batch pads little). Every
    example is used once per epoch: when `batch_size` does not divide the number of
    examples, the epoch's last batch is smaller, and the engine's weights keep its gradient
    exact (`engine.micro_step_weight`). Only a last batch with fewer examples than processes
    is dropped, since a process with nothing to compute cannot take part in the step; the
    shuffle changes it every epoch, and it is logged. Both orders are functions of
    (seed, epoch) alone, so the position is two integers:

        epoch      the epoch the next batch comes from
        consumed   examples of that epoch already used, over all ranks

    `next()` returns this rank's contiguous slice of the next global batch and moves the
    position; `position()` is what a checkpoint stores and `seek()` what resuming restores.
    The union of the slices over ranks is the whole global batch whatever the number of
    ranks, which is what makes a run with W processes compute what one process computes.
    """

    def __init__(self, num_examples: int, batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, lengths: Sequence[int] | None = None,
                 group_batches: int = 50) -> None:
        if batch_size < 1 or batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of "
                             f"world_size={world_size}")
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
            if self.lengths is not None:  # sort each group by length, longest first
                group = B * self.group_batches
                order = np.concatenate([
                    chunk[np.argsort(-self.lengths[chunk], kind="stable")]
                    for chunk in (order[g:g + group] for g in range(0, len(order), group))])
            order = order[:self.examples_per_epoch()]
            batches = [order[b:b + B] for b in range(0, len(order), B)]
            last = [batches.pop()] if len(batches[-1]) < B else []
            if self.lengths is not None:
                # Shuffle the full batches, so training does not go from long to short; the
                # longest goes first, so an out-of-memory error shows at the first step.
                batches = [batches[i] for i in rng.permutation(len(batches))]
                longest = max(range(len(batches)), key=lambda i: self.lengths[batches[i]].max())
                batches.insert(0, batches.pop(longest))
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
    """Global batches for several tasks at once, each batch all from one task: the batch
    order of multi-task fine-tuning, with `GlobalBatches`' protocol (`next`, `position`,
    `seek`).

    The dataset is the tasks' examples one after another: task `t` holds the indices
    `sum(sizes[:t]) ... sum(sizes[:t + 1]) - 1`. Batch `b` belongs to task `t` with
    probability proportional to `sqrt(sizes[t])`. Sampling in proportion to size would
    starve the small tasks (a task with 1% of the examples gets 1% of the steps and is
    barely trained); sampling tasks uniformly would revisit a small task's few examples
    epoch after epoch and overfit it while the large ones are undertrained. The square
    root is the usual compromise between the two: it is temperature-scaled mixing with
    T = 2, r_t ∝ size_t^(1/T) (Raffel et al. 2020, the T5 paper, section 3.5.2; Arivazhagan
    et al. 2019 for multilingual translation).

    The draw is a pure function of (seed, b): the uniform number of batch `b` is entry
    `b % 1024` of the stream keyed by (seed, b // 1024), so draws come in blocks and
    `seek` counts a million batches' tasks in milliseconds. Within a task, examples come
    from that task's own shuffle, one per *task epoch*, keyed by (seed, task, epoch), cut
    into batches of `batch_size` (the last partial batch dropped, as in `GlobalBatches`);
    a task starts its next epoch when its batches run out, independently of the others.
    Rank `r` of `W` receives the `r`-th contiguous slice of each global batch.

    Position: the mixture has no global epoch (each task has its own), so `position()` is
    always `{"epoch": 0, "consumed": batches drawn * batch_size}`, and `seek` rebuilds
    every task's epoch and place by counting the tasks of the batches already drawn.
    `next()` returns the epoch of the batch's own task.
    """

    BLOCK = 1024  # draws per random stream; any fixed value gives a pure function of (seed, b)

    def __init__(self, sizes: Sequence[int], batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, task_names: Sequence[str] | None = None) -> None:
        self.names = [str(n) for n in task_names] if task_names is not None else \
            [f"task {t}" for t in range(len(sizes))]
        if len(sizes) == 0 or len(self.names) != len(sizes):
            raise ValueError(f"need one size per task, got sizes={list(sizes)} for tasks "
                             f"{self.names}")
        if batch_size < 1 or batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of "
                             f"world_size={world_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
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
    the last batch smaller when `batch_size` does not divide `num_examples`, except a last
    batch with fewer examples than processes, which is dropped (see `GlobalBatches`)."""
    full, rest = divmod(num_examples, batch_size)
    return full + (1 if rest >= world_size else 0)
