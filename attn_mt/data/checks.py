"""Arguments checked at the door: every bad value is an `InputError` naming its argument, never a
TypeError from deep inside (torch, the config, range(), SentencePiece). The public API (api/) and
the analysis functions (`inside`, `without`, `model_view`, the views' `save_html`) use these, one
set of rules: here because analysis/ may not import api/.

    >>> integer(1.5, "beam")
    InputError: beam: must be an integer >= 1, not 1.5

Every text that passes `text` or `texts` comes back `clean`: a lone surrogate ("\\ud800", from JSON
or undecodable argv bytes) is not text SentencePiece takes, and becomes U+FFFD, as decoding's own
inputs do.

One job: argument types and ranges; what a value means is the caller's.

Tested in tests/api/test_arguments.py, tests/api/test_fuzz_api.py and
tests/analysis/test_fuzz_analysis.py.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from attn_mt.errors import AttnMTError, InputError

SURROGATE = re.compile("[\ud800-\udfff]")
# the class `model` takes, by name: nothing below api/ may import it
MODEL = "attn_mt.api.model.Model"
SEEDS = 2**64  # a torch.Generator's seeds: 0 .. 2**64 - 1


def shown(value: object) -> str:
    """A value as an error message quotes it: its repr, at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def clean(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (the one rule for every text argument and
    input)."""
    return SURROGATE.sub("\ufffd", text)


def integer(value: object, field: str, least: int | None = 1) -> int:
    """`value` as an int >= `least` (None: any); bools, floats ("1.0" or 1.0) and strings are
    refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (
            least is not None and int(value) < least):
        at_least = f" >= {least}" if least is not None else ""
        raise InputError(f"must be an integer{at_least}, not {shown(value)}", field)
    return int(value)


def number(value: object, field: str, least: float | None = None) -> float:
    """`value` as a finite float (>= `least` where given); bools and strings are refused."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
        or not math.isfinite(float(value)) or (
            least is not None and float(value) < least)):
        at_least = f" >= {least:g}" if least is not None else ""
        raise InputError(f"must be a finite number{at_least}, not {shown(value)}", field)
    return float(value)


def seed(value: object, field: str = "seed") -> int:
    """A random seed: an int from 0 to 2**64 - 1 (torch's range; beyond it torch fails with a bare
    ValueError)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
        or not 0 <= int(value) < SEEDS):
        raise InputError(f"must be an integer from 0 to 2**64 - 1, not {shown(value)}", field)
    return int(value)


def boolean(value: object, field: str) -> bool:
    """True or False; 1, "yes" and None are refused (a bool argument is a switch, not a truth
    value)."""
    if not isinstance(value, bool):
        raise InputError(f"must be True or False, not {shown(value)}", field)
    return value


def text(value: object, field: str, *, empty: bool = False) -> str:
    """One sentence, `clean`: a string (not empty unless `empty`); a list says that one sentence is
    expected."""
    if not isinstance(value, str):
        many = isinstance(value, Iterable) and not isinstance(value, bytes | Mapping)
        hint = " (one sentence: call it once per sentence)" if many else ""
        raise InputError(f"expected a string{hint}, not {type(value).__name__}", field)
    if not empty and not value.strip():
        raise InputError("the sentence is empty", field)
    return clean(value)


def choice(value: object, field: str, allowed: Iterable[str]) -> str:
    """One of `allowed` (strings)."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{shown(value)} is not one of {', '.join(allowed)}", field)
    return value


def texts(value: object, field: str, *, files: bool = True) -> tuple[list[str], bool]:
    """(the texts as a list, each `clean`; whether one string was given): a string, a Path to a file
    of lines (where `files`), or any iterable of strings (a list, a tuple, a generator: read once).
    A dict, bytes, or an item that is not a string are refused, naming the item."""
    if isinstance(value, str):
        return [clean(value)], True
    if isinstance(value, os.PathLike) and files:
        from attn_mt.data.lines import read_lines

        try:
            return [clean(line) for line in read_lines(Path(value))], False
        except AttnMTError as e:  # the file's errors name it in their message
            raise e.naming(field) from None
    if (isinstance(value, bytes | bytearray | Mapping | os.PathLike)
        or not isinstance(value, Iterable)):
        raise InputError(f"expected a string or an iterable of strings (a list, a generator), not "
                         f"{type(value).__name__}", field)
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InputError(f"item {i} is {type(item).__name__}, not a string", field)
    return [clean(item) for item in items], False


def path(value: object, field: str = "path") -> Path:
    """A file or folder name (a non-empty string or a Path) that the file system takes, as a
    Path."""
    name = (os.fspath(value) if isinstance(value, str | os.PathLike)
            and not isinstance(value, bytes) else None)
    if not isinstance(name, str) or not name.strip():
        what = "an empty string" if isinstance(name, str) else type(value).__name__
        raise InputError(f"expected a file name (a string or a Path), not {what}", field)
    try:
        encoded = os.fsencode(name)
    except UnicodeError:  # a lone surrogate that is not an undecodable byte
        encoded = b"\0"
    if b"\0" in encoded:
        raise InputError(f"{shown(value)} is not a file name (a NUL byte, or not text)", field)
    return Path(name)


def model(value: object, field: str = "model") -> None:
    """An `attn_mt.Model` (what `attn_mt.load` gives, or a subclass); a path is told to be loaded
    first."""
    if not any(f"{c.__module__}.{c.__qualname__}" == MODEL for c in type(value).__mro__):
        hint = (" (open it first: attn_mt.load(path))" if isinstance(value, str | os.PathLike)
                else "")
        raise InputError(f"expected an attn_mt.Model{hint}, not {type(value).__name__}", field)
