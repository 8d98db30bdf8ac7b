"""scripts/speedrun_cost.py on the tiny config: every recipe timed per precision, the first one the
reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]


def test_speedrun_cost_times_each_recipe_against_the_first(tmp_path):
    sets = [x for o in TINY for x in ("--set", o)]
    done = run_script("speedrun_cost", "--config", ROOT / "configs" / "toy.yaml", *sets,
                      "--recipe", "old:", "--recipe",
                      "new:train.optimizer=muon,model.qk_norm=true,train.subword_sampling=0.3",
                      "--steps", "1", "--repeats", "1", "--json", tmp_path / "c.json")
    assert done.returncode == 0, done.stderr
    r = json.loads((tmp_path / "c.json").read_text())
    assert (r["reference"] == "old"
            and r["recipes"]["new"] == ["train.optimizer=muon", "model.qk_norm=true",
                                        "train.subword_sampling=0.3"])
    rows = {(x["recipe"], x["precision"]): x for x in r["rows"]}
    for (_, p), row in rows.items():
        assert row["cost_vs_reference"] == pytest.approx(rows["old", p]["tokens_per_s"]
                                                         / row["tokens_per_s"])
        assert (f"{row['tokens_per_s']:9,.0f} tokens/s  cost x{row['cost_vs_reference']:.3f}"
                in done.stdout)
    assert rows["old", "fp32"]["cost_vs_reference"] == 1.0
    assert (rows["new", "fp32"]["source_tokens_per_round"]
            > rows["old", "fp32"]["source_tokens_per_round"])  # sampled
