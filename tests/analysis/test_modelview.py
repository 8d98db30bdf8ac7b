"""analysis/modelview.py: every head of a sentence at once. The HTML carries the maps it was given
(JSON that reads back), the PNG that shows without scripts and the same PNG as image/png; a chosen
subset of heads is all it draws; injected text is escaped. In a browser (test_views.py): the
canvases draw, the tick boxes choose heads, pointing gives numbers, "numbers" writes them; with the
scripts removed (as GitHub's renderer does) the picture shows."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from conftest import TINY, random_checkpoint

import attn_mt
from attn_mt.analysis import model_view
from attn_mt.config import load_config
from attn_mt.errors import InputError

TEXT = "the old man sees a small dog."
DATA = re.compile(r'<script type="application/json" class="attn-mt-data">(.*?)</script>', re.S)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def att(tiny_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("modelview") / "noisy.pt"
    random_checkpoint(lambda *o: load_config(None, [*TINY, *o]), tiny_run, path,
                      "decode.max_len_a=0.0", "decode.max_len_b=8")
    return attn_mt.load(path, device="cpu").attention(TEXT)


def test_the_view_carries_every_head_as_json_and_a_picture(att):
    view = model_view(att)
    page = view.to_html()
    data = json.loads(DATA.findall(page)[0])
    assert [(m["kind"], m["layer"]) for m in data["maps"]] == [
        (k, layer) for k in ("encoder", "decoder", "cross") for layer in (1, 2)]
    for m in data["maps"]:
        w = att.weights(m["kind"], m["layer"])
        assert m["heads"] == [1, 2] and np.allclose(np.array(m["permille"]) / 1000, w, atol=5e-4)
    assert data["ticks"] == [0.0, 0.25, 0.5, 0.75, 1.0]  # the legend's numbers
    picture = re.search(r'<img class="mv-static"[^>]* '
                        r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert base64.b64decode(picture[1]).startswith(PNG)
    bundle = view._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]).startswith(PNG) and "text/html" in bundle
    # nothing fetched
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|fetch\(""", page)


def test_a_subset_of_heads_is_all_it_draws_and_bad_names_say_so(att):
    data = json.loads(DATA.findall(model_view(att, heads=["cross 2.2",
                                                          "encoder 1.1"]).to_html())[0])
    assert ([(m["kind"], m["layer"], m["heads"]) for m in data["maps"]]
            == [("encoder", 1, [1]), ("cross", 2, [2])])
    for bad in (["cross 3.1"], ["cross 1.9"], ["heads"], []):
        with pytest.raises(InputError) as err:
            model_view(att, heads=bad)
        assert err.value.field == "heads"
    with pytest.raises(InputError):
        model_view("not an attention")


def test_injected_text_is_escaped(att):
    view = model_view(att)
    view.source = "</script><script>alert(1)</script> & <b>"
    page = view.to_html()
    assert "<script>alert(1)" not in page and "&lt;/script&gt;" in page
    assert json.loads(DATA.findall(page)[0])["source"] == view.source  # the JSON reads back whole
