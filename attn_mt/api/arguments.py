"""The `Model`'s checks of its keyword arguments: decode options it does not take are refused as
Python refuses an unknown keyword (`refuse_others`), and `Model.options`' spellings of the
settings are checked (`spellings`); and a command's keywords made from the decode options' table
(`with_decode_options`).

Tested in tests/api/test_arguments.py.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from attn_mt.config import ARGS, DecodeOption
from attn_mt.config.decode import taking
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


def with_decode_options(call: str, annotation: Callable[[DecodeOption], Any]) -> Callable:
    """A decorator: the command gets a keyword for each decode option that the Model's `call` takes
    (the rows of DECODE_OPTIONS whose `calls` name it), annotated `annotation(row)` (the CLI: its
    flag), default None; they reach the command as one `options` mapping (API name -> value or
    None), so a new row is a new keyword of every command whose call takes it."""
    rows = taking(call)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "options"]
        added = [inspect.Parameter(o.arg, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=annotation(o)) for o in rows]

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            options = {o.arg: given.pop(o.arg, None) for o in rows}
            return command(**given, options=options)

        run.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in own + added}
        return run

    return decorate
