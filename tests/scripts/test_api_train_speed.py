"""scripts/api_train_speed.py on the tiny config: the CLI and the Python API, one run each, and
their ratio."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import TINY
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_api_train_speed_times_both_and_gives_the_ratio(tmp_path):
    sets = [x for o in [*TINY, "train.max_epochs=1", "train.eval_every=5"] for x in ("--set", o)]
    done = run_script("api_train_speed", "--config", ROOT / "configs" / "toy.yaml", *sets,
                      "--rounds", "1", "--json", tmp_path / "s.json")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"round 1 (cli|api) ", done.stdout) == ["cli", "api"]
    figures = json.loads((tmp_path / "s.json").read_text())
    assert figures["ratio"] == pytest.approx(figures["median"]["api"] / figures["median"]["cli"])
    assert f"({figures['ratio']:.3f}x)" in done.stdout
