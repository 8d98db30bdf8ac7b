"""The `Model`'s checks of its keyword arguments: decode options it does not take are refused as
Python refuses an unknown keyword (`refuse_others`), and `Model.options`' spellings of the
settings are checked (`spellings`).

Tested in tests/api/test_arguments.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from attn_mt.config import ARGS
from attn_mt.data import checks
from attn_mt.errors import InputError


def refuse_others(method: str, options: Mapping[str, object], allowed: frozenset[str]) -> None:
    """Refuse a keyword that is not one of `allowed` decode options, as Python refuses an unknown
    keyword."""
    for arg in options:
        if arg not in allowed:
            raise TypeError(f"Model.{method}() got an unexpected keyword argument {arg!r}")


def spellings(names: object) -> dict[str, str]:
    """`Model.options`' `names` checked (InputError): DecodeConfig fields to non-empty strings; with
    the API's names (ARGS) for the fields it leaves out."""
    if not isinstance(names, Mapping):
        raise InputError(f"must map decode settings to their names, not a {type(names).__name__}",
                         "names")
    odd = next((k for k, v in names.items() if k not in ARGS or not isinstance(v, str) or not v),
               None)
    if odd is not None:
        raise InputError(f"{checks.shown(odd)}: "
                         f"{'not a decode setting' if odd not in ARGS else 'not a name'} "
                         f"(settings: {', '.join(ARGS)}; each to a non-empty string)", "names")
    return {**ARGS, **names}
