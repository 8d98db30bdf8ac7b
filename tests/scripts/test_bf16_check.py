"""scripts/bf16_check.py on the toy config: both precisions train by the trainer's step, curves at
every point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bf16_check_gives_two_curves(tmp_path):
    out = tmp_path / "bf16.json"
    sets = [x for o in TINY for x in ("--set", o)]
    done = run_script("bf16_check", "--config", ROOT / "configs" / "toy.yaml", *sets, "--steps",
                      "4", "--eval-every", "2", "--json", out)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    for p in ("fp32", "bf16"):
        assert [step for step, _ in result[p]["valid_loss"]] == [2, 4]
        assert (all(0 < loss < 10 for _, loss in result[p]["valid_loss"])
                and result[p]["train_seconds"] > 0)
    fp32, bf16 = (result[p]["valid_loss"][-1][1] for p in ("fp32", "bf16"))
    assert result["final_rel_diff"] == pytest.approx(abs(bf16 - fp32) / fp32)
    assert result["final_rel_diff"] < 0.05  # same seed, same batches: bf16 tracks fp32 closely
    assert "max relative difference" in done.stdout
