"""A pre-started `attn-mt` for tests that run many commands (README's examples): one process imports
torch and attn-mt once, and forks a child per command; the command's `attn-mt` on PATH is a small
client that hands the child its arguments, folder, environment and standard streams, forwards
SIGINT/SIGTERM/SIGHUP to it and exits with its status. A command then starts in milliseconds, not
the 2-3 s of importing torch (and, for training, torch._dynamo, which the optimizers import).
`python/python SCRIPT ARGS` (or `-m MODULE ARGS`, `-c CODE ARGS`) runs a script so, and is the
child's sys.executable: what a script starts with it (a server, a measured run) is a fork too.

The child runs what the installed `attn-mt` runs (`attn_mt.cli:app`, as `python -m attn_mt` does),
or the script as `__main__`, in a fresh fork of a process that ran no torch operation: no thread
pools were started before the fork. Where the server is gone, the client runs the real command
instead.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import socket
import struct
import subprocess
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

# imported once, before any fork: what the documented commands need (optional extras where
# installed)
PRELOAD = ("torch", "torch._dynamo", "attn_mt.cli", "attn_mt.api.commands", "attn_mt.api.terminal",
           "attn_mt.training.run", "attn_mt.data.build", "attn_mt.decoding.translator",
           "attn_mt.measure.bench", "attn_mt.measure.compare", "sacrebleu", "sentencepiece",
           "datasets", "ctranslate2", "transformers", "fastapi", "uvicorn", "matplotlib.pyplot")

CLIENT = '''#!{python}
"""{name} through the pre-started server at {socket} (tests/prestarted.py)."""
import json, os, signal, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({socket!r})
except OSError:  # the server is gone: the real command
    os.execv({real!r}, [{real!r}, *sys.argv[1:]])
msg = json.dumps({{"program": {name!r}, "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": dict(os.environ)}}).encode()
socket.send_fds(s, [struct.pack("!I", len(msg))], [0, 1, 2])
s.sendall(msg)
answers = s.makefile("rb")
pid = int(answers.readline())
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda n, _: os.kill(pid, n))
status = answers.readline()
sys.exit(int(status) if status.strip() else 128 + signal.SIGTERM)  # no status: killed by a signal
'''


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    size, body = struct.unpack("!I", head)[0], b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), fds


def _python(argv: list[str]) -> None:
    """`python SCRIPT ARGS`, `python -m MODULE ARGS` or `python -c CODE ARGS`, with the argv and
    sys.path python gives them."""
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


def _run(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the child: become the command (streams, folder, environment, argv), run it, report,
    exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command may wait for its own children
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    conn.sendall(f"{os.getpid()}\n".encode())
    script = request["program"] == "python"
    sys.argv = request["argv"] if script else ["attn-mt", *request["argv"]]
    status = 0
    try:
        if script:
            _python(sys.argv)
        else:
            from attn_mt.cli import app

            app(prog_name="attn-mt")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the command's traceback, as the real one would print it
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that left (`| head`)
            pass
    conn.sendall(f"{status}\n".encode())
    os._exit(status)


def serve(path: str) -> None:
    """The server: preload, then one fork per connection (children reap themselves)."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError, struct.error):
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            # the python that runs it, as python has it
            sys.executable = os.path.join(os.path.dirname(path), "python", "python")
            _run(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


@contextmanager
def prestarted(folder: Path):
    """A folder with the client as `attn-mt` (put it first on PATH), and as `python/python`, while
    the server runs."""
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "attn-mt.sock")
    attn_mt = str(Path(sys.executable).parent / "attn-mt")
    proc = subprocess.Popen([sys.executable, __file__, path], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the pre-started attn-mt did not start")
        (folder / "python").mkdir(exist_ok=True)
        for client, real in ((folder / "attn-mt", attn_mt),
                             (folder / "python" / "python", sys.executable)):
            client.write_text(CLIENT.format(python=sys.executable, socket=path, real=real,
                                            name=client.name),
                              encoding="utf-8")
            client.chmod(0o755)
        yield folder
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    serve(sys.argv[1])
