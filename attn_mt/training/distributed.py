"""Several processes, one training run: torch.distributed under torchrun.

`torchrun --nproc-per-node N -m attn_mt train ...` starts N copies of the trainer with RANK,
WORLD_SIZE and LOCAL_RANK in the environment. Every rank builds the same token batches from the
seed and takes its own slice of each one (`shard`); DistributedDataParallel all-reduces the
gradients; rank 0 alone evaluates, writes files and draws the progress bar. Without torchrun
the world is one process and every function here is a no-op.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.size > 1


def init(device: torch.device) -> tuple[World, torch.device]:
    """Join the process group torchrun set up (nccl on CUDA, gloo on CPU); returns (world, device). Only rank 0
    logs below warnings."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(), device
    world = World(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0")))
    if not world.main:
        logging.getLogger("attn_mt").setLevel(logging.WARNING)  # rank 0 reports
    if device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # the others wait while rank 0 evaluates; ATTN_MT_DIST_TIMEOUT_S overrides the 30 minutes
        timeout = float(os.environ.get("ATTN_MT_DIST_TIMEOUT_S", 1800))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout))
    return world, device


def shard(batch: list[int], world: World) -> tuple[list[int], float]:
    """This rank's sentences of a global batch, and the weight of its loss (0 for a stand-in).

    A batch with fewer sentences than ranks gives some ranks a zero-weight stand-in sentence,
    so that every rank still takes part in the gradient all-reduce.
    """
    mine = batch[world.rank :: world.size]
    return (mine, 1.0) if mine else (batch[:1], 0.0)


def all_sum(x: torch.Tensor, world: World) -> torch.Tensor:
    """Sum a tensor over ranks (in place); identity for one process."""
    if world.enabled:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def broadcast(obj, world: World):
    """Rank 0's value of a picklable object, on every rank."""
    if not world.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj, world: World) -> list:
    """Every rank's value of a picklable object, on every rank, in rank order."""
    if not world.enabled:
        return [obj]
    out = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def close(world: World) -> None:
    if world.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.enabled:
        dist.barrier()
