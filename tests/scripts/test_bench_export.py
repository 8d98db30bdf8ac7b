"""scripts/bench_export.py on the tiny run: our decoders and CTranslate2's, timed in rotating
rounds."""

from __future__ import annotations

import json

import pytest
from conftest import toy_test_files
from in_process import run_script

pytest.importorskip("ctranslate2")


@pytest.mark.slow
def test_bench_export_rows_for_every_decoder(tiny_run, tmp_path):
    src, ref = toy_test_files(tmp_path)
    out = tmp_path / "export.json"
    done = run_script("bench_export", "--checkpoint", tiny_run / "checkpoint_best.pt", "--src", src,
                      "--ref", ref, "--rounds", "1", "--threads", "1", "--batch-size", "4",
                      "--beam", "2", "--json", out)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    decoders = {r["decoder"] for r in result["rows"]}
    assert decoders == {"ours fp32", "ours bf16", "torch dynamic int8", "ctranslate2 float32",
                        "ctranslate2 int8"}
    assert {r["search"] for r in result["rows"]} == {"greedy", "beam 2"}
    by = {(r["decoder"], r["search"]): r for r in result["rows"]}
    assert (by["ours fp32", "greedy"]["same_as_ours_fp32"] == 100.0
            and by["ours fp32", "greedy"]["x_ours_fp32"] == 1.0)
    # the same model, another runtime
    assert by["ctranslate2 float32", "greedy"]["same_as_ours_fp32"] >= 75
    # every decoder x search timed once, reported as it ran
    assert done.stderr.count("round 1/1") == 10
    assert "ct2_int8_beam_speedup_vs_our_best_beam" in result["summary"]
