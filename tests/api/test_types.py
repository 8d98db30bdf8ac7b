"""The public API type-checks (mypy, the `dev` extra; skipped where it is not installed): its
modules are clean, and a caller's code sees one return type per kind of input (`translate(str) ->
str`, of an iterable -> list). The libraries it calls are not followed (their types are Any here):
reading their sources was half of mypy's time."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# one section for all: [mypy-torch.*,numpy.*,...] (a second "mypy-" in the list matched nothing:
# only torch was skipped, and mypy read the others and what they import, 3x the time)
SKIPPED = "mypy-" + ",".join(f"{name}.*" for name in (
    "torch", "numpy", "sentencepiece", "sacrebleu", "datasets", "tqdm", "typer", "click", "yaml",
    "matplotlib", "transformers", "fastapi", "pydantic", "starlette", "uvicorn"))
MODULES = ["attn_mt/__init__.py", "attn_mt/api/model.py", "attn_mt/api/analyses.py",
           "attn_mt/api/steering.py", "attn_mt/data/checks.py", "attn_mt/api/sharing.py",
           "attn_mt/api/attention.py"]
CALLER = '''
from typing import assert_type

import attn_mt
from attn_mt.api.attention import Attention
from attn_mt.decoding.alignment import Alignment
from attn_mt.decoding.scoring import Score
from attn_mt.decoding.translate import Translation

model = attn_mt.load("runs/toy/checkpoint_best.pt", device="cpu", dtype="bfloat16")
assert_type(model.translate("a dog."), str)
assert_type(model.translate(["a dog.", "a cat."]), list[str])
assert_type(model.translate(t for t in ["a dog."]), list[str])
assert_type(model.translate("a dog.", return_attention=True), Attention)
assert_type(model.translate(("a dog.",), return_attention=True), list[Attention])
assert_type(model.translate_nbest("a dog.", nbest=2, beam=2), list[Translation])
assert_type(model.translate_nbest(["a dog."]), list[list[Translation]])
assert_type(model.score("a dog.", "ein Hund."), Score)
assert_type(model.score(["a dog."], ["ein Hund."]), list[Score])
assert_type(model.attention("a dog.", target="ein Hund."), Attention)
assert_type(model.to("cpu"), attn_mt.Model)
assert_type(model.align("a dog.", "ein Hund."), Alignment)
assert_type(model.align(["a dog."], ["ein Hund."]), list[Alignment])
'''


def test_the_public_api_type_checks(tmp_path):
    api = pytest.importorskip("mypy.api")
    caller = tmp_path / "caller.py"
    caller.write_text(CALLER)
    (tmp_path / "mypy.ini").write_text(f"[mypy]\n[{SKIPPED}]\nfollow_imports = skip\n")
    out, err, status = api.run(["--config-file", str(tmp_path / "mypy.ini"),
                                "--follow-imports=silent", "--ignore-missing-imports",
                                "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                                *[str(ROOT / m) for m in MODULES], str(caller)])
    assert status == 0, out + err
