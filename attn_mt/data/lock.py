"""The lock that lets one process build a cache entry while the others wait.

A POSIX record lock (`fcntl.lockf`) on `<key>.lock`: it belongs to the process that took it, so the
tokenizing workers that process forks never hold it (an `flock` travels with the open file into
every child), and the kernel drops it when the holder dies, however it dies: a lock whose holder is
gone is simply taken. The file holds the holder's pid, for the waiting message and the cache survey,
and is removed by its holder on release; a waiter that wakes on a removed file opens the new one.

Record locks are per process: two threads of one process do not exclude each other (one build per
process at a time), and closing any descriptor of the file releases the process's lock on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from fcntl import LOCK_EX, LOCK_NB, lockf
from pathlib import Path

log = logging.getLogger(__name__)


@contextmanager
def exclusive(path: Path, what: str, wait: bool = True) -> Iterator[bool]:
    """Hold the lock at `path` for the block (True), waiting and saying so once while another
    process holds it; with `wait=False` the block gets False at once instead."""
    fd = _acquire(path, what, wait)
    if fd is None:
        yield False
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield True
    finally:
        with suppress(OSError):
            os.unlink(path)  # still held: no one can have taken the file we remove
        os.close(fd)


def _acquire(path: Path, what: str, wait: bool) -> int | None:
    said = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not _try(fd):
                if not wait:
                    os.close(fd)
                    return None
                if not said:
                    log.info("waiting for process %s preparing %s", _holder(fd) or "?", what)
                    said = True
                lockf(fd, LOCK_EX)
            if _is_current(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed this file as it let go: lock the one that replaced it


def holder(path: Path) -> int | None:
    """The pid holding the lock at `path`, 0 if its file names none, None if no process holds it
    (tested by taking it for a moment: not from a process that holds a lock of its own on
    `path`)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return None if _try(fd) else _holder(fd) or 0
    finally:
        os.close(fd)


def _try(fd: int) -> bool:
    try:
        lockf(fd, LOCK_EX | LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held by another process
        return False
    return True


def _holder(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).strip()
    return int(raw) if raw.isdigit() else None


def _is_current(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (not removed or replaced since it was opened)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
