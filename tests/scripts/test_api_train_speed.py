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
def test_api_train_speed_times_both_and_gives_the_ratio(prestarted_bin, tmp_path):
    # 4 steps in two evaluation windows (the median leaves the first out), a quick test BLEU
    short = ["train.max_steps=4", "train.eval_every=2", "train.bleu_sentences=5",
             "decode.max_len_a=0", "decode.max_len_b=4"]
    sets = [x for o in [*TINY, *short] for x in ("--set", o)]
    done = run_script("api_train_speed", "--config", ROOT / "configs" / "toy.yaml", *sets,
                      "--rounds", "1", "--json", tmp_path / "s.json",
                      python=prestarted_bin / "python" / "python")  # its runs: forks, no imports
    assert done.returncode == 0, done.stderr
    assert re.findall(r"round 1 (cli|api) ", done.stdout) == ["cli", "api"]
    figures = json.loads((tmp_path / "s.json").read_text())
    assert figures["ratio"] == pytest.approx(figures["median"]["api"] / figures["median"]["cli"])
    assert f"({figures['ratio']:.3f}x)" in done.stdout
