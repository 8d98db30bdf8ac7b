"""scripts/history_cost.py on the tiny config: recording on and off in turns, in one process, and
the ratios."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import TINY
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_history_cost_alternates_recording_on_and_off_and_gives_the_ratios(tmp_path):
    sets = [x for o in [*TINY, "train.max_steps=6", "train.eval_every=3"] for x in ("--set", o)]
    done = run_script("history_cost", "--config", ROOT / "configs" / "toy.yaml", *sets, "--rounds",
                      "2", "--json", tmp_path / "c.json")
    assert done.returncode == 0, done.stderr
    assert (re.findall(r"round (\d) recording (on|off)", done.stdout)
            == [("1", "on"), ("1", "off"), ("2", "off"),
                ("2", "on")])
    got = json.loads((tmp_path / "c.json").read_text())
    assert [r["steps"] for r in got["runs"]["on"] + got["runs"]["off"]] == [6] * 4
    for m in ("train_s", "cpu_s"):
        assert got["ratio"][m] == pytest.approx(got["median"]["on"][m] / got["median"]["off"][m])
    assert f"({got['ratio']['train_s']:.4f}x)" in done.stdout
