"""The training step's parts, each chosen once from the config: the plain part here, its variant
in a module of its own, loaded only where the config asks for it.

- the processes (`World`: one; training/distributed.py's `Ranks` under torchrun, start.py's
  `join` chooses) and the net that runs forward and backward (`build_net`: the model, wrapped
  for several processes or compiled);
- the optimizer (`make_optimizer`: AdamW, or training/muon.py's Muon for the weight matrices),
  fp16's gradient scaler (`make_scaler`) and the weights' moving average (`make_ema`, ema.py);
- guided alignment's loss term (`make_guide`: none, or training/guided.py's `GuidedLoss`) and
  the links its batches carry (`make_collate`);
- the non-finite checks (`make_checks`: checks.py's `HostChecks` read every step; deferred.py
  keeps them on the device);
- how a step's batches are made (`make_collate`: pinned on a GPU, padded to static shapes with
  train.length_buckets) and when (`make_feed`: in place, or ahead in a thread on a GPU).

Tested in tests/training/test_trainer.py, test_distributed.py, test_compiled.py and test_ema.py.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from attn_mt.config import ExperimentConfig, TrainConfig
from attn_mt.data.arrays import to_bucket
from attn_mt.data.batching import Batch
from attn_mt.data.corpus import Corpus
from attn_mt.models import build_model
from attn_mt.training.checks import HostChecks
from attn_mt.training.schedule import lr_at

if TYPE_CHECKING:
    from attn_mt.data.prefetch import Prefetcher
    from attn_mt.training.deferred import DeviceChecks
    from attn_mt.training.ema import WeightEMA

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class World:
    """The processes that train together: this one alone (under torchrun several: distributed.py's
    `Ranks`, whose methods talk to the others). For one process every collective is the identity."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: it evaluates, writes the files and reports."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def shard(self, batch: list[int]) -> tuple[list[int], float]:
        """This process's sentences of a global batch, and the weight of its loss."""
        return batch, 1.0

    def accumulating(self, net: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """A block for one batch's backward pass: with several processes the gradients are
        all-reduced only after the `last` batch of a step."""
        return contextlib.nullcontext()

    def agree(self, loss: torch.Tensor, interrupted: bool, elapsed: float
              ) -> tuple[torch.Tensor, bool, float]:
        """The step's summed loss over the processes, any one's Ctrl-C and rank 0's clock."""
        return loss, interrupted, elapsed

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """A tensor summed over the processes."""
        return x

    def broadcast(self, obj: T) -> T:
        """Rank 0's value of a picklable object."""
        return obj

    def gather(self, obj: T) -> list[T]:
        """Every process's value of a picklable object, in rank order."""
        return [obj]

    def barrier(self) -> None:
        """Wait until every process is here."""

    def close(self) -> None:
        """Leave the process group, past the last collective."""


def build_net(cfg: ExperimentConfig, corpus: Corpus, init: dict | None, world: World,
              device: torch.device) -> tuple[nn.Module, nn.Module]:
    """(the model on `device`: seeded, started from `init` when fine-tuning a fresh run,
    train.freeze applied; what runs its training forward/backward: under torchrun
    DistributedDataParallel, compiled if asked)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, **corpus.tok.sizes())
    if tc.freeze or init is not None:
        from attn_mt.training import finetune

        finetune.freeze(model, tc.freeze)
        if init is not None:
            finetune.start_from(model, init, tc.init_from)
    model = net = model.to(device)
    if world.enabled:
        torch.manual_seed(tc.seed + world.rank)  # same initial weights, different dropout per rank
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        log.info("%d processes; train.batch_tokens=%d is the global batch", world.size,
                 tc.batch_tokens)
    if tc.compile:  # the training forward/backward only: evaluation and decoding stay eager
        from attn_mt.training.compiled import compiled

        net = compiled(net, tc, device)
    return model, net


def make_optimizer(model: nn.Module, cfg: TrainConfig,
                   precision: str = "fp32") -> torch.optim.Optimizer:
    """AdamW with the configured betas and weight decay, or with train.optimizer=muon Muon for the
    layers' weight matrices (its Newton-Schulz iterations in bf16 when training in bf16, else
    fp32); the rate is set at every step. On CUDA AdamW's fused implementation: one kernel for
    all parameters instead of several."""
    if cfg.optimizer == "muon":
        from attn_mt.training.muon import MuonAdamW

        return MuonAdamW(model, lr=lr_at(1, cfg), betas=cfg.betas, weight_decay=cfg.weight_decay,
                         momentum=cfg.muon_momentum, ns_steps=cfg.muon_ns_steps,
                         ns_schedule=cfg.muon_ns_schedule, per_head=cfg.muon_per_head,
                         ns_dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=lr_at(1, cfg), betas=cfg.betas,
                             weight_decay=cfg.weight_decay, fused=fused or None)


def make_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """fp16's loss scaling (its gradients would underflow); for other precisions a scaler that
    passes everything through."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def make_ema(model: nn.Module, cfg: TrainConfig) -> WeightEMA | None:
    """The weights' moving average that is evaluated and saved (train.ema_decay), or None."""
    if not cfg.ema_decay:
        return None
    from attn_mt.training.ema import WeightEMA

    return WeightEMA(model, cfg.ema_decay)


