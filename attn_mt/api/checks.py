"""The public API's arguments, checked at the door: every bad value is an `InputError` naming its argument,
never a TypeError from deep inside (torch, the config, range()). The checks themselves are data/checks.py's,
shared with the analysis functions (analysis/ may not import api/); each text comes back clean (a lone
surrogate as U+FFFD).

    >>> integer(1.5, "beam")
    InputError: beam: must be an integer >= 1, not 1.5

One job: argument types and ranges; what a value means is the caller's.

Tested in tests/api/test_arguments.py (and fuzzed in tests/api/test_fuzz_api.py).
"""

from __future__ import annotations

import numbers

from attn_mt.data.checks import boolean, choice, clean, integer, model, number, path, shown, text, texts
from attn_mt.errors import InputError

__all__ = ["SEEDS", "boolean", "choice", "clean", "integer", "model", "number", "path", "seed", "text", "texts"]


SEEDS = 2**64  # a torch.Generator's seeds: 0 .. 2**64 - 1


def seed(value: object, field: str = "seed") -> int:
    """A random seed: an int from 0 to 2**64 - 1 (torch's range; beyond it torch fails with a bare ValueError)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < SEEDS:
        raise InputError(f"must be an integer from 0 to 2**64 - 1, not {shown(value)}", field)
    return int(value)
