"""Run a script of scripts/ in the test's process, as `python scripts/NAME.py ARGS` runs it: its
argv and `__main__`, its stdout, stderr and exit status, without the 2-3 s a fresh interpreter takes
to import torch. For the scripts whose own work needs no process of its own (those that measure a
fresh process start one themselves)."""

from __future__ import annotations

import io
import logging
import runpy
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run_script(script: str | Path, *args, python: Path | None = None
               ) -> subprocess.CompletedProcess:
    """`script` (a name in scripts/, or a path) run with `args`: what `subprocess.run(...,
    capture_output=True, text=True)` of it would return; with `python`, that is its sys.executable
    (the processes it starts: prestarted_bin's python/python). sys.argv, sys.path,
    sys.executable, the root logger's handlers and torch's thread count are as they were
    afterwards."""
    import torch

    path = Path(script) if isinstance(script, Path) else SCRIPTS / f"{script}.py"
    argv = [str(path), *map(str, args)]
    saved = (sys.argv, sys.path[:], logging.getLogger().handlers[:], torch.get_num_threads(),
             sys.executable)
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv, sys.executable = argv, str(python or sys.executable)
    sys.path.insert(0, str(path.parent))  # as `python SCRIPT` has it
    try:
        with redirect_stdout(out), redirect_stderr(err):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:  # sys.exit(n), sys.exit("message") or argparse's error
        if isinstance(e.code, str):
            err.write(e.code + "\n")
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv, sys.path[:], logging.getLogger().handlers[:] = saved[0], saved[1], saved[2]
        torch.set_num_threads(saved[3])
        sys.executable = saved[4]
    return subprocess.CompletedProcess(["python", *argv], code, out.getvalue(), err.getvalue())
