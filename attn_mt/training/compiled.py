"""What runs a training step's forward and backward: the model eager, or under torch.compile.

`train.compile` compiles it (inductor: fused element-wise kernels); with `train.cuda_graphs` on
CUDA in the "reduce-overhead" mode, which replays each shape's kernels as one CUDA graph
(`StepMarked`), so a small model's step is not bound by kernel launches. Shapes: torch compiles
for the first batch's shape, and on the second shape once more for any shape (its automatic
dynamic shapes), so a run compiles at most twice; CUDA graphs are recorded once per shape, and
`train.length_buckets` keeps those to one per bucket (arrays.to_bucket). Evaluation and decoding
stay eager.

The step itself is trainer.py's.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from attn_mt.config import TrainConfig

log = logging.getLogger(__name__)


def compile_options(cfg: TrainConfig, device: torch.device) -> dict | None:
    """torch.compile's keyword arguments for this config and device, or None: eager."""
    if not cfg.compile:
        return None
    return {"mode": "reduce-overhead"} if cfg.cuda_graphs and device.type == "cuda" else {}


def compiled(net: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """`net` compiled as the config asks (`compile_options`), or `net` itself."""
    options = compile_options(cfg, device)
    if options is None:
        return net
    log.info("training forward/backward under torch.compile(%s)",
             ", ".join(f"{k}={v!r}" for k, v in options.items()))
    if options.get("mode") == "reduce-overhead":
        return StepMarked(torch.compile(net, **options))
    return torch.compile(net, **options)


class StepMarked(nn.Module):
    """A net replayed as CUDA graphs, each call first marking a new step: the last replay's outputs
    are no longer needed (torch.compiler.cudagraph_mark_step_begin)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return self.net(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Under DistributedDataParallel: its gradients not all-reduced in the block."""
        return self.net.no_sync()
