"""Files a user keeps: written atomically (a file, or a finished folder put in place), and output
paths checked before any work is done.

Here, below everything (it imports nothing of attn_mt but the errors), so that every part can write
through it: the data download as well as checkpoints and reports. Tested in tests/test_files.py.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from attn_mt.errors import InputError


class OutputError(InputError):
    """An output path that cannot be written as asked; the message names it by `option`, the
    argument as its caller spells it ("out", "json")."""

    def __init__(self, message: str, option: str) -> None:
        # the message starts with the option and the path
        super().__init__(message, option, named=True)
        self.option = option


HOST = socket.gethostname().replace("/", "_")  # temp names say which machine's process writes them


def open_new(folder: Path, prefix: str, suffix: str) -> tuple[BinaryIO, Path]:
    """(file open for writing, its path): a new file `folder/{prefix}{random}{suffix}` for an atomic
    write, created with O_EXCL, so a file or symlink planted under a name it could take is never
    followed or overwritten; its mode is 0666 less the umask, as for any other file the run
    writes."""
    for _ in range(100):
        tmp = Path(folder) / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        return os.fdopen(fd, "wb"), tmp
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(Path(folder) / prefix))


def write_atomic(path: Path, data: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Write `data` (bytes, text as UTF-8, or a function that writes to the open file) to `path`: a
    new temporary file beside it (O_EXCL, `.NAME.HOST.RANDOM.PID.tmp`), fsync, rename, fsync the
    folder. A kill at any moment leaves the old file or the new one; a planted link is replaced,
    never followed. Raises OSError (the temporary file is removed)."""
    path, tmp = Path(path), None
    try:
        f, tmp = open_new(path.parent, f".{path.name}.{HOST}.", f".{os.getpid()}.tmp")
        with f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        sync_folder(path.parent)  # make the rename itself durable
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def remove_orphans(path: Path, every: bool = False) -> None:
    """Remove the temporary files `write_atomic` left beside `path` in processes of this machine
    that were killed while writing (their pid, which the name holds, no longer runs); with `every`,
    those of every file in the folder `path`."""
    folder, name = (Path(path), "*") if every else (Path(path).parent, Path(path).name)
    for tmp in folder.glob(f".{name}.{HOST}.*.tmp"):
        if _writer_gone(tmp):
            tmp.unlink(missing_ok=True)


def _writer_gone(tmp: Path) -> bool:
    """True when the process of this machine whose pid the temp file's name holds no longer runs."""
    pid = tmp.name.removesuffix(".tmp").rpartition(".")[2]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, but another user's
        return False
    return False


