"""The timing helpers every measurement shares: rotating rounds, timed calls, counted calls, load
meter."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attn_mt.config import RNNConfig, TransformerConfig
from attn_mt.measure import timing
from attn_mt.models import build_model


def test_rounds_rotate_so_no_contestant_always_goes_first():
    order: list[str] = []
    fns = {name: (lambda name=name: order.append(name) or 0.5) for name in "abc"}
    seen = []
    times = timing.alternate(fns, 3, warmup=True, after=lambda name, r,
                             s: seen.append((name, r, s)))
    # the warm-up round, then 3 rounds, each starting one later
    assert order == list("abc" "bca" "cab" "abc")
    # the warm-up round's time first in every list
    assert times == {name: [0.5] * 4 for name in "abc"}
    assert seen[:4] == [("a", 0, 0.5), ("b", 0, 0.5), ("c", 0, 0.5), ("b", 1, 0.5)]


def test_two_contestants_simply_alternate_and_none_is_fine():
    order: list[str] = []
    timing.alternate({k: (lambda k=k: order.append(k) or 0.0) for k in ("rnn", "transformer")}, 4)
    assert order == ["rnn", "transformer", "transformer", "rnn"] * 2
    assert timing.alternate({}, 3) == {}  # e.g. no model fits a length


def test_timed_returns_the_seconds_of_the_call():
    # a call that takes 0.05 s at least
    seconds = timing.timed(lambda: time.sleep(0.05), torch.device("cpu"))()
    assert 0.05 <= seconds < 1.0
    assert timing.timed(lambda: None)() < 0.05  # well under the sleep: not the same call's time


def test_load_meter_reports_the_window():
    outer = time.perf_counter()
    meter = timing.LoadMeter().start()
    inner = time.perf_counter()
    time.sleep(0.3)
    inner = time.perf_counter() - inner
    load = meter.stop()
    outer = time.perf_counter() - outer
    assert set(load) == {"seconds", "background_cores", "own_cores", "loadavg_1min_start",
                         "loadavg_1min_end"}
    assert 0 <= load["own_cores"] < 0.5  # asleep: this process used little of a core
    # the window between start and stop (in tenths), whatever the load
    assert 0.3 <= inner and round(inner, 1) <= load["seconds"] <= round(outer, 1)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="LoadMeter reads /proc/stat (Linux)")
def test_load_meter_sees_another_process_keep_a_core_busy():
    """A child spinning on one core for the whole window counts as about one background core (other
    processes on the machine can only add to it); this process's own work is not counted."""
    spin = subprocess.Popen([sys.executable, "-c",
                             "import time\nend = time.time() + 5\nprint(flush=True)\nwhile "
                             "time.time() < end: pass"], stdout=subprocess.PIPE)
    try:
        spin.stdout.readline()  # the child is running
        meter = timing.LoadMeter().start()
        end = time.perf_counter() + 0.8
        while time.perf_counter() < end:  # our own busy loop: not background
            pass
        load = meter.stop()
    finally:
        spin.kill()
        spin.wait()
    assert load["background_cores"] >= 0.6


@pytest.mark.parametrize("cfg", [TransformerConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64,
                                                   max_positions=16),
                                 RNNConfig(d_embed=16, d_hidden=16, d_attn=16, max_positions=16)],
                         ids=["transformer", "rnn"])
