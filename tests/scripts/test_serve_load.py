"""scripts/serve_load.py on the tiny run: a real `attn-mt serve`, concurrent clients and the batch baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import toy_test_files

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("fastapi")


@pytest.mark.slow
def test_serve_load_answers_every_request(tiny_run, tmp_path):
    src, _ = toy_test_files(tmp_path)
    out = tmp_path / "load.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve_load.py"), "--checkpoint",
                           str(tiny_run / "checkpoint_best.pt"), "--src", str(src), "--sentences", "8",
                           "--single", "3", "--clients", "2", "--rounds", "1", "--threads", "1",
                           "--out-json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["all_answered"], result["rounds_detail"]  # every request answered, no error or timeout
    assert result["sentences"] == 8 and result["single_client_sentences"] == 3
    assert result["server_sentences_per_s"] > 0 and result["batch_sentences_per_s"] > 0
    assert result["server_p50_ms"] <= result["server_p95_ms"]
    assert [set(r) for r in result["rounds_detail"]] == [{"server", "single", "batch"}]  # one round of all three
    assert result["rounds_detail"][0]["server"]["same_text_as_batch"] == 8  # the server translates as a batch does
