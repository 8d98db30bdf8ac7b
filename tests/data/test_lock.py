"""The build lock: held by the building process only, never by its forked children, taken over when
its holder dies, and waited for (said once) while its holder lives."""

import logging
import signal
import subprocess
import sys
from contextlib import contextmanager

from attn_mt.data.lock import exclusive, holder

HOLD = """
import os, signal, sys
from pathlib import Path
from attn_mt.data.lock import exclusive
with exclusive(Path(sys.argv[1]), "x"):
    child = os.fork()  # a worker, as datasets.map forks them, alive while its parent holds the lock
    if child == 0:
        signal.pause()  # until killed
        os._exit(0)
    print(child, flush=True)
    sys.stdin.readline()  # until the test lets go
"""


@contextmanager
def hold(path):
    """A process that takes the lock, forks a child and keeps both alive until a line on its stdin
    (`let_go`); yields (process, child pid), and kills both at the end."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    try:
        yield proc, child
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["kill", "-9", str(child)], check=False)


def let_go(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()


def test_a_killed_holder_s_lock_is_free_though_its_child_lives(tmp_path):
    lock = tmp_path / "k.lock"
    with hold(lock) as (proc, _child):
        assert holder(lock) == proc.pid
        with exclusive(lock, "x", wait=False) as mine:
            assert not mine
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # the forked child, still alive, does not hold it
        with exclusive(lock, "x", wait=False) as mine:
            assert mine
        assert not lock.exists()  # removed by its holder on release


def test_a_waiter_says_so_once_and_gets_the_lock_when_its_holder_lets_go(tmp_path, caplog):
    lock = tmp_path / "k.lock"

    class LetGoOnWait(logging.Handler):  # the holder lets go once the waiter has said that it waits
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting" in record.getMessage():
                let_go(proc)

    log, handler = logging.getLogger("attn_mt"), LetGoOnWait()
    with hold(lock) as (proc, _child):
        log.addHandler(handler)
        try:
            with caplog.at_level(logging.INFO, logger="attn_mt"), exclusive(lock,
                                                                            "the entry") as mine:
                assert mine
        finally:
            log.removeHandler(handler)
        waits = [r.message for r in caplog.records if "waiting" in r.message]
        assert waits == [f"waiting for process {proc.pid} preparing the entry"]
