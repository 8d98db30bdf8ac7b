"""docs/api.md's signatures are the code's: every `**`name(params)`**` it shows lists the function's
parameters in order, with the same kinds (positional, keyword-only after `*`, or `**options`) and
defaults (inspect.signature). Its examples run in tests/test_readme.py."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import attn_mt

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SPAN = re.compile(r"\*\*`([\w.]+)\((.*?)\)(?:\s*->[^`]*)?`\*\*", re.S)


def _split(params: str) -> list[str]:
    """Parameters at the top level of the parentheses: "a, b=(1, 2), *, c" -> ["a", "b=(1, 2)", "*",
    "c"]."""
    out, depth, part = [], 0, ""
    for ch in params:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(part.strip())
            part = ""
        else:
            part += ch
    return [p for p in [*out, part.strip()] if p]


def _resolve(name: str):
    owner, _, attr = name.rpartition(".")
    if owner == "attn_mt":
        return getattr(attn_mt, attr)
    if owner == "Model":
        return getattr(attn_mt.Model, attr)
    raise AssertionError(f"docs/api.md shows {name}(...): name it attn_mt.X or Model.x")


def _default(text: str, func):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):  # a name of the function's module: Limits(), LOOPBACK
        return eval(text, vars(inspect.getmodule(func)))  # noqa: S307 (our own doc's text)


SIGNATURES = SPAN.findall(DOC.read_text(encoding="utf-8"))


def test_the_doc_shows_the_public_calls():
    shown = {name for name, _ in SIGNATURES}
    assert {"attn_mt.load", "Model.translate", "Model.translate_nbest", "Model.stream",
            "Model.score", "Model.attention", "Model.explain", "Model.heads", "Model.prune",
            "Model.contrastive", "Model.to", "Model.save", "attn_mt.bench", "attn_mt.create_app",
            "attn_mt.train"} <= shown


@pytest.mark.parametrize("name,params", SIGNATURES, ids=[n for n, _ in SIGNATURES])
def test_a_documented_signature_matches_the_code(name, params):
    if name == "attn_mt.create_app":
        pytest.importorskip("fastapi")
    func = _resolve(name)
    code = [p for p in inspect.signature(func).parameters.values() if p.name != "self"]
    doc = _split(" ".join(params.split()))
    keyword_only = doc.index("*") if "*" in doc else len(doc)
    doc_params = [p for p in doc if p != "*"]
    assert [p.split("=")[0].lstrip("*") for p in doc_params] == [p.name for p in code], name
    for i, (text, param) in enumerate(zip(doc_params, code, strict=True)):
        kind = (inspect.Parameter.KEYWORD_ONLY if i >= keyword_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if text.startswith("**"):  # **options: the decode keywords (a TypedDict), after the others
            kind = inspect.Parameter.VAR_KEYWORD
        assert param.kind == kind, (name, param.name, param.kind)
        if "=" in text:
            assert (param.default
                    is not inspect.Parameter.empty), (name, param.name, "has no default")
            assert _default(text.split("=", 1)[1], func) == param.default, (name, param.name)
        else:
            assert (param.default is inspect.Parameter.empty), (
                name, param.name, f"default {param.default!r} not shown")
