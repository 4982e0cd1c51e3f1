"""Data-parallel training under torchrun: process group, device, and the few collectives we use.
`init_distributed` reads torchrun's RANK, LOCAL_RANK and WORLD_SIZE and joins the process group
(NCCL on CUDA, gloo on CPU). Every rank computes, only rank 0 logs and writes, barriers
surround checkpoints, and `unwrap` alone strips DDP and `torch.compile` wrappers.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """"auto" -> this rank's CUDA device when there is one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device "
                             f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        return torch.device("cuda", local_rank)
    if device != "cpu":
        raise ValueError(f"device={device!r}: choose auto, cpu or cuda")
    return torch.device("cpu")


def init_distributed(device: str = "auto") -> DistContext:
    """Join the torchrun process group if there is one; return this process's context."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        logger.info("rank %d of %d on %s", rank, world_size, dev)
    return DistContext(rank, local_rank, world_size, dev)


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum a tensor over all ranks (in place; a no-op in a single process)."""
    if ctx.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def max_over_ranks(x: int, ctx: DistContext) -> int:
    """The largest of every rank's `x` (`x` itself in one process, with no device tensor)."""
    if not ctx.distributed:
        return x
    t = torch.tensor(x, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's `obj`, in rank order (pickled over the process group)."""
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def cleanup(ctx: DistContext, wait: bool = False) -> None:
    """Leave the process group. `wait` (after a run that succeeded, never after an error):
    first wait for every rank, so none tears the group down while another uses it."""
    if ctx.distributed and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel and `torch.compile` wrappers, nested in any order,
    whose `state_dict` keys are its own (never `module.` or `_orig_mod.`): no key is renamed."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # OptimizedModule
            model = model._orig_mod
        else:
            return model
