"""scripts/bench_decode.py on the tiny run: every variant timed, the same outputs with and without
the cache."""

from __future__ import annotations

import json

import pytest
from conftest import toy_test_files
from in_process import run_script


@pytest.mark.slow
def test_bench_decode_times_every_variant(tiny_run, tmp_path):
    src, ref = toy_test_files(tmp_path)
    out = tmp_path / "bench.json"
    done = run_script("bench_decode", "--checkpoint", tiny_run / "checkpoint_best.pt", "--src", src,
                      "--ref", ref, "--repeats", "2", "--threads", "1", "--batch-size", "4",
                      "--check-batch1", "--out-json", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert set(report["rows"]) == {"greedy, cache", "greedy, no cache", "beam 5, cache",
                                   "beam 5, no cache"}
    for row in report["rows"].values():
        assert len(row["seconds"]) == 2 and row["sentences_per_s"] > 0
        assert row["same_output_as_cached"]  # the cache changes the speed, never the translation
    assert report["sentences"] == 12 and report["beam5_batch1_differing_lines"] == 0
    # one reading before, one after every timed run
    assert len(report["loadavg_1min"]["all"]) == 1 + 2 * 4
