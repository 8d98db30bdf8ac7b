"""scripts/gpu_check.py --dry-run: every step of the GPU check, on the CPU with tiny settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn_mt.device import precisions_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_report(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("env", "tests", "bench", "compare", "train"):
        assert (tmp_path / f"gpu_{name}.json").exists(), name
    bench = json.loads((tmp_path / "gpu_bench.json").read_text())["report"]
    ours = {row["precision"]: row["tokens_per_s"] for row in bench["train"] if row["model"] == "ours"}
    assert bench["ours_tokens_per_s"] == ours and list(ours) == precisions_for(torch.device("cpu"))
    assert set(json.loads((tmp_path / "gpu_compare.json").read_text())["report"]["models"]) == {"transformer", "rnn"}
    train = json.loads((tmp_path / "gpu_train.json").read_text())
    assert train["results"]["steps"] == 4 and max(r["step"] for r in train["metrics"] if "step" in r) == 4
    assert "train: 4 steps" in done.stdout
