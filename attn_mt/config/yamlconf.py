"""Typed configs from YAML: read a file safely, apply dotted overrides (section.key=value), build
frozen dataclasses.

Nothing here knows attn-mt's sections: `build(cls, raw)` checks every key of a nested dict
against the fields of the dataclass `cls` (recursively), converts the values to the field
types and lets the dataclass validate itself in `__post_init__`. A field typed as a union of
dataclasses (e.g. the model section) takes the member whose `kind` default matches `raw["kind"]`.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from attn_mt.errors import ConfigError, InputError

__all__ = ["ConfigError", "OptionError"]


class OptionError(InputError):
    """An argument's value that cannot be used; `option` (= `field`) names the argument as the
    Python API spells it ("beam", "overwrite"), or is None where the message already names it; the
    CLI shows it as its own name for that argument."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message, option)
        self.option = option

    def __str__(self) -> str:
        return self.message


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxstring, _repr.maxother, _repr.maxlong = (
    2, 4, 4, 60, 60, 40)


def show(value: Any) -> str:
    """A short repr for messages: a YAML alias bomb or a huge value never expands into them."""
    return _repr.repr(value)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none): for one-line
    errors."""
    return str(e).splitlines()[0] if str(e).strip() else e.__class__.__name__


def read_yaml(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file (safe loader), or ConfigError naming file and line."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}: line {line}: invalid UTF-8 (byte "
                          f"{data[e.start]:#04x})") from None
    try:
        raw = yaml.safe_load(text) or {}
    # e.g. a 5000-digit number, nesting 100k deep
    except (ValueError, RecursionError, OverflowError) as e:
        raise ConfigError(f"{path}: unreadable YAML value ({e.__class__.__name__}: "
                          f"{str(e)[:100]})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or first_line(e)
        raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got "
                          f"{type(raw).__name__}")
    return raw


def set_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply `section.key=value` overrides (values parsed as YAML) to `raw`, in place; returns
    it."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {show(item)}: expected section.key=value")
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is not a section", key)
        try:
            node[parts[-1]] = yaml.safe_load(value) if value.strip() else ""
        except (yaml.YAMLError, ValueError, RecursionError, OverflowError):
            node[parts[-1]] = value
    return raw


def build(cls: type, raw: Any, prefix: str = "") -> Any:
    """An instance of dataclass `cls` from the nested dict `raw`; ConfigError names the bad key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got "
                          f"{show(raw)}", prefix.rstrip(".") or "config")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in raw:
        if key not in names:
            section = prefix.rstrip(".") or "top level"
            raise ConfigError(f"unknown key {show(f'{prefix}{key}')}; allowed in {section}: "
                              f"{', '.join(names)}", f"{prefix}{key}")
    kwargs = {f.name: _check(hints[f.name], raw[f.name], f"{prefix}{f.name}") for f in fields(cls)
              if f.name in raw}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix.rstrip('.')}: {str(e)[:300]}",
                          prefix.rstrip(".") or "config") from None


def check_limits(section: str, cfg: Any, most: dict[str, float]) -> None:
    """Every number of a config section finite and at most its bound in `most` (upper bounds far
    above any sensible value: an impossible size fails when the config is built, before any data is
    read)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        numbers = value if isinstance(value, tuple) else (value,)
        for x in numbers:
            if isinstance(x, float) and not math.isfinite(x):
                raise ConfigError(f"{section}.{f.name}={x}: must be a finite number",
                                  f"{section}.{f.name}")
            if f.name in most and isinstance(x, (int, float)) and x > most[f.name]:
                raise ConfigError(f"{section}.{f.name}={x}: must be at most {most[f.name]:g}",
                                  f"{section}.{f.name}")


def _kind(cls: type) -> Any:
    f = next((f for f in fields(cls) if f.name == "kind"), None)
    return None if f is None or f.default is MISSING else f.default


def _check(tp: Any, value: Any, key: str) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `key`."""
    if is_dataclass(tp):
        return build(tp, value, key + ".")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and all(is_dataclass(a) for a in args):
        kinds = {_kind(a): a for a in args}  # a union of sections: chosen by their `kind`
        kind = (value.get("kind", next(iter(kinds))) if isinstance(value, dict)
                else next(iter(kinds)))
        if kind not in kinds:
            raise ConfigError(f"{key}.kind={show(kind)}: allowed: {', '.join(map(str, kinds))}",
                              f"{key}.kind")
        return build(kinds[kind], value, key + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={show(value)}: allowed: {', '.join(map(str, args))}", key)
        return value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{key}={show(value)}: expected a list", key)
            return tuple(_check(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key}={show(value)}: expected a list of {len(args)} values", key)
        return tuple(_check(a, v, f"{key}[{i}]") for i,
                     (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
    return _scalar(tp, value, key)


def _scalar(tp: type, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = float(value)
            elif isinstance(value, str):  # YAML reads "5e-4" as a string
                value = float(value)
        except (ValueError, OverflowError):
            pass
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ConfigError(f"{key}={value}: must be a finite number", key)
            return value
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return _expand_env(str(value))
    raise ConfigError(f"{key}={show(value)}: expected {tp.__name__}, got {type(value).__name__}",
                      key)


_ENV = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def _expand_env(value: str) -> str:
    """`${VAR}` and `${VAR:-default}` in string values, so configs can point at local data."""
    return _ENV.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
