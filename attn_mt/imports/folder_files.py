"""A model folder's files read as a hostile user may have written them: regular files only (never a
FIFO or a device), of bounded size (`FILE_MOST`), JSON files holding objects, weights that load as
tensors. A file that fails is refused in one line (CheckpointError) naming it.

Used by imports/marian.py and imports/attn_mt_folder.py.
Tested in tests/marian/test_marian_hostile.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

import torch

from attn_mt.checkpoint import CheckpointError

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
FILE_MOST = 256 << 20  # bytes of a JSON file or SentencePiece model (opus-mt's: a few MB)


def present(path: Path) -> bool:
    """Whether the folder has an entry of this name, of any kind (a broken link included): a FIFO or
    a device is then refused by `open_regular`, not taken as absent."""
    return path.exists() or path.is_symlink()


def open_regular(path: Path, most: int | None) -> BinaryIO:
    """`path` open for reading when it is a regular file (or a link to one) of at most `most` bytes
    (None: any size), else CheckpointError naming it. Opened without blocking, so a FIFO never
    waits for a writer, and checked (fstat) before a byte is read, so a device such as /dev/zero
    is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be opened ({e.strerror or e})") from None
    info = os.fstat(fd)
    too_big = most is not None and info.st_size > most
    problem = ("not a regular file" if not stat.S_ISREG(info.st_mode) else
               f"{info.st_size} bytes, more than the {most} it may have" if too_big else None)
    if problem:
        os.close(fd)
        raise CheckpointError(f"{path}: {problem}")
    if hasattr(os, "O_NONBLOCK"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path, most: int | None = None) -> bytes:
    """The bytes of a regular file of at most `most` bytes (None: FILE_MOST; `open_regular`), one
    that grows while read refused too."""
    most = FILE_MOST if most is None else most
    with open_regular(path, most) as f:
        data = f.read(os.fstat(f.fileno()).st_size + 1)  # its size, and a byte more to see it grow
    if len(data) > most:
        raise CheckpointError(f"{path}: more than the {most} bytes it may have")
    return data


def read_json(folder: Path, name: str, required: bool = True) -> dict:
    """A JSON file of the folder as a dict ({} when absent and not `required`)."""
    path = folder / name
    if not present(path):
        if required:
            raise CheckpointError(f"{folder}: a MarianMT folder without {name}")
        return {}
    text = read_regular(path)
    try:
        data = json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({str(e)[:120]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(data).__name__}, not an object")
    return data


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's weights by transformers' names (model.safetensors, else pytorch_model.bin):
    regular files, of any size."""
    if present(folder / WEIGHTS[0]):
        from safetensors.torch import load_file

        open_regular(folder / WEIGHTS[0], None).close()  # safetensors maps the file by its name
        try:
            return load_file(folder / WEIGHTS[0])
        except Exception as e:  # SafetensorError: truncated (half downloaded), damaged, other
            why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise CheckpointError(f"{folder / WEIGHTS[0]}: not readable weights (truncated or "
                                  f"damaged: {why})") from None
    if present(folder / WEIGHTS[1]):
        try:
            with open_regular(folder / WEIGHTS[1], None) as f:
                weights = torch.load(f, map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{folder / WEIGHTS[1]}: not readable weights "
                                  f"({type(e).__name__})") from None
        if not isinstance(weights, dict) or \
                not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise CheckpointError(f"{folder / WEIGHTS[1]}: not a dict of tensors")
        return weights
    raise CheckpointError(f"{folder}: a MarianMT folder without weights ({' or '.join(WEIGHTS)})")
