"""The parts of a training step (attn_mt/measure/parts.py): all there, positive, tiling the real
step."""

from __future__ import annotations

import time

import pytest
import torch

from attn_mt.measure.parts import PARTS, parts_table, step_parts, timed_step, whole_step
from attn_mt.measure.prelude import prelude
from attn_mt.models import build_model
from attn_mt.training.trainer import Trainer

# EMA on: all nine parts
EVERY_PART = ("train.optimizer=muon", "train.ema_decay=0.99", "train.clip_norm=1.0")


def trainer(cfg) -> Trainer:
    start = prelude(cfg, cfg.model.max_positions, "")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, **start.corpus.tok.sizes()).train()
    return Trainer(model, cfg, start.corpus, start.device, start.precision)


def test_every_part_is_timed_and_the_parts_add_up_to_the_step(tiny_cfg):
    r = step_parts(trainer(tiny_cfg(*EVERY_PART)), steps=6, warmup=1)
    assert tuple(r["ms"]) == PARTS and all(ms > 0 for ms in r["ms"].values())
    assert r["sum_ms"] == pytest.approx(sum(r["ms"].values()))
    assert r["share"] == pytest.approx({p: ms / r["whole_ms"] for p, ms in r["ms"].items()})
    # medians of different steps: the parts' sum near the whole step (the timers add a little)
    assert 0.5 < r["sum_ms"] / r["whole_ms"] < 2
    assert r["optimizer_name"] == "muon" and r["precision"] == "fp32" and r["steps"] == 6
    table = "\n".join(parts_table(r))
    assert all(f"\n{p} " in table for p in PARTS) and "of the whole step" in table


def test_the_parts_tile_one_step_and_leave_it_as_it_was(tiny_cfg):
    """A step with timers: its parts sum to the step's time measured around it, it trains exactly as
    a plain step, and the timers are gone after it. Without EMA there is no ema part."""
    timed, plain = trainer(tiny_cfg()), trainer(tiny_cfg())
    for _ in range(3):
        t0 = time.perf_counter()
        seconds = timed_step(timed, time.perf_counter)
        outside = time.perf_counter() - t0
        whole_step(plain, time.perf_counter)
        assert set(seconds) == set(PARTS) - {"ema"} and all(s > 0 for s in seconds.values())
        assert (sum(seconds.values()) <= outside
                and sum(seconds.values()) == pytest.approx(outside, rel=0.2))
    assert ("update" not in vars(timed) and timed.net is timed.model
            and "scale" not in vars(timed.scaler))
    assert not {"before", "after"} & set(vars(timed.checks))
    for a, b in zip(timed.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert timed.state.step == plain.state.step == 3
