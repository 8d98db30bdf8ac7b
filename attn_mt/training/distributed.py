"""Several processes, one training run: torch.distributed under torchrun.

`torchrun --nproc-per-node N -m attn_mt train ...` starts N copies of the trainer with RANK,
WORLD_SIZE and LOCAL_RANK in the environment. Every rank builds the same token batches from the
seed and takes its own slice of each one (`Ranks.shard`); DistributedDataParallel all-reduces the
gradients; rank 0 alone evaluates, writes files and draws the progress bar. The run loads this
module only under torchrun (start.py's `join`); one process is variants.py's `World`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from attn_mt.training.variants import World

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks(World):
    """This process's place among the torchrun ranks; its collectives go through the process
    group."""

    def shard(self, batch: list[int]) -> tuple[list[int], float]:
        """This rank's sentences of a global batch, and the weight of its loss (0 for a stand-in).

        A batch with fewer sentences than ranks gives some ranks a zero-weight stand-in sentence,
        so that every rank still takes part in the gradient all-reduce.
        """
        mine = batch[self.rank :: self.size]
        return (mine, 1.0) if mine else (batch[:1], 0.0)

    def accumulating(self, net: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """DistributedDataParallel all-reduces the gradients once, after the `last` batch of a step
        (`no_sync` before it)."""
        return contextlib.nullcontext() if last else net.no_sync()

    def agree(self, loss: torch.Tensor, interrupted: bool, elapsed: float
              ) -> tuple[torch.Tensor, bool, float]:
        """One small all-reduce: the global loss, any rank's Ctrl-C, rank 0's clock."""
        flags = torch.tensor([float(interrupted), elapsed if self.main else 0.0],
                             device=loss.device)
        sync = self.all_sum(torch.cat([loss.float().view(1), flags]))
        return sync[0], bool(sync[1] > 0), float(sync[2])

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks (in place)."""
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def broadcast(self, obj: T) -> T:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        """Past the last collective. The trainer's DistributedDataParallel wrapper is freed before
        (finish.py's `wind_up`): it holds the process group, whose gloo threads, left to the
        interpreter's exit, can abort the process (a rank once exited with SIGABRT after a finished
        run)."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def init(device: torch.device) -> tuple[Ranks, torch.device]:
    """Join the process group torchrun set up (nccl on CUDA, gloo on CPU); returns (ranks, device).
    Only rank 0 logs below warnings."""
    world = Ranks(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                  int(os.environ.get("LOCAL_RANK", "0")))
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
