"""Building a cache entry: a `prepare` killed while its workers tokenize leaves no process and no
lock behind."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until

from attn_mt.data.build import BIG

WORDS = "the a dog cat sees runs house tree big small red green old young".split()


def children(pid: int) -> set[int]:
    """Processes whose parent is `pid`, from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for its new parent to reap it holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_while_tokenizing_leaves_no_process_and_no_lock(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    n = BIG  # the smallest training split that is tokenized in worker processes
    for split, size in (("train", n), ("valid", 5), ("test", 5)):
        for lang, shift in (("en", 0), ("de", 3)):
            (data / f"{split}.{lang}").write_text("".join(
                f"{WORDS[(i + shift) % 14]} {WORDS[(i // 14 + shift) % 14]} "
                f"{WORDS[(i // 196) % 14]} {i % 1000}\n" for i in range(size)))
    (tmp_path / "c.yaml").write_text("name: kill\n")
    cmd = [sys.executable, "-m", "attn_mt", "prepare", "-c", str(tmp_path / "c.yaml")]
    for item in ("data.source=files", f"data.dir={data}", "data.src_lang=en", "data.tgt_lang=de",
                 "data.num_proc=2", f"data.cache_dir={tmp_path / 'cache'}",
                 "tokenizer.vocab_size=64", "tokenizer.sample_sentences=1000"):
        cmd += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # the tokenizing workers, forked once the tokenizer is trained
        wait_until(lambda p=proc: len(children(p.pid)) >= 2 or p.poll() is not None, timeout=120,
                   interval=0.02, what="prepare to fork its tokenizing workers")
        workers = children(proc.pid)
        assert len(workers) >= 2, "prepare never forked its tokenizing workers"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
        wait_until(lambda w=workers: all(map(gone, w)), interval=0.05,
                   what=f"the workers of a {sig.name}'d prepare to end")
    # the lock is free: no wait
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{n} training pairs" in out.stdout and "waiting for" not in out.stderr
    key = out.stdout.splitlines()[0].rsplit("/", 1)[1]
    # no leftover build, no lock file
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [key]
