"""Kernels per training step and the device's busy share, from torch.profiler: what launch overhead
costs.

    >>> cfg = load_config("configs/multi30k_gpu.yaml", ["data.dir=/path/to/multi30k"])
    >>> profile_steps(cfg, steps=10)

(scripts/profile_step.py is its command line.)

One fixed batch (the first of the epoch's plan, padded to its length bucket when the config has
buckets) is trained on by the trainer's own step, eager and (when asked) under torch.compile with
the config's options (training/compiled.py): warm-up steps first (the compile among them, timed
apart), then the asked number of steps under the profiler. Per variant: device kernels per step, the
share of the wall clock in which the device ran kernels (kernel time / wall time; on a CPU, which
has no device kernels: None), the step time and the CPU operators per step.

Tested in tests/scripts/test_gpu_check.py (gpu_check's profile step, on the CPU).

One job: the profile of a step; bench.py measures throughput, timing.py times functions.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from attn_mt.config import ExperimentConfig
from attn_mt.data.arrays import to_bucket
from attn_mt.data.batching import token_batches
from attn_mt.device import Stopwatch, machine
from attn_mt.measure.prelude import prelude
from attn_mt.models import build_model
from attn_mt.training.compiled import compiled
from attn_mt.training.trainer import TrainStep


def profile_steps(cfg: ExperimentConfig, steps: int = 10, warmup: int = 3,
                  variants: tuple[str, ...] = ("eager", "compiled")) -> dict:
    """The profile of each variant's training step on one batch (see the module docstring)."""
    start = prelude(cfg, cfg.model.max_positions, "the config configs/toy.yaml")
    device, precision, corpus, tc = start.device, start.precision, start.corpus, cfg.train
    split, tok = cfg.data.splits.train, start.corpus.tok
    index = token_batches(*corpus.lengths(split), tc.batch_tokens, tc.seed, 0,
                          buckets=tc.length_buckets)
    batch = next(corpus.batches(split, index[:1]))
    if tc.length_buckets:
        batch = to_bucket(batch, tc.length_buckets, tok.pad_id, tok.bos_id, tok.eos_id,
                          batch_tokens=tc.batch_tokens)
    batch = batch.to(device)
    out = {"machine": machine(device, precision), "config": cfg.name,
           "batch_shape": list(batch.src.shape), "target_tokens": batch.n_tokens, "steps": steps,
           "warmup": warmup, "variants": {}}
    for name in variants:
        torch.manual_seed(tc.seed)
        model = build_model(cfg.model, **tok.sizes()).to(device).train()
        net = compiled(model, replace(tc, compile=True), device) if name == "compiled" else model
        step = TrainStep(model, tc, device, precision, net=net)
        run = lambda step=step: step.update(step.backward([batch], batch.n_tokens), tc.lr)  # noqa: E731
        with Stopwatch(device) as warm:
            for _ in range(warmup):
                run()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                               else [])
        with profile(activities=activities) as prof, Stopwatch(device) as watch:
            for _ in range(steps):
                run()
        out["variants"][name] = summarise(prof.events(), watch.seconds, warm.seconds, steps,
                                          batch.n_tokens)
    return out


def summarise(events, seconds: float, warmup_s: float, steps: int, tokens: int) -> dict:
    """Kernels and operators per step, the device's busy share, from the profiler's events."""
    kernels = [e for e in events if e.device_type != DeviceType.CPU]
    operators = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    return {"step_s": seconds / steps, "tokens_per_s": tokens * steps / seconds,
            "warmup_s": warmup_s, "kernels_per_step": len(kernels) / steps if kernels else None,
            "device_busy_share": busy / seconds if kernels else None,
            "top_level_cpu_ops_per_step": len(operators) / steps}
