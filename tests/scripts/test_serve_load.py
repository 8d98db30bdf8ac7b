"""scripts/serve_load.py on the tiny run: real servers (this checkout's, and as a baseline again),
concurrent clients, offline translation at the same batch sizes, the big request alone and among
others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import toy_test_files
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("fastapi")


@pytest.mark.slow
def test_serve_load_answers_every_request(tiny_run, prestarted_bin, tmp_path):
    src, _ = toy_test_files(tmp_path, n=12)
    out = tmp_path / "load.json"
    # the servers are processes the script starts, on sockets of their own: forks of
    # prestarted_bin's python (this checkout's code, which the baseline is here too)
    done = run_script("serve_load", "--checkpoint", tiny_run / "checkpoint_best.pt", "--src", src,
                      "--sentences", "12", "--single", "3", "--big", "4", "--clients", "1", "8",
                      "--rounds", "1", "--threads", "1", "--baseline", ROOT, "--out-json", out,
                      python=prestarted_bin / "python" / "python")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    # every request answered, no error or timeout
    assert result["all_answered"], result["rounds_detail"]
    (detail,) = result["rounds_detail"]  # one round of every run
    assert set(detail) == {"server-1", "server-8", "offline-1", "offline-8", "mixed", "server-big",
                           "offline-big", "baseline1-8"}
    assert (detail["server-8"]["same_text_as_offline"] == 12
            == detail["baseline1-8"]["same_text_as_offline"])
    assert detail["server-1"]["answered"] == 3 and detail["mixed"]["small"]["answered"] == 8
    c1, c8 = result["clients_1"], result["clients_8"]
    assert c8["ratio"] == round(c8["server_sentences_per_s"] / c8["offline_sentences_per_s"], 3)
    assert c1["p50_ms"] <= c1["p95_ms"] and c1["offline_p50_ms"] > 0
    (base,) = result["baselines_8"]
    assert base["speedup"] == round(c8["server_sentences_per_s"] / base["server_sentences_per_s"],
                                    3)
