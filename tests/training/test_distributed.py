"""torchrun with 2 CPU processes (gloo): one set of outputs, same losses as 1 process, no hangs."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until, write_config

from attn_mt import checkpoint
from attn_mt.analysis.history import Recorder, load_history
from attn_mt.config import load_config
from attn_mt.training.run import train

# the venv's torchrun (pytest may run as .venv/bin/python without the venv on PATH), else PATH's
_VENV_TORCHRUN = Path(sys.executable).parent / "torchrun"
TORCHRUN = ((str(_VENV_TORCHRUN) if _VENV_TORCHRUN.exists() else shutil.which("torchrun"))
            or pytest.skip(
    "torchrun not found", allow_module_level=True))
pytestmark = pytest.mark.slow


def torchrun(*args: str, program: tuple[str, ...] = ("-m", "attn_mt")) -> list[str]:
    # the command the README gives; --standalone picks a free port, so parallel runs do not collide
    return [TORCHRUN, "--standalone", "--nproc-per-node", "2", *program, *args]


# `python -m attn_mt` in which each call of `module.name` whose `args` make the expression `when`
# true is followed by `seconds` of sleep: a pause as long on any machine, costing no CPU
HELD = """
import runpy, time
import {module} as m

def held(*args, **kwargs):
    out = real(*args, **kwargs)
    if {when}:
        time.sleep({seconds})
    return out

real, m.{name} = m.{name}, held
runpy.run_module("attn_mt", run_name="__main__")
"""
TIMEOUT_S = 2  # the resumed job's group timeout


def held(path: Path, module: str, name: str, when: str, seconds: float) -> tuple[str, ...]:
    """`torchrun`'s program: HELD written to `path`."""
    path.write_text(HELD.format(module=module, name=name, when=when, seconds=seconds))
    return (str(path),)


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1"}


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_crashed_rank_ends_the_job_and_two_processes_resumed_match_one(tmp_path):
    """A job whose rank 1 is killed ends (no hang); resumed, it trains as one process does."""
    cfg = write_config(tmp_path / "tiny.yaml", "train.max_steps=8", "train.eval_every=4",
                       "train.log_every=4", "train.checkpoint_every=2")
    one, two = tmp_path / "one", tmp_path / "two"
    # rank 0 sleeps after step 2's checkpoint, rank 1 waiting for it: killed there. The job that
    # crashes is the one that is resumed (a torchrun job fewer than a crash of its own).
    job = subprocess.Popen(torchrun("train", "--config", str(cfg), "--out", str(two),
                                    program=held(tmp_path / "crash.py", "attn_mt.checkpoint",
                                                 "save", "args[1].name == 'checkpoint_last.pt'",
                                                 600)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                           start_new_session=True)
    try:
        wait_until(lambda: (two / "checkpoint_last.pt").exists() or job.poll() is not None,
                   timeout=120, interval=0.1, what="training to start")
        assert job.poll() is None, "training ended before a checkpoint"
        rank1 = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                 and _is_rank(p, job.pid, "1")]
        assert rank1, "rank 1 not found"
        os.kill(int(rank1[0].name), signal.SIGKILL)
        job.wait(timeout=120)  # the job must end, not hang
        assert job.returncode != 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert checkpoint.load(two / "checkpoint_last.pt")["step"] == 2

    # the one-process run, in this process (one torch thread, as the ranks), recording its
    # attention as the CLI's does
    train(load_config(cfg, []), one, observers=(Recorder(one),))
    # resumed to step 12 (the one-process run stops at 8); the same job shows that rank 0 tests
    # alone, without a barrier to time out (one torchrun job fewer than a run of its own: 4-5 s):
    # the other ranks leave when training ends, and rank 0's testing outlasts the group timeout.
    # Decoding settings may change on resuming.
    sets = ("train.max_steps=12", "train.bleu_sentences=4", "decode.beam_size=2",
            "decode.max_len_b=5")
    multi = subprocess.run(torchrun("train", "--config", str(cfg), "--out", str(two), "--resume",
                                    *(x for s in sets for x in ("--set", s)),
                                    program=held(tmp_path / "test.py", "attn_mt.training.finish",
                                                 "score_test_split", "True", TIMEOUT_S + 1)),
                           capture_output=True, text=True,
                           env={**env(), "ATTN_MT_DIST_TIMEOUT_S": str(TIMEOUT_S)}, timeout=600)
    assert multi.returncode == 0, multi.stderr[-2000:]
    assert multi.stdout.count("best checkpoint:") == 1  # rank 0 alone reports and writes
    assert "2 processes" in multi.stderr
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [4, 8] and [r["step"] for r in b] == [4, 8, 12]
    for ra, rb in zip(a, b[:2], strict=True):
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-3)
        assert rb["valid_loss"] == pytest.approx(ra["valid_loss"], rel=1e-3)
    assert sorted(p.name for p in two.iterdir() if not p.name.startswith(".")) == \
        sorted(p.name for p in one.iterdir() if not p.name.startswith("."))
    # rank 0 records (step 0 too), and rewinds on resume
    assert load_history(two).steps == [0, 4, 8, 12]
    assert json.loads((two / "results.json").read_text())["steps"] == 12


def _is_rank(proc: Path, root_pid: int, rank: str) -> bool:
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
        parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return parent == root_pid and f"RANK={rank}".encode() in environ

