"""Fair measurements: rotating rounds of timed calls, background load, memory, step counts.

`alternate` is the one timing loop of the package and its scripts: every contestant runs in one
process, round after round, the order rotating so that none always goes first; callers report
the median of the rounds (`robust_median`: outliers dropped first). The background CPU load (CPU
time used by other processes) is measured alongside, since on a 2-core machine one other busy
process halves a 2-thread run; `untrusted` says when it was too much for the clock used. Clocks
(`CLOCKS`): "wall", or "cpu", this process's CPU seconds per torch thread, which other processes
do not inflate when torch runs one thread.

One job: timing shared by the measurements (rounds, clocks, medians, load and whether to trust it).
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
from attn_mt.decoding.translate import translate, translate_nbest
from attn_mt.device import Stopwatch

log = logging.getLogger(__name__)

CLOCKS = ("wall", "cpu")
# robust_median drops rounds further than this many (scaled) MADs from the median
OUTLIER_MADS = 3.0
# ... and further than this share of the median (close rounds are never outliers)
OUTLIER_FLOOR = 0.1
# a timing whose kept rounds spread more than this share of their median is noisy
NOISY_SPREAD = 0.5
MAX_STOLEN_CORES = 0.25  # wall clock: at most this much of the cores torch asked for used by others
# cpu clock, one thread: at least this share of a core for this process (at 0.22 of a core,
# compare-rnn's quick mode trained within 6% of the steps of a run at 0.67, and its length timings
# kept their trend)
MIN_CPU_SHARE = 0.1


class CpuWatch:
    """This process's CPU seconds of a block, per torch thread (with one thread: the seconds of CPU
    work it took, however busy the machine; with more, waiting threads spin and count). CPU devices
    only."""

    def __init__(self) -> None:
        self.seconds, self._t0 = 0.0, 0.0

    def __enter__(self) -> CpuWatch:
        self._t0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = (time.process_time() - self._t0) / max(torch.get_num_threads(), 1)


def watch(clock: str = "wall", device: torch.device | None = None) -> Stopwatch | CpuWatch:
    """A context manager whose `.seconds` is the block's time on `clock` (one of CLOCKS)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock={clock!r}: must be one of {', '.join(CLOCKS)}")
    return Stopwatch(device) if clock == "wall" else CpuWatch()


def timed(fn: Callable[[], object], device: torch.device | None = None,
          clock: str = "wall") -> Callable[[], float]:
    """`fn` wrapped to return its seconds on `clock` (wall: the device synchronised before and
    after)."""
    def run() -> float:
        with watch(clock, device) as w:
            fn()
        return w.seconds
    return run


def robust_median(values: list[float], mads: float = OUTLIER_MADS) -> tuple[float, float, int]:
    """(median, spread, dropped) of timed rounds: rounds further from the median than `mads` scaled
    median absolute deviations and than OUTLIER_FLOOR of the median are dropped as outliers (a round
    another process interrupted); the median and the spread ((max - min) / median) are of the rounds
    kept."""
    if not values:
        raise ValueError("robust_median of no values")
    mid = statistics.median(values)
    # ~ the standard deviation of normal noise
    mad = 1.4826 * statistics.median(abs(x - mid) for x in values)
    kept = ([x for x in values if abs(x - mid) <= max(mads * mad, OUTLIER_FLOOR * abs(mid))]
            or values)
    centre = statistics.median(kept)
    return centre, (max(kept) - min(kept)) / centre if centre > 0 else 0.0, len(values) - len(kept)


