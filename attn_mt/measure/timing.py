"""Fair measurements: rotating rounds of timed calls, background load, memory, step counts.

`alternate` is the one timing loop of the package and its scripts: every contestant runs in one
process, round after round, the order rotating so that none always goes first; callers report
the median of the rounds. The background CPU load (CPU time used by other processes) is measured
alongside, since on a 2-core machine one other busy process halves a 2-thread run.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.config import DecodeConfig
from attn_mt.decoding.search import translate, translate_nbest
from attn_mt.device import Stopwatch

log = logging.getLogger(__name__)


def timed(fn: Callable[[], object], device: torch.device | None = None) -> Callable[[], float]:
    """`fn` wrapped to return its wall-clock seconds, the device synchronised before and after."""
    def run() -> float:
        with Stopwatch(device) as watch:
            fn()
        return watch.seconds
    return run


def alternate(fns: dict[str, Callable[[], float]], repeats: int, *, warmup: bool = False,
              after: Callable[[str, int, float], None] | None = None, label: str = "") -> dict[str, list[float]]:
    """Seconds of each `fn()` per round: `repeats` rounds (after a warm-up round, kept first in each
    list, with `warmup`), the order rotating from round to round so none always runs first or after
    the same neighbour (two contestants simply alternate). `after(name, round, seconds)` follows
    every call (round 0 is the warm-up with `warmup`); with a `label`, every round is logged."""
    names, times = list(fns), {name: [] for name in fns}
    for r in range(repeats + warmup):
        first = r % max(len(names), 1)
        for name in names[first:] + names[:first]:
            times[name].append(fns[name]())
            if after is not None:
                after(name, r, times[name][-1])
        if label:
            log.info("%s: round %d of %d done (load %.1f)", label, r, repeats, os.getloadavg()[0])
    return times


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot (Linux /proc/stat), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class LoadMeter:
    """Average number of CPU cores other processes kept busy between start() and stop()."""

    def start(self) -> LoadMeter:
        self.t0, self.busy0, self.own0 = time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds()
        self.loadavg0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return self

    def stop(self) -> dict:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        busy = _busy_cpu_seconds()
        cores = None
        if busy is not None and self.busy0 is not None:
            cores = max(0.0, (busy - self.busy0) - (_own_cpu_seconds() - self.own0)) / wall
        return {"seconds": round(wall, 1),
                "background_cores": None if cores is None else round(cores, 2),
                "loadavg_1min_start": self.loadavg0,
                "loadavg_1min_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


@contextmanager
def metered(load: dict, name: str):
    """Record in load[name] the background load (LoadMeter) while the block runs."""
    meter = LoadMeter().start()
    try:
        yield
    finally:
        load[name] = meter.stop()


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def train_step_seconds(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, autocast) -> float:
    """Seconds for one forward + backward pass of a batch (gradients are dropped)."""
    with Stopwatch(src.device) as watch, autocast():
        logits = model(src, tgt)  # teacher forcing: the target predicts itself, as good as any
        F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten()).backward()
    model.zero_grad(set_to_none=True)
    return watch.seconds


def saved_activation_bytes(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, autocast) -> int:
    """Bytes of the tensors autograd keeps for backward (activations), parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
        loss = model(src, tgt).float().logsumexp(-1).sum()
    del loss
    return sum(seen.values())


def length_scaling(models: dict[str, nn.Module], lengths: list[int], batch_tokens: int, vocab: int,
                   repeats: int, device: torch.device, autocast, progress=None) -> list[dict]:
    """Forward+backward ms per batch of `batch_tokens` tokens, for sentences of each length.

    Random ids, no padding, so every model sees exactly length x (batch_tokens // length)
    tokens per side. Per length: one warm-up each, then `repeats` rounds whose model order
    alternates; the median of each model's rounds is reported.
    """
    rows = []
    for length in lengths:
        b = max(1, batch_tokens // length)
        g = torch.Generator().manual_seed(length)
        src, tgt = (torch.randint(4, vocab, (b, length), generator=g).to(device) for _ in range(2))
        row: dict = {"length": length, "batch_size": b}
        fits = {k: m.max_positions >= length for k, m in models.items()}
        times: dict[str, list[float]] = {k: [] for k in models}
        for k, m in models.items():
            if fits[k]:
                m.train()
                train_step_seconds(m, src, tgt, autocast)  # warm-up
                row[f"{k}_mb"] = round(saved_activation_bytes(m, src, tgt, autocast) / 2**20, 1)
        times.update(alternate({k: functools.partial(train_step_seconds, m, src, tgt, autocast)
                                for k, m in models.items() if fits[k]}, repeats, after=_tick(progress)))
        for k in models:
            row[f"{k}_ms"] = round(statistics.median(times[k]) * 1000, 1) if times[k] else None
            # sequential steps per layer: a recurrence steps through the sentence, attention does not
            row[f"{k}_sequential_steps"] = length if k == "rnn" else 1
        rows.append(row)
    return rows


def _tick(progress) -> Callable[[str, int, float], None] | None:
    """A progress bar's update(1) after every timed call, or None without a bar."""
    return None if progress is None else (lambda name, r, seconds: progress.update(1))


def decode_speed(models: dict[str, nn.Module], tok, texts: list[str], base: DecodeConfig,
                 beam_size: int, repeats: int, device: torch.device, autocast, progress=None) -> dict:
    """Sentences per second (greedy and beam), alternated and repeated, plus decoder steps."""
    modes = {"greedy": replace(base, beam_size=1, nbest=1),
             "beam": replace(base, beam_size=beam_size, nbest=1)}
    out: dict[str, dict] = {k: {} for k in models}
    for mode, dcfg in modes.items():
        for k, m in models.items():  # warm-up run that also counts the sequential decoder calls
            calls: list[None] = []
            with autocast():
                hyps = [n[0].text for n in translate_nbest(m, tok, texts, dcfg, device,
                                                           interrupt=lambda c=calls: c.append(None))]
            out[k][f"{mode}_decoder_calls"] = len(calls)
            out[k][f"{mode}_output_tokens"] = sum(len(ids) + 1 for ids in tok.encode_tgt(hyps))
        def run(m: nn.Module, dcfg=dcfg) -> None:
            with autocast():
                translate(m, tok, texts, dcfg, device)

        seconds = alternate({k: timed(functools.partial(run, m), device) for k, m in models.items()}, repeats,
                            after=_tick(progress))
        for k in models:
            out[k][f"{mode}_sentences_per_s"] = round(len(texts) / statistics.median(seconds[k]), 1)
    return out
