"""scripts/core_size.py: the modules and lines a student's first run loads (the core; then with
attention recorded), and the stack at the first softmax."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_core_size_counts_what_a_first_run_loads_and_the_stack_at_the_first_softmax(tmp_path):
    sets = [x for o in TINY for x in ("--set", o)]
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "core_size.py"), "--json",
                           str(tmp_path / "c.json"), *sets], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads((tmp_path / "c.json").read_text())
    assert (got["modules"] == len(got["loaded"]) and {"attn_mt", "attn_mt.models.attention"}
            <= set(got["loaded"]))
    def lines(module: str) -> int:
        path = ROOT / module.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        return len(path.read_text().splitlines())

    assert got["lines"] == sum(lines(n) for n in got["loaded"])
    assert (got["stack"][0] == "attn_mt/api/training.py:train"
            and got["stack"][-1].startswith("attn_mt/models/"))
    assert got["frames"] == len(got["stack"])
    assert f"attn_mt modules loaded: {got['modules']}, {got['lines']} lines" in done.stdout
    # the same calls with attention recorded: the core and the recorder on top
    recording = got["recording"]
    assert ("attn_mt.analysis.history" in recording["added"]
            and "attn_mt.analysis.history" not in got["loaded"])
    assert (recording["modules"] == got["modules"] + len(recording["added"])
            and recording["lines"] > got["lines"])
