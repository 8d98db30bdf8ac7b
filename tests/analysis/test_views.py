"""The notebook views (analysis/views.py): the HTML carries the data it was given (JSON that reads
back, even with a token that would close a script), every view has an id of its own, nothing in it
points at the network, pages are written atomically; then headless Chromium opens the saved pages
from disk with the network off, and the head view, the explanation and the heads report draw, answer
clicks and the selectors.

The browser tests skip where there is no Chromium, chromedriver or selenium (Debian: `apt-get
install chromium chromium-driver`). ATTN_MT_VIEWS_SCREENSHOTS names a folder to keep their
screenshots in.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import TINY, chromium, random_checkpoint, toy_test_files

import attn_mt
from attn_mt.analysis import model_view, overview, views
from attn_mt.analysis.explain import explain
from attn_mt.analysis.explanation import NAMES, explanation_html, query_name, render
from attn_mt.checkpoint import load_model
from attn_mt.config import load_config
from attn_mt.decoding.attention_maps import attention_maps

TEXT = "the old man sees a small dog."
DATA = re.compile(r'<script type="application/json" class="attn-mt-data">(.*?)</script>', re.S)
ROOT_ID = re.compile(r'<div class="attn-mt-view attn-mt-box" id="(attn-mt-[0-9a-f]+)"')
# createElementNS's name for SVG: an identifier, never fetched
SVG_NS = "http://www.w3.org/2000/svg"


def views_of(path: Path, n_sentences: int) -> dict:
    """A checkpoint's translation and maps of TEXT, an explanation (cross, layer 2, head 2, query 1)
    and a heads report on the toy corpus's first `n_sentences` test pairs."""
    model, cfg, tok = load_model(path)
    dcfg = replace(cfg.decode, beam_size=1)
    translation, maps = attention_maps(model, tok, TEXT, dcfg)
    e = explain(model, tok, TEXT, kind="cross", layer=2, head=2, token=1, dcfg=dcfg)
    src, ref = toy_test_files(path.parent, n_sentences)
    report = attn_mt.load(path, device="cpu").heads(src, ref, sentences=n_sentences)
    return {"translation": translation, "maps": maps, "explanation": e, "report": report}


