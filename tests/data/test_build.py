"""Building a cache entry: a `prepare` killed while its workers tokenize leaves no process and no
lock behind."""

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from conftest import cli, wait_until

from attn_mt.cli import app
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


def forked(args: list[str]) -> int:
    """`attn-mt ARGS` in a child forked from this process, its output dropped: a real process to
    signal, without a fresh interpreter importing the libraries again."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):  # as a fresh process has them
                signal.signal(sig, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            app(args, prog_name="attn-mt")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            os._exit(code)
    return pid


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_while_tokenizing_leaves_no_process_and_no_lock(tmp_path):
    torch.set_num_threads(1)  # forked children: a single-threaded parent is safe to fork
    data = tmp_path / "data"
    data.mkdir()
    n = BIG  # the smallest training split that is tokenized in worker processes
    for split, size in (("train", n), ("valid", 5), ("test", 5)):
        for lang, shift in (("en", 0), ("de", 3)):
            (data / f"{split}.{lang}").write_text("".join(
                f"{WORDS[(i + shift) % 14]} {WORDS[(i // 14 + shift) % 14]} "
                f"{WORDS[(i // 196) % 14]} {i % 1000}\n" for i in range(size)))
    (tmp_path / "c.yaml").write_text("name: kill\n")
    args = ["prepare", "-c", str(tmp_path / "c.yaml")]
    for item in ("data.source=files", f"data.dir={data}", "data.src_lang=en", "data.tgt_lang=de",
                 "data.num_proc=2", f"data.cache_dir={tmp_path / 'cache'}",
                 "tokenizer.vocab_size=64", "tokenizer.sample_sentences=1000"):
        args += ["--set", item]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pid = forked(args)
        # the tokenizing workers, forked once the tokenizer is trained
        wait_until(lambda p=pid: len(children(p)) >= 2 or os.waitpid(p, os.WNOHANG)[0],
                   timeout=120, interval=0.02, what="prepare to fork its tokenizing workers")
        workers = children(pid)
        assert len(workers) >= 2, "prepare never forked its tokenizing workers"
        os.kill(pid, sig)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -sig
        wait_until(lambda w=workers: all(map(gone, w)), interval=0.05,
                   what=f"the workers of a {sig.name}'d prepare to end")
    # the lock is free: no wait
    out = cli(*args, quiet=False)
    assert out.exit_code == 0, out.output
    assert f"{n} training pairs" in out.stdout and "waiting for" not in out.stderr
    key = out.stdout.splitlines()[0].rsplit("/", 1)[1]
    # no leftover build, no lock file
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [key]
