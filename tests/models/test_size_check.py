"""models.check_memory: a model is measured on the meta device before anything is allocated, and one
that cannot fit is refused in one line naming the keys that size its largest table. The commands run
under an address-space limit (RLIMIT_AS) in one child process, each in a fork of it, so nothing
large is ever really allocated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_config

# torch, the CLI and the training run loaded first: the limit is what is left beyond them, and each
# command's fork starts without importing them again
LIMITED = """
import json, os, resource, sys, traceback
import torch, attn_mt.training.run
from attn_mt.cli import app
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (4 << 30), resource.RLIM_INFINITY))  # 4 GiB more
answers = []
for i, args in enumerate(json.loads(sys.argv[1])):
    err = os.path.join(sys.argv[2], f"{i}.err")
    pid = os.fork()
    if pid == 0:  # the command, as its own process: its stderr to a file, its exit status
        for target, name in ((1, os.devnull), (2, err)):
            os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT), target)
        sys.argv, code = ["attn-mt", "--quiet", *args], 1
        try:
            app()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    answers.append({"returncode": status, "stderr": open(err).read()})
print(json.dumps(answers))
"""

REFUSED = [
    (["model.positions=learned", "model.max_positions=1000000", "model.d_model=4096"],
     "pos.pe (1000000, 4096): 15.3 GiB, sized by model.max_positions and model.d_model)"),
    (["model.positions=interleaved", "model.max_positions=1000000", "model.d_model=1024"],
     "sized by model.max_positions and model.d_model"),  # computed through float64 temporaries
    (["model.d_model=8192", "model.d_ff=65536", "model.n_layers=8", "model.n_heads=8"],
     "sized by model.d_model and model.d_ff and model.n_layers"),
]
LINUX = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                           reason="Linux: the limit counts /proc's address space")


def limited(tmp: Path, *commands: list) -> list[dict]:
    """Each command's exit status and stderr, run by the CLI in a child process that can allocate
    4 GiB more than torch and attn_mt take."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", LIMITED,
                           json.dumps([list(map(str, c)) for c in commands]), str(tmp)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The refused models' commands, then one that fits (its run folder returned), in one child."""
    tmp = tmp_path_factory.mktemp("size_check")
    config = write_config(tmp / "c.yaml", "train.max_epochs=1")
    # two steps and short test translations: what is checked is that it trains under the limit
    fits = write_config(tmp / "fits.yaml", "train.max_steps=2", "train.bleu_sentences=5",
                        "decode.max_len_a=0", "decode.max_len_b=4")
    commands = [["train", "-c", config, *[a for o in overrides for a in ("--set", o)], "--out",
                 tmp / f"run{i}"] for i, (overrides, _) in enumerate(REFUSED)]
    return tmp / "fits", limited(tmp, *commands, ["train", "-c", fits, "--out", tmp / "fits"])


@LINUX
@pytest.mark.parametrize("case", range(len(REFUSED)))
def test_a_model_too_large_for_memory_is_refused_before_allocation(answers, case):
    out, says = answers[1][case], REFUSED[case][1]
    assert out["returncode"] == 2, out["stderr"][-2000:]
    assert "Traceback" not in out["stderr"] and len(out["stderr"].splitlines()) == 1, \
        out["stderr"][-2000:]
    assert (out["stderr"].startswith("config error: model.") and says in out["stderr"]
            and "more than the" in out["stderr"])


@LINUX
def test_a_model_that_fits_trains_under_the_same_limit(answers):
    run, out = answers[0], answers[1][-1]
    assert out["returncode"] == 0, out["stderr"][-2000:]
    assert (run / "checkpoint_best.pt").is_file()