@pytest.fixture(scope="module")
def made(tiny_run, tmp_path_factory):
    """The views of an untrained 2-layer, 2-head model with noisy weights (every bias matters)."""
    path = tmp_path_factory.mktemp("views") / "noisy.pt"
    random_checkpoint(lambda *o: load_config(None, [*TINY, *o]), tiny_run, path,
                      "decode.max_len_a=0.0", "decode.max_len_b=8")
    return views_of(path, 6)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The views of a 2-layer model trained to translate the toy corpus a little (4 epochs at a
    high learning rate, a quick BLEU: 2-3 s of CPU), so that its heads differ in what masking them
    costs."""
    from attn_mt.training.run import train

    run_dir = tmp_path_factory.mktemp("views_run")
    train(load_config(None, [*TINY, "model.n_layers=2", "train.max_epochs=4", "train.lr=1e-2",
                             "train.bleu_sentences=5", "decode.max_len_a=1.2",
                             "decode.max_len_b=5"]), run_dir)
    return views_of(run_dir / "checkpoint_best.pt", 20)


def payload(page: str) -> object:
    found = DATA.findall(page)
    assert len(found) == 1
    return json.loads(found[0])


def test_the_head_view_carries_every_map_as_json_that_reads_back(made):
    maps = made["maps"]
    assert {m.kind for m in maps} == {"encoder_self", "decoder_self", "cross"} and len(maps) == 6
    # a token that would end the script if not escaped
    hostile = "</script><script>alert(1)</script>&<!--"
    maps = [replace(maps[0], queries=[hostile, *maps[0].queries[1:]]), *maps[1:]]
    page = views.attention_html(made["translation"], maps)
    data = payload(page)
    assert hostile not in page and data["translation"] == made["translation"]
    for m, got in zip(maps, data["maps"], strict=True):
        assert ((got["kind"], got["layer"], got["queries"], got["keys"])
                == (m.kind, m.layer, m.queries, m.keys))
        got = torch.tensor(got["permille"])  # (H, Tq, Tk), weights x 1000 rounded
        assert got.shape == m.weights.shape and got.shape[0] == 2 and got.dtype == torch.int64
        assert (got / 1000 - m.weights).abs().max() <= 5.1e-4
    assert data["maps"][0]["queries"][0] == hostile and data["source"] is None
    # weights as numpy arrays: the same page
    arrays = [replace(m, weights=m.weights.numpy()) for m in maps]
    assert (payload(views.attention_html(made["translation"], arrays, source=TEXT))
            == {**data, "source": TEXT})
    with pytest.raises(ValueError, match="no attention maps"):
        views.attention_html("x", [])


def test_explanation_and_heads_carry_their_numbers(made):
    e, report = made["explanation"], made["report"]
    page = e._repr_html_()
    assert payload(page) == json.loads(json.dumps(asdict(e)))  # every number, as the model gave it
    assert html.escape(render(e)) in page  # what shows where scripts do not run
    heads = report._repr_html_()
    assert "<script" not in heads  # plain HTML: renders where scripts do not run
    assert len(grid_cells(heads)) == len(report.heads) == 12
    assert heads.count("<tr><td>") == len(report.heads)  # the table: a row per head
    assert f"BLEU {report.bleu:.2f}" in heads


def grid_cells(page: str) -> dict[tuple[str, int, int], tuple[int, int, int]]:
    """(kind, layer, head) -> the (r, g, b) of its cell in a heads view's grid."""
    cells = re.findall(r'<td style="background:rgb\((\d+),(\d+),(\d+)\);[^"]*" data-kind="(\w+)" '
                       r'data-layer="(\d)" data-head="(\d)"', page)
    return {(k, int(layer), int(h)): (int(r), int(g), int(b)) for r, g, b, k, layer, h in cells}


def test_the_heads_grid_is_red_where_masking_cost_bleu(made):
    report = made["report"]
    # the largest |change|: 4 BLEU
    changes = [-4.0, -1.0, -0.1, 0.0, 0.1, 1.0, 2.0, -2.0, 0.0, 0.0, 0.0, 0.0]
    rows = [{**r, "d_bleu": d} for r, d in zip(report.heads, changes, strict=True)]
    cells = grid_cells(overview.heads_html(replace(report, heads=rows)))
    rgb = [cells[r["kind"], r["layer"], r["head"]] for r in rows]
    assert rgb[0] == (103, 0, 31)  # -4: RdBu's darkest red, as the PNG's colour bar
    # red, deeper the more
    assert rgb[1][0] - rgb[1][2] > 50 and rgb[7][0] - rgb[7][2] > rgb[1][0] - rgb[1][2]
    # blue where BLEU rose
    assert rgb[5][2] - rgb[5][0] > 20 and rgb[6][2] - rgb[6][0] > rgb[5][2] - rgb[5][0]
    assert rgb[3] == (247, 247, 247)  # no change: white


def test_two_views_on_one_page_have_ids_of_their_own(made):
    pages = [views.attention_html(made["translation"], made["maps"]) for _ in range(2)]
    pages += [explanation_html(made["explanation"]), overview.heads_html(made["report"])]
    ids = [ROOT_ID.findall(p) for p in pages]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == 4
    for page, (own,) in zip(pages, ids, strict=True):
        # its script looks for its own root only
        assert set(re.findall(r"attn-mt-[0-9a-f]{12}\b", page)) == {own}


