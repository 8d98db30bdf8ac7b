"""Text files of one sentence a line, read safely: in chunks (memory stays flat for any corpus), as
UTF-8 with the file and line of bad bytes named (`DataError`), two files line-aligned
(`read_aligned`), or the lines to translate from arguments, a file or stdin (`input_lines`).

Tested in tests/data/test_sources.py, tests/data/test_corpus.py and tests/test_cli.py.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from attn_mt.errors import InputError


class DataError(InputError):
    """Unusable data; the message names the file, line or split."""


# lines (or rows) read, checked and converted at a time: memory stays flat for any corpus size
CHUNK = 100_000

def open_data(path: Path) -> BinaryIO:
    """A data file opened for reading; DataError names it if it is missing or unreadable."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_data(path) as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def line_chunks(path: Path, size: int = CHUNK) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file, stripped, `size` at a time; DataError names the file and line
    of bad bytes."""
    with open_data(path) as f:
        done = 0
        # binary lines end at b"\n" only, like str.split("\n")
        while chunk := list(itertools.islice(f, size)):
            raw = b"".join(chunk)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                line = done + raw.count(b"\n", 0, e.start) + 1
                raise DataError(f"{path}:{line}: invalid UTF-8 (byte "
                                f"{raw[e.start]:#04x})") from None
            lines = text.split("\n")
            if raw.endswith(b"\n"):
                lines.pop()
            done += len(chunk)
            yield [line.strip() for line in lines]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, stripped; DataError names the file and line of bad bytes."""
    return [line for chunk in line_chunks(path) for line in chunk]


def input_lines(texts: list[str] | None, path: Path | None, prompt: str = "") -> Iterator[str]:
    """Lines to translate from arguments, a file, or stdin, without their newlines; `prompt` goes to
    stderr before each stdin line is read (interactive use)."""
    if texts:
        yield from texts
    elif path is not None:
        yield from read_lines(path)
    else:  # bytes that are not UTF-8 become U+FFFD instead of ending the run
        # lines end at "\n" only (a lone "\r" inside a line is text, as in translate's input);
        # "\r\n" is stripped
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")
        while True:  # readline, not iteration: each line is handed on as soon as it arrives
            sys.stderr.write(prompt)
            sys.stderr.flush()
            line = stdin.readline()
            if not line:
                break
            yield line.removesuffix("\n").removesuffix("\r")
        if prompt:
            sys.stderr.write("\n")  # end the prompt line at EOF


def read_aligned(src: Path, ref: Path) -> tuple[list[str], list[str]]:
    """The lines of two line-aligned files (sources and their references); DataError if their counts
    differ."""
    sources, refs = read_lines(src), read_lines(ref)
    if len(sources) != len(refs):
        raise DataError(f"line counts differ: {src} has {len(sources)} lines, {ref} has "
                        f"{len(refs)}")
    return sources, refs
