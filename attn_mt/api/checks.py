"""The public API's arguments, checked at the door: every bad value is an `InputError` naming its argument,
never a TypeError from deep inside (torch, the config, range()).

    >>> integer(1.5, "beam")
    InputError: beam: must be an integer >= 1, not 1.5

One job: argument types and ranges; what a value means is the caller's.

Tested in tests/api/test_arguments.py (and fuzzed in tests/api/test_fuzz_api.py).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from attn_mt.errors import AttnMTError, InputError


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def integer(value: object, field: str, least: int | None = 1) -> int:
    """`value` as an int >= `least` (None: any); bools, floats ("1.0" or 1.0) and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (
            least is not None and int(value) < least):
        at_least = f" >= {least}" if least is not None else ""
        raise InputError(f"must be an integer{at_least}, not {_shown(value)}", field)
    return int(value)


SEEDS = 2**64  # a torch.Generator's seeds: 0 .. 2**64 - 1


def seed(value: object, field: str = "seed") -> int:
    """A random seed: an int from 0 to 2**64 - 1 (torch's range; beyond it torch fails with a bare ValueError)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < SEEDS:
        raise InputError(f"must be an integer from 0 to 2**64 - 1, not {_shown(value)}", field)
    return int(value)


def number(value: object, field: str, least: float | None = None) -> float:
    """`value` as a finite float (>= `least` where given); bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) or (
            least is not None and float(value) < least):
        at_least = f" >= {least:g}" if least is not None else ""
        raise InputError(f"must be a finite number{at_least}, not {_shown(value)}", field)
    return float(value)


def text(value: object, field: str, *, empty: bool = False) -> str:
    """One sentence: a string (not empty unless `empty`); a list says that one sentence is expected."""
    if not isinstance(value, str):
        many = isinstance(value, Iterable) and not isinstance(value, bytes | Mapping)
        hint = " (one sentence: call it once per sentence)" if many else ""
        raise InputError(f"expected a string{hint}, not {type(value).__name__}", field)
    if not empty and not value.strip():
        raise InputError("the sentence is empty", field)
    return value


def choice(value: object, field: str, allowed: Iterable[str]) -> str:
    """One of `allowed` (strings)."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{_shown(value)} is not one of {', '.join(allowed)}", field)
    return value


def texts(value: object, field: str) -> tuple[list[str], bool]:
    """(the texts as a list, whether one string was given): a string, a Path to a file of lines, or any
    iterable of strings (a list, a tuple, a generator: read once). A dict, bytes, or an item that is not a
    string are refused, naming the item."""
    if isinstance(value, str):
        return [value], True
    if isinstance(value, os.PathLike):
        from attn_mt.data.sources import read_lines

        try:
            return read_lines(Path(value)), False
        except AttnMTError as e:  # the file's errors name it in their message
            raise e.naming(field) from None
    if isinstance(value, bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise InputError(f"expected a string or an iterable of strings (a list, a generator), not "
                         f"{type(value).__name__}", field)
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InputError(f"item {i} is {type(item).__name__}, not a string", field)
    return items, False
