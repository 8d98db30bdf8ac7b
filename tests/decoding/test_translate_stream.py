"""attn-mt translate, live: a prompt on a terminal, and --stream on a pipe answer each line before
the next."""

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_mt.cli import app

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model; the 2 cores are shared
LINES = ["the dog sees a cat.", "a woman says that the men find a book."]
runner = CliRunner()


def _command(checkpoint: Path) -> list[str]:
    return [sys.executable, "-m", "attn_mt", "--quiet", "translate", "--checkpoint",
            str(checkpoint), "--beam", "1"]


def _read_until(fd: int, token: bytes, timeout: float = 60.0) -> bytes:
    """Bytes from `fd` until `token` has arrived (or the timeout, or EOF)."""
    buf, end = b"", time.monotonic() + timeout
    while token not in buf and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the pty's other side closed
                break
            if not chunk:
                break
            buf += chunk
    return buf


def _expected(checkpoint: Path) -> list[str]:
    result = runner.invoke(app, ["translate", "--checkpoint", str(checkpoint), "--beam", "1",
                                 *LINES])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _exported_or_checkpoint(tiny_run: Path, tmp_path: Path) -> Path:
    """The CTranslate2 export of the tiny run where ctranslate2 is installed, else its
    checkpoint."""
    try:
        from attn_mt.export.ctranslate2 import export_ct2

        export_ct2(tiny_run / "checkpoint_best.pt", tmp_path / "ct2")
        return tmp_path / "ct2"
    except ImportError:
        return tiny_run / "checkpoint_best.pt"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_terminal_gets_a_prompt_and_each_line_is_translated_as_entered(tiny_run):
    checkpoint = tiny_run / "checkpoint_best.pt"
    expected = _expected(checkpoint)
    master, slave = os.openpty()
    proc = subprocess.Popen(_command(checkpoint), stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                            env=ENV)
    os.close(slave)
    try:
        assert _read_until(master, b"> ").endswith(b"> ")  # the prompt, before any input
        for line, translation in zip(LINES, expected, strict=True):
            os.write(master, line.encode() + b"\n")
            # the terminal echoes the line, then our answer
            seen = _read_until(master, b"> ").decode()
            lines = [x for x in seen.replace("\r", "").split("\n") if x.strip()]
            # and the next prompt
            assert lines == [line, *[translation] * bool(translation.strip()), "> "], seen
        os.write(master, b"\x04")  # Ctrl-D: end of input
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        os.close(master)


@pytest.mark.slow
def test_stream_answers_each_line_before_the_next_arrives(tiny_run, tmp_path):
    checkpoint = _exported_or_checkpoint(tiny_run, tmp_path)  # the same code path for both
    expected = _expected(checkpoint)
    proc = subprocess.Popen([*_command(checkpoint), "--stream"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=ENV)
    try:
        for line, translation in zip(LINES, expected, strict=True):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()  # the pipe stays open: the answer must come without EOF
            assert _read_until(proc.stdout.fileno(), b"\n").decode() == translation + "\n"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()


@pytest.mark.slow
def test_stream_and_batched_output_agree(tiny_run):
    ckpt = str(tiny_run / "checkpoint_best.pt")
    text = "\n".join([*LINES, "", LINES[0]]) + "\n"
    batched = runner.invoke(app, ["translate", "--checkpoint", ckpt, "--format", "jsonl"],
                            input=text)
    streamed = runner.invoke(app, ["translate", "--checkpoint", ckpt, "--format", "jsonl",
                                   "--stream"], input=text)
    assert batched.exit_code == streamed.exit_code == 0
    assert streamed.stdout == batched.stdout and streamed.stdout.count("\n") == 4
    nbest = runner.invoke(app, ["translate", "--checkpoint", ckpt, "--beam", "3", "--nbest", "2",
                                "--stream", *LINES])
    assert [line.split(" ||| ")[0] for line in nbest.stdout.splitlines()] == ["0", "0", "1", "1"]
