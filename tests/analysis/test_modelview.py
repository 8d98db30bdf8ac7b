"""analysis/modelview.py: every head of a sentence at once. The HTML carries the maps it was given (JSON that reads
back), the PNG that shows without scripts and the same PNG as image/png; a chosen subset of heads is all it draws;
injected text is escaped. Then headless Chromium, network off, opens a saved page: the canvases draw, the tick
boxes choose heads, pointing gives numbers, "numbers" writes them; with the scripts removed (as GitHub's renderer
does) the picture shows. The browser tests skip without Chromium and chromedriver (test_views.py says how)."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from conftest import TINY, random_checkpoint
from test_views import browser, open_file, screenshot  # noqa: F401 (browser: a fixture)

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
    random_checkpoint(lambda *o: load_config(None, [*TINY, *o]), tiny_run, path, "decode.max_len_a=0.0",
                      "decode.max_len_b=8")
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
    picture = re.search(r'<img class="mv-static"[^>]* src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert base64.b64decode(picture[1]).startswith(PNG)
    bundle = view._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]).startswith(PNG) and "text/html" in bundle
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|fetch\(""", page)  # nothing fetched


def test_a_subset_of_heads_is_all_it_draws_and_bad_names_say_so(att):
    data = json.loads(DATA.findall(model_view(att, heads=["cross 2.2", "encoder 1.1"]).to_html())[0])
    assert [(m["kind"], m["layer"], m["heads"]) for m in data["maps"]] == [("encoder", 1, [1]), ("cross", 2, [2])]
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


@pytest.mark.slow
def test_the_model_view_draws_and_answers_in_a_browser_and_shows_its_picture_without_scripts(browser, att,  # noqa: F811
                                                                                             tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    view = model_view(att)
    open_file(browser, view.save_html(tmp_path / "model_view.html"))
    root = browser.find_element("css selector", ".attn-mt-view")
    canvases = root.find_elements("css selector", ".mv-grid canvas")
    assert len(canvases) == 3 * 2 * 2  # kinds x layers x heads
    assert not root.find_element("css selector", ".mv-static").is_displayed()  # the canvases replace the picture
    drawn = browser.execute_script("""return [...arguments[0].querySelectorAll('.mv-grid canvas')].map(c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let lit = 0; for (let i = 3; i < d.length; i += 4) lit += d[i] > 0; return lit / (d.length / 4); });""", root)
    assert min(drawn) == 1.0  # every pixel of every map painted
    root.find_element("css selector", 'input[data-head="2"]').click()
    assert len(root.find_elements("css selector", ".mv-grid canvas")) == 6  # head 2 hidden
    root.find_element("css selector", 'input[data-kind="encoder"]').click()
    shown = root.find_elements("css selector", ".mv-grid canvas")
    assert [(c.get_attribute("data-kind"), c.get_attribute("data-head")) for c in shown] == \
        [("decoder", "1"), ("decoder", "1"), ("cross", "1"), ("cross", "1")]
    last = shown[-1]  # cross layer 2, head 1: point at its top-left cell
    ActionChains(browser).move_to_element_with_offset(last, -last.size["width"] // 2 + 1,
                                                      -last.size["height"] // 2 + 1).perform()
    tip = root.find_element("css selector", ".mv-tip").text
    w = att.weights("cross", 2, 1)[0, 0]
    assert tip.startswith("cross 2.1: query 0") and tip.endswith(f"{round(w * 1000) / 1000:.3f}")
    last.click()
    cells = root.find_elements("css selector", ".mv-large td")
    assert len(cells) == att.weights("cross", 2, 1).size
    assert all(c.text == "" for c in cells)  # numbers on demand only
    root.find_element("css selector", "input[data-numbers]").click()
    texts = [c.text for c in root.find_elements("css selector", ".mv-large td")]
    assert texts[0] == f"{round(w * 1000) / 1000:.2f}".lstrip("0")
    screenshot(browser, tmp_path, "model_view.png")

    # GitHub's renderer drops scripts: the same page without them shows the picture
    page = (tmp_path / "model_view.html").read_text(encoding="utf-8")
    bare = re.sub(r"<script(?![^>]*application/json)[^>]*>.*?</script>", "", page, flags=re.S)
    (tmp_path / "no_scripts.html").write_text(bare, encoding="utf-8")
    open_file(browser, tmp_path / "no_scripts.html")
    picture = browser.find_element("css selector", ".mv-static")
    assert picture.is_displayed() and browser.execute_script("return arguments[0].naturalWidth", picture) > 200
    assert not browser.find_elements("css selector", ".mv-grid canvas")
    screenshot(browser, tmp_path, "model_view_no_scripts.png")