def unguided(loss: torch.Tensor, batch: Batch) -> torch.Tensor:
    """A batch's loss as it is: no guided alignment."""
    return loss


def make_guide(model: nn.Module, cfg: TrainConfig) -> Callable[[torch.Tensor, Batch], torch.Tensor]:
    """What a batch's token loss becomes: itself, or with train.guided_alignment plus the guided
    head's alignment loss (training/guided.py)."""
    if not cfg.guided_alignment:
        return unguided
    from attn_mt.training.guided import GuidedLoss

    return GuidedLoss(model, cfg)


def make_checks(cfg: TrainConfig, device: torch.device, ema: WeightEMA | None,
                scaled: bool) -> HostChecks | DeviceChecks:
    """A step's checks, chosen once by train.skip_check: deferred to the device
    (training/deferred.py) with `device`, or with `auto` on CUDA; else read on the host.
    `scaled`: fp16's gradient scaler is on."""
    if cfg.skip_check == "device" or (cfg.skip_check == "auto" and device.type == "cuda"):
        from attn_mt.training.deferred import DeviceChecks

        return DeviceChecks(cfg, device, ema, scaled)
    return HostChecks(cfg)


Collate = Callable[[list[list[int]], tuple[int, ...]], list[Batch]]


def make_collate(cfg: ExperimentConfig, corpus: Corpus, device: torch.device,
                 world: World) -> Collate:
    """A function from a step's index batches and its subword draws' seed to its collated
    batches: into pinned memory on a GPU (copied asynchronously), padded to static shapes with
    train.length_buckets (data/arrays.py's `to_bucket`), with train.guided_alignment carrying
    their pairs' links (training/guided.py)."""
    tc, tok, split, pin = cfg.train, corpus.tok, cfg.data.splits.train, device.type == "cuda"

    def collate(index: list[list[int]], draws: tuple[int, ...]) -> list[Batch]:
        made = list(corpus.batches(split, index, tc.subword_sampling, draws, pin=pin))
        if tc.length_buckets:
            made = [to_bucket(b, tc.length_buckets, tok.pad_id, tok.bos_id, tok.eos_id, pin,
                              tc.batch_tokens, world.size) for b in made]
        return made

    if cfg.train.guided_alignment:
        from attn_mt.training.guided import with_links

        return with_links(collate, cfg, corpus, pin)
    return collate


class InPlace:
    """Each step's batches built when the step asks (data/prefetch.py's Prefetcher builds them
    ahead in a thread, on a GPU)."""

    def take(self, key: Hashable, make: Callable[[], T]) -> T:
        return make()

    def ahead(self, key: Hashable, make: Callable[[], object]) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> InPlace:
        return self

    def __exit__(self, *exc) -> None:
        pass


def make_feed(device: torch.device) -> InPlace | Prefetcher:
    """When a step's batches are built: in place, or on CUDA ahead, in a thread, while the GPU runs
    the step before."""
    if device.type != "cuda":
        return InPlace()
    from attn_mt.data.prefetch import Prefetcher

    return Prefetcher()