def alternate(fns: dict[str, Callable[[], float]], repeats: int, *, warmup: bool = False,
              after: Callable[[str, int, float], None] | None = None,
              label: str = "") -> dict[str, list[float]]:
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
        self.t0, self.busy0, self.own0 = (time.perf_counter(), _busy_cpu_seconds(),
                                          _own_cpu_seconds())
        self.loadavg0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return self

    def stop(self) -> dict:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        busy, own = _busy_cpu_seconds(), _own_cpu_seconds() - self.own0
        cores = None
        if busy is not None and self.busy0 is not None:
            cores = max(0.0, (busy - self.busy0) - own) / wall
        return {"seconds": round(wall, 1),
                "background_cores": None if cores is None else round(cores, 2),
                "own_cores": round(own / wall, 2),  # this process's CPU seconds per second
                "loadavg_1min_start": self.loadavg0,
                "loadavg_1min_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def untrusted(load: dict[str, dict], clock: str, threads: int, cpus: int) -> list[str]:
    """Why the timings of the metered phases `load` (name -> LoadMeter.stop()) on `clock` cannot be
    trusted, one line per phase (none: no reason found). Wall clock, or cpu clock with several
    threads (a thread waiting for a descheduled one spins, and that counts as CPU time): other
    processes used more than MAX_STOLEN_CORES of the cores torch's threads needed. Cpu clock with
    one thread: this process got under MIN_CPU_SHARE of a core (so busy a machine shares even the
    caches and cores its CPU time runs on)."""
    reasons = []
    for phase, m in load.items():
        name = phase.replace("_", " ")
        if clock == "cpu" and threads == 1:
            if m["own_cores"] < MIN_CPU_SHARE:
                reasons.append(f"{name}: this process got {m['own_cores']:.2f} of a core on "
                               f"average, under {MIN_CPU_SHARE}: too busy a machine to trust even "
                               "its CPU time")
        elif m["background_cores"] is not None:
            stolen = m["background_cores"] - max(0, cpus - threads)
            if stolen > MAX_STOLEN_CORES:
                reasons.append(f"{name}: other processes kept {m['background_cores']:.2f} of "
                               f"{cpus} cores busy, {stolen:.2f} of the cores torch's {threads} "
                               "threads needed" + (" (their waits count as CPU time)"
                                                   if clock == "cpu" else ""))
    return reasons


def noisy_rows(rows: list[dict], names: list[str]) -> list[str]:
    """The length-scaling timings whose kept rounds spread more than NOISY_SPREAD of their
    median."""
    return [f"n={r['length']} {k}: rounds spread {r[f'{k}_spread']:.0%}" for r in rows
            for k in names if r.get(f"{k}_spread") is not None and r[f"{k}_spread"] > NOISY_SPREAD]


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


def train_step_seconds(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, autocast,
                       clock: str = "wall") -> float:
    """Seconds on `clock` for one forward + backward pass of a batch (gradients are dropped)."""
    with watch(clock, src.device) as w, autocast():
        logits = model(src, tgt)  # teacher forcing: the target predicts itself, as good as any
        F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten()).backward()
    model.zero_grad(set_to_none=True)
    return w.seconds


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
                   repeats: int, device: torch.device, autocast, progress=None,
                   clock: str = "wall") -> list[dict]:
    """Forward+backward ms per batch of `batch_tokens` tokens on `clock`, for sentences of each
    length.

    Random ids, no padding, so every model sees exactly length x (batch_tokens // length)
    tokens per side. Per length: one warm-up each, then `repeats` rounds whose model order
    alternates; each model's robust median of its rounds is reported, with their spread and the
    outliers dropped.
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
        times.update(alternate({k: functools.partial(train_step_seconds, m, src, tgt, autocast,
                                                     clock)
                                for k, m in models.items() if fits[k]}, repeats,
                               after=_tick(progress)))
        for k in models:
            mid, spread, dropped = robust_median(times[k]) if times[k] else (None, None, 0)
            row[f"{k}_ms"] = None if mid is None else round(mid * 1000, 1)
            row[f"{k}_spread"], row[f"{k}_outliers"] = (None if spread is None
                                                        else round(spread, 2), dropped)
            # sequential steps per layer: a recurrence steps through the sentence, attention does
            # not
            row[f"{k}_sequential_steps"] = length if k == "rnn" else 1
        rows.append(row)
    return rows


def _tick(progress) -> Callable[[str, int, float], None] | None:
    """A progress bar's update(1) after every timed call, or None without a bar."""
    return None if progress is None else (lambda name, r, seconds: progress.update(1))


def decode_speed(models: dict[str, nn.Module], tok, texts: list[str], base: DecodeConfig,
                 beam_size: int, repeats: int, device: torch.device, autocast, progress=None,
                 clock: str = "wall") -> dict:
    """Sentences per second on `clock` (greedy and beam), alternated and repeated (robust median),
    plus decoder steps."""
    modes = {"greedy": replace(base, beam_size=1, nbest=1),
             "beam": replace(base, beam_size=beam_size, nbest=1)}
    out: dict[str, dict] = {k: {} for k in models}
    for mode, dcfg in modes.items():
        for k, m in models.items():  # warm-up run that also counts the sequential decoder calls
            calls: list[None] = []
            with autocast():
                hyps = [
                    n[0].text for n in translate_nbest(m, tok, texts, dcfg, device,
                                                       interrupt=lambda c=calls: c.append(None))]
            out[k][f"{mode}_decoder_calls"] = len(calls)
            out[k][f"{mode}_output_tokens"] = sum(len(ids) + 1 for ids in tok.encode_tgt(hyps))
        def run(m: nn.Module, dcfg=dcfg) -> None:
            with autocast():
                translate(m, tok, texts, dcfg, device)

        seconds = alternate({k: timed(functools.partial(run, m), device, clock) for k,
                             m in models.items()},
                            repeats, after=_tick(progress))
        for k in models:
            out[k][f"{mode}_sentences_per_s"] = round(len(texts) / robust_median(seconds[k])[0], 1)
    return out
