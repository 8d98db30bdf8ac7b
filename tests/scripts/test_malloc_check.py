"""scripts/malloc_check.py on the toy config: both allocator settings, in fresh processes, taking
turns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TINY
from in_process import run_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_malloc_check_measures_both_settings(prestarted_bin, tmp_path):
    sets = [x for o in TINY for x in ("--set", o)]
    # the two settings run in processes the script starts: forks of prestarted_bin's python, each
    # setting its allocator as a fresh process does (no import of torch each)
    done = run_script("malloc_check", "--config", ROOT / "configs" / "toy.yaml", *sets, "--rounds",
                      "1", "--steps", "2", "--warmup", "1",
                      python=prestarted_bin / "python" / "python")
    assert done.returncode == 0, done.stderr
    rounds = re.findall(r"round 1 (system|attn-mt)\s+(\d+) tokens/s\s+(\d+) page faults/step",
                        done.stdout)
    assert sorted(name for name, _, _ in rounds) == ["attn-mt", "system"]
    assert all(int(tokens) > 0 for _, tokens, _ in rounds)
    assert re.search(r"median tokens/s: system \d+, attn-mt \d+ \(\d+\.\d\dx\)", done.stdout)
