"""models.check_memory: a model is measured on the meta device before anything is allocated, and one
that cannot fit is refused in one line naming the keys that size its largest table. The commands run
under an address-space limit (RLIMIT_AS) in a child process, so nothing large is ever really
allocated."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import write_config

LIMITED = """
import resource, sys
from attn_mt.cli import app  # torch and the CLI loaded first: the limit is what is left beyond them
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (4 << 30), resource.RLIM_INFINITY))  # 4 GiB more
sys.argv = ["attn-mt", "--quiet", *sys.argv[1:]]
app()
"""


def limited(*args) -> subprocess.CompletedProcess:
    """The CLI in a child process that can allocate 4 GiB more than torch and attn_mt take."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", LIMITED, *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                    reason="Linux: the limit counts /proc's address space")
@pytest.mark.parametrize("overrides,says", [
    (["model.positions=learned", "model.max_positions=1000000", "model.d_model=4096"],
     "pos.pe (1000000, 4096): 15.3 GiB, sized by model.max_positions and model.d_model)"),
    (["model.positions=interleaved", "model.max_positions=1000000", "model.d_model=1024"],
     "sized by model.max_positions and model.d_model"),  # computed through float64 temporaries
    (["model.d_model=8192", "model.d_ff=65536", "model.n_layers=8", "model.n_heads=8"],
     "sized by model.d_model and model.d_ff and model.n_layers"),
])
def test_a_model_too_large_for_memory_is_refused_before_allocation(tmp_path, overrides, says):
    sets = [a for o in overrides for a in ("--set", o)]
    out = limited("train", "-c", write_config(tmp_path / "c.yaml", "train.max_epochs=1"), *sets,
                  "--out", tmp_path / "run")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr[-2000:]
    assert (out.stderr.startswith("config error: model.") and says in out.stderr
            and "more than the" in out.stderr)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux")
def test_a_model_that_fits_trains_under_the_same_limit(tmp_path):
    out = limited("train", "-c", write_config(tmp_path / "c.yaml", "train.max_epochs=1",
                                              "train.bleu_sentences=5"),
                  "--out", tmp_path / "run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoint_best.pt").is_file()
