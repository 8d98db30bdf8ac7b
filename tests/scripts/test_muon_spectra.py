"""scripts/muon_spectra.py on the tiny config: the normalised singular values Muon's iterations
see."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import TINY
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]


def test_muon_spectra_gives_quantiles_per_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sets = [x for o in TINY for x in ("--set", o)]
    done = run_script("muon_spectra", "--config", ROOT / "configs" / "toy.yaml", *sets, "--steps",
                      "1,4", "--json", tmp_path / "s.json")
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [(r["step"], r["quantile"]) for r in rows] == [(s, q) for s in (1, 4)
                                                          for q in (0, 0.1, 0.25, 0.5, 0.9, 1)]
    # 1+1 layers: encoder qkv, out, ff x2; decoder + cross q, kv, out
    assert all(r["matrices"] == 11 for r in rows)
    for step in (1, 4):
        medians = [r["median"] for r in rows if r["step"] == step]
        # under the Frobenius norm
        assert medians == sorted(medians) and 0 <= medians[0] and medians[-1] <= 1 + 1e-5
    assert "step     4  quantile 0.50: median" in done.stdout
