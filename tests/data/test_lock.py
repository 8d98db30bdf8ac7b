"""The build lock: held by the building process only, never by its forked children, taken over when its
holder dies, and waited for (said once) while its holder lives."""

import logging
import signal
import subprocess
import sys

from attn_mt.data.lock import exclusive, holder

HOLD = """
import os, sys, time
from pathlib import Path
from attn_mt.data.lock import exclusive
with exclusive(Path(sys.argv[1]), "x"):
    child = os.fork()  # a worker, as datasets.map forks them, alive while its parent holds the lock
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(path, seconds: float) -> tuple[subprocess.Popen, int]:
    """A process that takes the lock, forks a child and keeps both alive for `seconds`; (process, child pid)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_a_killed_holder_s_lock_is_free_though_its_child_lives(tmp_path):
    lock = tmp_path / "k.lock"
    proc, child = hold(lock, 60)
    try:
        assert holder(lock) == proc.pid
        with exclusive(lock, "x", wait=False) as mine:
            assert not mine
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with exclusive(lock, "x", wait=False) as mine:  # the forked child, still alive, does not hold it
            assert mine
        assert not lock.exists()  # removed by its holder on release
    finally:
        proc.kill()
        subprocess.run(["kill", "-9", str(child)], check=False)


def test_a_waiter_says_so_once_and_gets_the_lock_when_its_holder_lets_go(tmp_path, caplog):
    lock = tmp_path / "k.lock"
    proc, child = hold(lock, 1.0)
    try:
        with caplog.at_level(logging.INFO, logger="attn_mt"), exclusive(lock, "the entry") as mine:
            assert mine
        waits = [r.message for r in caplog.records if "waiting" in r.message]
        assert waits == [f"waiting for process {proc.pid} preparing the entry"]
    finally:
        proc.kill()
        subprocess.run(["kill", "-9", str(child)], check=False)
