"""A MarianMT folder as a hostile user would give it: reports aimed at its files, crafted sizes, damaged or
mistyped files, vocabularies that do not fit its SentencePiece models. Each is refused in one line, naming the
file or field, before anything is written or allocated."""

from __future__ import annotations

import shutil

import pytest
from conftest import cli, one_line_error
from marian_models import build, texts

import attn_mt
from attn_mt.config.files import OutputError


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    return build(tmp_path_factory.mktemp("hostile") / "opus-mt-en-de", shared=True, steps=0)


@pytest.fixture
def folder(marian, tmp_path):
    """A copy of the tiny MarianMT folder, to spoil."""
    return shutil.copytree(marian, tmp_path / "opus-mt-en-de")


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("command", [
    ["explain", "--checkpoint", "{m}", "a dog.", "--json", "{m}/config.json"],
    ["heads", "--checkpoint", "{m}", "--src", "{t}/s.txt", "--ref", "{t}/r.txt", "--json", "{m}/vocab.json"],
    ["score", "--checkpoint", "{m}", "--src", "{t}/s.txt", "--ref", "{t}/r.txt", "--json", "{m}/config.json"],
    ["score", "--checkpoint", "{m}", "--src", "{t}/s.txt", "--ref", "{t}/r.txt", "--json", "{m}/new.json"],
    ["attention", "--checkpoint", "{m}", "a dog.", "--out", "{t}/png", "--html", "{m}/view.html"],
])
def test_a_report_is_never_written_into_the_model_folder(folder, tmp_path, command):
    (src, ref), = texts(1)
    (tmp_path / "s.txt").write_text(src + "\n")
    (tmp_path / "r.txt").write_text(ref + "\n")
    before = _snapshot(folder)
    result = cli(*(a.format(m=folder, t=tmp_path) for a in command))
    one_line_error(result, 2, "would overwrite the model folder")
    assert _snapshot(folder) == before
    attn_mt.load(folder, device="cpu")  # still loads


def test_the_api_never_writes_a_report_into_the_model_folder(folder, tmp_path):
    model = attn_mt.load(folder, device="cpu")
    before = _snapshot(folder)
    (src, _), = texts(1)
    explanation = model.explain(src)
    for write in (lambda: explanation.save_json(folder / "config.json"),
                  lambda: explanation.save_html(folder / "e.html"),
                  lambda: model.attention(src).save_png(folder / "png")):
        with pytest.raises(OutputError, match="would overwrite the model folder"):
            write()
    assert _snapshot(folder) == before
    assert explanation.save_json(tmp_path / "e.json").is_file()  # elsewhere it writes