def test_length_scaling_times_each_model_at_each_length(cfg):
    kind, ticks = cfg.kind, []
    model = build_model(cfg, src_vocab=50, tgt_vocab=50, pad_id=0, shared_vocab=True)

    class Bar:
        def update(self, n):
            ticks.append(n)

    rows = timing.length_scaling({kind: model}, [4, 8, 32], 32, 50, 2, torch.device("cpu"),
                                 contextlib.nullcontext, Bar())
    assert ([r["length"] for r in rows] == [4, 8, 32]
            and [r["batch_size"] for r in rows] == [8, 4, 1])
    assert rows[0][f"{kind}_ms"] > 0 and rows[0][f"{kind}_mb"] > 0
    assert rows[2][f"{kind}_ms"] is None  # longer than the model's positions: not timed
    assert rows[1][f"{kind}_sequential_steps"] == (8 if kind == "rnn" else 1)
    # two rounds: none is an outlier
    assert rows[0][f"{kind}_spread"] >= 0 and rows[0][f"{kind}_outliers"] == 0
    assert len(ticks) == 2 * 2  # two rounds at each length that fits


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_cpu_clock_counts_only_this_process_working():
    """Time the process waits (asleep here, descheduled on a busy machine) is on the wall clock, not
    the CPU one."""
    with timing.watch("cpu") as cpu, timing.watch("wall") as wall:
        time.sleep(0.3)
        _burn(0.1)
    assert wall.seconds >= 0.4 and 0.1 * 0.9 / torch.get_num_threads() <= cpu.seconds < 0.25
    assert timing.timed(lambda: time.sleep(0.2), clock="cpu")() < 0.1
    with pytest.raises(ValueError, match="clock='gpu'"):
        timing.watch("gpu")


def test_robust_median_drops_an_interrupted_round():
    assert timing.robust_median([0.100, 0.104, 5.0]) == (pytest.approx(0.102),
                                                         pytest.approx(0.04 / 1.02), 1)
    assert timing.robust_median([1.0, 1.05, 1.08, 1.1, 9.0, 7.0])[2] == 2  # two slow rounds of six
    # close rounds: all kept
    assert timing.robust_median([1.0, 1.09, 0.95]) == (1.0, pytest.approx(0.14), 0)
    # no spread among most: the odd one goes
    assert timing.robust_median([2.0, 2.0, 2.0, 3.0]) == (2.0, 0.0, 1)
    assert timing.robust_median([1.0, 3.0])[:2] == (2.0, 1.0)  # two rounds: no majority to judge by
    with pytest.raises(ValueError):
        timing.robust_median([])


def _load(background, own):
    return {"seconds": 10.0, "background_cores": background, "own_cores": own}


def test_untrusted_says_when_the_load_starved_the_clock():
    """Wall clock: others took cores torch's threads needed. CPU clock, one thread: only a nearly
    starved process. CPU clock, two threads: a thread waiting for a descheduled one spins, so as the
    wall clock."""
    busy, quiet = {"training": _load(1.4, 0.6)}, {"training": _load(0.05, 1.9)}
    assert (timing.untrusted(quiet, "wall", 2, 2) == [] and timing.untrusted(quiet, "cpu", 2, 2)
            == [])
    [reason] = timing.untrusted(busy, "wall", 2, 2)
    assert reason.startswith("training: other processes kept 1.40 of 2 cores busy")
    # a core for them, 0.2 of ours
    assert timing.untrusted({"training": _load(1.2, 0.8)}, "wall", 1, 2) == []
    assert "0.40 of the cores torch's 1 threads needed" in timing.untrusted(busy, "wall", 1, 2)[0]
    assert timing.untrusted(busy, "cpu", 1, 2) == []
    assert "count as CPU time" in timing.untrusted(busy, "cpu", 2, 2)[0]
    starved = {"length_scaling": _load(1.9, 0.05), "decoding": _load(1.8, 0.2)}
    assert [r.split(":")[0] for r in timing.untrusted(starved, "cpu", 1, 2)] == ["length scaling"]
    # not measurable: no claim
    assert timing.untrusted({"training": _load(None, 0.5)}, "wall", 2, 2) == []


def test_noisy_rows_names_the_scattered_timings():
    rows = [{"length": 8, "transformer_spread": 0.62, "rnn_spread": 0.1},
            {"length": 16, "transformer_spread": None, "rnn_spread": 0.51}]
    assert timing.noisy_rows(rows, ["transformer", "rnn"]) == ["n=8 transformer: rounds spread 62%",
                                                               "n=16 rnn: rounds spread 51%"]