def test_nothing_in_a_view_points_at_the_network(made):
    page = views.document("".join([views.attention_html(made["translation"], made["maps"]),
                                   explanation_html(made["explanation"]),
                                   overview.heads_html(made["report"])]))
    # no URL of any kind; SVG's namespace is a name
    assert page.replace(SVG_NS, "").count("http") == 0
    for pattern in (r"\bsrc=", r"href=(?!\"data:)", r"url\(", r"@import", r"\bfetch\(",
                    r"XMLHttpRequest", r"\brequire\(", r"\bimport\("):
        assert not re.search(pattern, page), pattern


def test_save_html_writes_a_whole_page_atomically(made, tmp_path):
    path = tmp_path / "report.html"
    path.write_text("old")
    assert made["report"].save_html(path) == path
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "<title>attn-mt heads: noisy.pt</title>" in text
    assert (text.rstrip().endswith("</html>") and sorted(p.name for p in tmp_path.iterdir())
            == ["report.html"])
    with pytest.raises(OSError, match=re.escape(str(tmp_path / "missing" / "e.html"))):
        made["explanation"].save_html(tmp_path / "missing" / "e.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary file left


def test_importing_explain_and_heads_leaves_the_views_unloaded_and_the_views_need_no_torch():
    for code, loaded in (("import attn_mt.analysis.explain, attn_mt.analysis.heads",
                          "attn_mt.analysis.views"),
                         ("import attn_mt.analysis.views", "torch")):
        out = subprocess.run([sys.executable, "-c",
                              f"import sys; {code}; print({loaded!r} in sys.modules)"],
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False", code


def test_ipython_displays_an_explanation_and_a_heads_report_as_their_views(made):
    formatters = pytest.importorskip("IPython.core.formatters")
    for obj, kind in ((made["explanation"], "explanation"), (made["report"], "heads")):
        bundle, _ = formatters.DisplayFormatter().format(obj)  # what a notebook's output holds
        assert f'data-view="{kind}"' in bundle["text/html"] and "text/plain" in bundle


# ---- in a browser: the saved pages, opened from disk with the network off ----


@pytest.fixture(scope="module")
def browser():
    with chromium("--window-size=1280,1000", "--proxy-server=127.0.0.1:9",
                  "--proxy-bypass-list=<-loopback>") as d:
        yield d  # any request would fail: no network


def open_file(browser, path: Path) -> None:
    browser.get(path.resolve().as_uri())
    problems = [m for m in browser.get_log("browser") if m["level"] == "SEVERE"]
    assert not problems, problems  # no script error, nothing that failed to load
    # fetched nothing
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


def screenshot(browser, tmp_path: Path, name: str) -> Path:
    browser.set_window_size(
        1280, browser.execute_script("return document.documentElement.scrollHeight") + 140)
    path = tmp_path / name
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("ATTN_MT_VIEWS_SCREENSHOTS"):
        shutil.copy(path, Path(os.environ["ATTN_MT_VIEWS_SCREENSHOTS"]) / name)
    return path


def cell_colours(root) -> str:
    """Every heat map cell's colour in a view: what changes when another map is chosen."""
    return root.parent.execute_script(
        "return [...arguments[0].querySelectorAll('.heatmap td')].map(td => "
        "td.style.backgroundColor).join('|')", root)


@pytest.mark.slow
def test_head_views_draw_and_answer_clicks_and_selectors_from_a_saved_file(
        browser, trained, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    maps = trained["maps"]
    path = views.save_html(views.attention_html(trained["translation"], maps, source=TEXT)
                           + views.attention_html(trained["translation"], maps),
                           tmp_path / "attention.html")
    open_file(browser, path)
    first, second = browser.find_elements("css selector", ".attn-mt-body")  # where each view draws
    cross = next(m for m in maps if m.kind == "cross" and m.layer == 1)
    tq, tk = len(cross.queries), len(cross.keys)
    # both drew: cross-attention (as the serve page starts), layer 1, head 1
    for root in (first, second):
        assert root.get_attribute("data-shown") == "cross/1/1"
        assert len(root.find_elements("css selector", ".heatmap td[data-q]")) == tq * tk
        assert not root.find_elements("css selector", ".nojs")
    before = cell_colours(second)

    q = first.find_element("css selector", '.lines .tok[data-side="q"][data-index="2"] text')
    q.click()
    assert first.get_attribute("data-picked") == "q2"
    shades = [float(g.get_attribute("data-shade")) for g in
              first.find_elements("css selector", '.lines .tok[data-side="k"]')]
    # the keys shaded by query 2's weights
    assert shades == pytest.approx(cross.weights[0, 2].tolist(), abs=6e-4)
    assert len(first.find_elements("css selector", ".lines line")) <= tk  # only query 2's lines
    assert first.find_elements("css selector", ".heatmap tr.picked")
    assert second.get_attribute("data-picked") == ""  # the other view did not move

    pick = {name: Select(first.find_element("css selector", f'select[data-control="{name}"]'))
            for name in ("kind", "layer", "head")}
    pick["kind"].select_by_value("encoder_self")
    assert (first.get_attribute("data-shown") == "encoder_self/1/1"
            and first.get_attribute("data-picked") == "")
    layer1 = cell_colours(first)
    pick["layer"].select_by_value("2")
    assert first.get_attribute("data-shown") == "encoder_self/2/1" and cell_colours(first) != layer1
    pick["kind"].select_by_value("cross")
    pick["layer"].select_by_value("2")
    assert first.get_attribute("data-shown") == "cross/2/1"
    layer2 = cell_colours(first)
    pick["head"].select_by_value("2")
    assert first.get_attribute("data-shown") == "cross/2/2" and cell_colours(first) != layer2
    pick["head"].select_by_value("all")
    assert len(first.find_elements("css selector", ".heatmap")) == 2  # a map per head
    # a cell picks its query
    first.find_element("css selector", '.heatmap td[data-q="1"][data-k="0"]').click()
    assert first.get_attribute("data-picked") == "q1"
    colours = {line.get_attribute("stroke")
               for line in first.find_elements("css selector", ".lines line")}
    assert len(colours) == 2  # a colour per head
    assert second.get_attribute("data-shown") == "cross/1/1" and cell_colours(second) == before
    ActionChains(browser).move_to_element(second.find_element(
        # what attends to key 3
        "css selector", '.lines .tok[data-side="k"][data-index="3"] text')).perform()
    shades = [float(g.get_attribute("data-shade")) for g in
              second.find_elements("css selector", '.lines .tok[data-side="q"]')]
    assert shades == pytest.approx(cross.weights[0, :, 3].tolist(), abs=6e-4)
    assert second.get_attribute("data-picked") == ""  # a hover picks nothing
    assert second.find_elements("css selector", ".heatmap td.picked")  # the key's column stands out
    screenshot(browser, tmp_path, "views_attention.png")


@pytest.mark.slow
def test_the_explanation_and_the_heads_report_draw_from_saved_files(browser, trained, tmp_path):
    e, report = trained["explanation"], trained["report"]
    assert len({h["d_bleu"] for h in report.heads}) > 1  # trained: the heads' costs differ
    open_file(browser, e.save_html(tmp_path / "explain.html"))
    root = browser.find_element("css selector", ".attn-mt-view")
    assert (root.find_element("css selector", ".attn-mt-body").get_attribute("data-shown")
            == "cross/2/2/1")
    # as the CLI prints
    title = f"{NAMES[e.kind]}, layer {e.layer}, head {e.head} of {e.n_heads}: {query_name(e)}"
    assert root.find_element("css selector", "h2.title").text == title and "predicts" in title
    steps = root.find_elements("css selector", "ol.steps > li")
    assert [s.find_element("css selector", "h3 .n").text for s in steps] == ["1", "2–4", "5", "W_o"]
    assert root.find_element("css selector", ".diff.ok")  # recomputed = the model's output
    rows = root.find_elements("css selector", "table.keys:not(.mix) tbody tr")
    weights = [float(r.find_elements("css selector", "td .num")[2].text) for r in rows]
    assert weights == pytest.approx([k.weight for k in e.keys], abs=6e-4)
    screenshot(browser, tmp_path, "views_explanation.png")

    open_file(browser, report.save_html(tmp_path / "heads.html"))
    root = browser.find_element("css selector", ".attn-mt-view")
    assert len(root.find_elements("css selector", "table.grid td[data-kind]")) == len(report.heads)
    assert len(root.find_elements("css selector", "table.report tbody tr")) == len(report.heads)
    screenshot(browser, tmp_path, "views_heads.png")


# JupyterLab's rules for tables and paragraphs in an output (rendermime's base.css), in a dark
# theme's colours
JUPYTERLAB_CSS = """
.jp-RenderedHTMLCommon { color: #e0e0e0; }
.jp-RenderedHTMLCommon table { border-collapse: collapse; border-spacing: 0; border: none;
  color: #e0e0e0; font-size: 13px; table-layout: fixed; margin-left: auto; margin-bottom: 1em;
  margin-right: auto; }
.jp-RenderedHTMLCommon thead { border-bottom: 1px solid #616161; vertical-align: bottom; }
.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th, .jp-RenderedHTMLCommon tr {
  vertical-align: middle; padding: 0.5em; line-height: normal; white-space: normal;
  max-width: none; border: none; }
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td,
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon th,
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon tr { text-align: right; }
.jp-RenderedHTMLCommon th { font-weight: bold; }
.jp-RenderedHTMLCommon tbody tr:nth-child(odd) { background: #111111; }
.jp-RenderedHTMLCommon tbody tr:nth-child(even) { background: #212121; }
.jp-RenderedHTMLCommon tbody tr:hover { background: #1a237e; }
.jp-RenderedHTMLCommon p { text-align: left; margin: 0; margin-bottom: 1em; }
"""

# JupyterLab puts an output's HTML into its node with innerHTML, then replaces each <script> with a
# copy so that it runs (rendermime's evalInnerHTMLScriptTags); the node may join the page only
# afterwards.
AS_JUPYTERLAB = """const [html, attached] = arguments;
const host = document.createElement("div");
host.className = "jp-RenderedHTMLCommon";
if (attached) document.body.append(host);
host.innerHTML = html;
for (const script of [...host.getElementsByTagName("script")]) {
  const clone = document.createElement("script");
  for (const {name, value} of script.attributes) clone.setAttribute(name, value);
  clone.textContent = script.textContent;
  script.parentNode.replaceChild(clone, script);
}
if (!attached) document.body.append(host);"""


@pytest.mark.slow
def test_views_draw_when_a_notebook_inserts_them_as_jupyterlab_does(browser, made, tmp_path):
    open_file(browser, views.save_html(f"<style>{JUPYTERLAB_CSS}</style>",
                                       tmp_path / "notebook.html"))
    for attached in (True, False):
        browser.execute_script(AS_JUPYTERLAB,
                               views.attention_html(made["translation"], made["maps"]), attached)
        browser.execute_script(AS_JUPYTERLAB, explanation_html(made["explanation"]), attached)
    browser.execute_script(AS_JUPYTERLAB, overview.heads_html(made["report"]), True)
    bodies = browser.find_elements("css selector", ".attn-mt-body")
    assert ([b.get_attribute("data-shown") for b in bodies] == ["cross/1/1", "cross/2/2/1"] * 2
            + [None])
    assert not browser.find_elements("css selector", ".nojs")
    assert not [m for m in browser.get_log("browser") if m["level"] == "SEVERE"]
    looks = browser.execute_script(
        """const style = (selector) => getComputedStyle(document.querySelector(selector));
        return [style(".heatmap").marginLeft, style("table.keys tbody tr").backgroundColor,
                style("table.keys td").color,
                style("table.report tbody tr:nth-child(2)").backgroundColor,
                style(".heatmap td").paddingTop, style("table.grid td").textAlign];""")
    assert looks == ["0px", "rgba(0, 0, 0, 0)", "rgb(29, 35, 48)", "rgba(0, 0, 0, 0)", "0px",
                     "center"]
    screenshot(browser, tmp_path, "views_in_jupyterlab.png")



@pytest.mark.slow
def test_the_stored_tutorials_views_draw_from_its_outputs_saved_as_a_page(browser, tmp_path):
    """docs/tutorial.ipynb as a notebook renderer shows it: its HTML outputs, as stored, in one
    saved page."""
    nb = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "tutorial.ipynb").read_text(
            encoding="utf-8"))
    outputs = ["".join(o["data"]["text/html"]) for c in nb["cells"] if c["cell_type"] == "code"
               for o in c["outputs"] if "text/html" in o.get("data", {})]
    open_file(browser, views.save_html("\n".join(f"<div class='output'>{h}</div>" for h in outputs),
                                       tmp_path / "tutorial.html"))
    roots = {}
    for root in browser.find_elements("css selector", ".attn-mt-view"):
        roots.setdefault(root.get_attribute("data-view"), []).append(root)
    assert sum(map(len, roots.values())) == len(outputs)
    # every head at once, the five steps, the heads report
    assert sorted(roots) == ["explanation", "heads", "model"]
    # the model view drew
    assert len(roots["model"][0].find_elements("css selector", ".mv-grid canvas")) == 3 * 2 * 4
    assert not roots["model"][0].find_element("css selector", ".mv-static").is_displayed()
    # the five steps
    assert all(r.find_elements("css selector", "ol.steps > li") for r in roots["explanation"])
    # the heads grid
    assert roots["heads"][0].find_elements("css selector", "table.grid td[data-kind]")
    screenshot(browser, tmp_path, "views_tutorial.png")
    # as GitHub's renderer shows it, without scripts: the model view's picture in their place
    bare = re.sub(r"<script(?![^>]*application/json)[^>]*>.*?</script>", "",
                  (tmp_path / "tutorial.html").read_text(
        encoding="utf-8"), flags=re.S)
    (tmp_path / "tutorial_no_scripts.html").write_text(bare, encoding="utf-8")
    open_file(browser, tmp_path / "tutorial_no_scripts.html")
    picture = browser.find_element("css selector", ".mv-static")
    assert (picture.is_displayed()
            and browser.execute_script("return arguments[0].naturalWidth", picture) > 300)
    screenshot(browser, tmp_path, "views_tutorial_no_scripts.png")


@pytest.mark.slow
def test_the_model_view_draws_answers_and_shows_its_picture_without_scripts(
        browser, made, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    att = attn_mt.Attention(TEXT, made["translation"], made["maps"])
    view = model_view(att)
    open_file(browser, view.save_html(tmp_path / "model_view.html"))
    root = browser.find_element("css selector", ".attn-mt-view")
    canvases = root.find_elements("css selector", ".mv-grid canvas")
    assert len(canvases) == 3 * 2 * 2  # kinds x layers x heads
    # the canvases replace the picture
    assert not root.find_element("css selector", ".mv-static").is_displayed()
    drawn = browser.execute_script(
        """return [...arguments[0].querySelectorAll('.mv-grid canvas')].map(c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let lit = 0; for (let i = 3; i < d.length; i += 4) lit += d[i] > 0;
        return lit / (d.length / 4); });""", root)
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
    assert (picture.is_displayed()
            and browser.execute_script("return arguments[0].naturalWidth", picture) > 200)
    assert not browser.find_elements("css selector", ".mv-grid canvas")
    screenshot(browser, tmp_path, "model_view_no_scripts.png")