def sync_folder(folder: Path) -> None:
    """fsync a folder: the names created, replaced or removed in it are on disk (after a rename: the
    rename)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_folder(tmp: Path, out: Path) -> None:
    """Rename the finished folder `tmp` (beside `out`) to `out`: an existing `out` is moved aside
    first, put back if the rename fails, and removed only once `tmp` is in place; then the rename is
    made durable."""
    if not out.exists():
        os.rename(tmp, out)
        sync_folder(out.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.rename(out, old / out.name)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old / out.name, out)  # put the previous folder back
        shutil.rmtree(old, ignore_errors=True)
        raise
    sync_folder(out.parent)
    shutil.rmtree(old, ignore_errors=True)


def replace_entries(tmp: Path, out: Path) -> None:
    """Like `replace_folder`, for an `out` that must stay where it is (the working directory): its
    entries (an earlier export's, see _check) are moved aside, `tmp`'s moved in, and the old ones
    removed last."""
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    aside, placed = [], []
    try:
        for name in os.listdir(out):
            os.rename(out / name, old / name)
            aside.append(name)
        for name in os.listdir(tmp):
            os.rename(tmp / name, out / name)
            placed.append(name)
    except BaseException:  # put the previous folder back
        for name in placed:
            remove(out / name)
        for name in aside:
            os.rename(old / name, out / name)
        shutil.rmtree(old, ignore_errors=True)
        raise
    os.rmdir(tmp)
    sync_folder(out)
    shutil.rmtree(old, ignore_errors=True)


def remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder and everything in it; nothing if
    absent."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# the files and folders this process read a model from: no report is written there
MODELS: set[Path] = set()


def mark_model(path: Path | str) -> None:
    """Remember that a model was read from `path` (a checkpoint file or a model folder):
    `check_report` then refuses to write a report over it or into it."""
    if Path(path).exists():  # not a hub name
        MODELS.add(Path(path).resolve())


def check_report(path: Path | str, option: str = "path", folders: Sequence[Path] = ()) -> None:
    """Refuse (OutputError naming `option`) a report written over a model file or into a model
    folder: one this process read a model from (`mark_model`), or one of `folders`."""
    real = Path(path).resolve()
    for model in [*MODELS, *(Path(f).resolve() for f in folders)]:
        inside = model in real.parents or real == model
        if inside or (model.is_file() and real.is_file() and os.path.samefile(model, real)):
            what = "the model folder" if model.is_dir() else "the model file"
            raise OutputError(f"{option} {path}: would overwrite {what} {model}; write reports "
                              "elsewhere", option)


def write_report(path: Path | str, data: bytes | str | Callable[[BinaryIO], None],
                 option: str = "path") -> Path:
    """`write_atomic` for a report (JSON, HTML, PNG): refused over a model file or into a model
    folder."""
    check_report(path, option)
    write_atomic(Path(path), data)
    return Path(path)


def check_outputs(outputs: Sequence[tuple[str, Path | str | None, Sequence[str] | None]],
                  inputs: Sequence[Path | str | None] = ()) -> None:
    """Refuse (OutputError naming the option) an output path that cannot be written as asked, before
    any work: the one check of every command that writes a file. `outputs` are (option name, path or
    None, allowed suffixes such as (".json",), or None for a folder the command creates or fills); a
    file must end in one of its suffixes, not be a folder, not be one of `inputs` (by its resolved
    path or as the same file: a symlink, a hard link) nor another output, nor lie in an input that
    is a folder (a MarianMT or export folder: every file a model is read from), and its folder must
    exist and be writable; a folder must not be an input nor another file, and the nearest of it and
    its parents that exists must be a writable folder."""
    taken: dict[Path, str] = {}
    folders = [Path(name) for name in inputs if name is not None and Path(name).is_dir()]
    for name in inputs:
        if name is not None:
            taken[Path(name).resolve()] = f"the input {name}"
    for option, path, suffixes in outputs:
        if path is None:
            continue
        path = Path(path)
        what = f"{option} {path}"
        if suffixes is None:  # a folder: its own files' names, never an input's
            _check_folder(path, what, option)
        elif path.suffix.lower() not in suffixes:
            raise OutputError(f"{what}: the file name must end in {' or '.join(suffixes)}", option)
        elif path.is_dir():
            raise OutputError(f"{what}: a folder; give a file name", option)
        else:
            _check_folder(path.parent, what, option, made=False)
            check_report(path, option, folders)
        real = path.resolve()
        same = taken.get(real) or next((taken[p] for p in taken if p.exists() and real.exists()
                                        and os.path.samefile(p, real)), None)
        if same:
            raise OutputError(f"{what}: the same file as {same}; write it to another file", option)
        taken[real] = option


def _check_folder(folder: Path, what: str, option: str, made: bool = True) -> None:
    """Refuse a folder that cannot take new files; `made`: one the command creates with its parents,
    so the nearest of it and its parents that exists is the one checked."""
    found = next((f for f in (folder, *folder.parents) if f.exists()), folder) if made else folder
    if found.exists() and not found.is_dir():
        raise OutputError(f"{what}: {found} is a file, not a folder", option)
    if not found.is_dir():
        raise OutputError(f"{what}: folder {folder} does not exist", option)
    if not os.access(found, os.W_OK | os.X_OK):
        raise OutputError(f"{what}: folder {found} is not writable", option)
