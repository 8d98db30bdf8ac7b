"""attn-mt serve as a user sees it: headless Chromium opens the page before and after a translation,
follows a share link, switches maps, hovers, and reads /docs at a desktop and a phone width.

One browser and one server for the module; screenshots go to each test's tmp_path. Skipped where
there is no Chromium, chromedriver or selenium (Debian: `apt-get install chromium chromium-driver`).
ATTN_MT_SERVE_CHECKPOINT and ATTN_MT_SERVE_TEXT run it on another model and sentence;
ATTN_MT_SCREENSHOT says where the translated page's screenshot goes (docs/serve.png was taken
with the Multi30k model that way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode, urlsplit
from urllib.request import Request, urlopen

import pytest

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver")
from conftest import CHROMEDRIVER, CHROMIUM, chromium, serving  # noqa: E402

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("no Chromium and chromedriver", allow_module_level=True)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from attn_mt import checkpoint  # noqa: E402
from attn_mt.config import to_dict  # noqa: E402
from attn_mt.models import build_model  # noqa: E402
from attn_mt.serve import create_app  # noqa: E402

LANGUAGES = {"en": ("English", "the old man sees a small dog."),
             "de": ("German", "Ein Hund rennt über die Wiese.")}
FLAGS = ["--disable-quic", "--window-size=1360,1250"]  # besides conftest's
# every cell's colour, the map's name and the hover classes: what a user sees change
SIGNATURE = """const cells = [...document.querySelectorAll('#heatmaps td')];
return document.getElementById('heatmaps').dataset.map + '|' + cells.length + '|' +
       cells.map(c => c.style.backgroundColor + getComputedStyle(c).opacity).join(';');"""


@pytest.fixture(scope="module")
def two_layer_ckpt(tiny_run, tmp_path_factory):
    """The tiny run's tokenizer with an untrained 2-layer model: enough to switch layers."""
    import torch

    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")
    cfg = replace(cfg, model=replace(cfg.model, n_layers=2))
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab=tok.src_vocab_size, tgt_vocab=tok.tgt_vocab_size,
                        pad_id=tok.pad_id, shared_vocab=tok.joint)
    path = tmp_path_factory.mktemp("browser") / "two_layers.pt"
    checkpoint.save({"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tok.state(),
                     "step": 0},
                    path)
    return path


@pytest.fixture(scope="module")
def browser():
    with chromium(*FLAGS) as driver:
        yield driver


@pytest.fixture(scope="module")
def url(two_layer_ckpt):
    with serving(create_app(os.environ.get("ATTN_MT_SERVE_CHECKPOINT", str(two_layer_ckpt)),
                            device="cpu")) as url:
        yield url


def open_page(browser, url: str, width: int = 1360, height: int = 1250) -> WebDriverWait:
    browser.set_window_size(width, height)
    browser.get(url)
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready")
               is not None)
    return wait


def translated(n: int):
    return (lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-translations")
            == str(n))


def screenshot(browser, path: Path, width: int) -> None:
    """The whole page at `width`: the window grows to the page's height (its frame takes some)."""
    browser.set_window_size(
        width, browser.execute_script("return document.documentElement.scrollHeight") + 140)
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000


def overflow(browser) -> tuple[int, int]:
    return tuple(
        browser.execute_script("return [document.documentElement.scrollWidth, innerWidth]"))


def options(browser, select_id: str) -> list[str]:
    return [o.get_attribute("value")
            for o in Select(browser.find_element(By.ID, select_id)).options]


@pytest.mark.slow
def test_empty_state_says_what_to_do_with_the_example_ready(browser, url, tmp_path):
    info = json.load(urlopen(f"{url}/api/info"))
    source, target, arch = (info["languages"]["source"], info["languages"]["target"],
                            info["architecture"])
    # the server's, else the page's for the language
    example = info.get("example") or LANGUAGES[source][1]
    open_page(browser, f"{url}/")
    assert browser.find_element(By.ID, "text").get_attribute("value") == example
    hint = browser.find_element(By.ID, "hint")
    assert "Press Translate" in hint.text
    # "... into German ... English"
    assert LANGUAGES[source][0] in hint.text and LANGUAGES[target][0] in hint.text
    assert not browser.find_element(By.ID, "share").is_displayed()  # nothing to share yet
    assert not browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")
    # the map menus show the model's shape before there are maps, not blanks
    assert options(browser, "kind") == info["attention"]
    assert (Select(browser.find_element(By.ID, "kind")).first_selected_option.text
            == "cross-attention")
    assert options(browser, "layer") == [str(i + 1) for i in range(arch["n_layers"])]
    assert options(browser, "head") == [*(str(i + 1) for i in range(arch["n_heads"])), "all"]
    assert "source tokens it attends to" in browser.find_element(By.ID, "explain").text
    screenshot(browser, tmp_path / "empty.png", 1280)
    browser.set_window_size(390, 900)
    assert overflow(browser)[0] <= overflow(browser)[1]
    screenshot(browser, tmp_path / "empty_390.png", 390)

    browser.set_window_size(1280, 900)
    browser.find_element(By.ID, "text").send_keys(Keys.ENTER)  # the example, as it stands
    WebDriverWait(browser, 30).until(translated(1))
    assert (not hint.is_displayed()
            and len(browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")) == 1)
    query = parse_qs(urlsplit(browser.current_url).query)
    assert query == {"text": [example], "beam": [str(info["decode"]["beam"])], "nbest": ["1"],
                     "kind": ["cross"], "layer": ["1"], "head": ["1"]}


@pytest.mark.slow
def test_share_link_keeps_every_setting(browser, url):
    settings = {"text": "the old man sees a small dog.", "beam": "3", "nbest": "2",
                "kind": "encoder_self", "layer": "2", "head": "all"}
    wait = open_page(browser, f"{url}/?{urlencode(settings)}")
    wait.until(translated(1))
    for control in ("beam", "nbest", "kind", "layer", "head"):
        assert (browser.find_element(By.ID, control).get_attribute("value")
                == settings[control]), control
    assert len(browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")) == 2  # n-best 2, honoured
    assert browser.find_element(By.ID, "heatmaps").get_attribute("data-map") == "encoder_self/2/all"
    share = browser.find_element(By.ID, "share")
    assert share.is_displayed()
    assert (parse_qs(urlsplit(share.get_attribute("href")).query)
            == {k: [v] for k, v in settings.items()})

    # the link follows the map shown
    Select(browser.find_element(By.ID, "head")).select_by_value("2")
    assert parse_qs(urlsplit(share.get_attribute("href")).query)["head"] == ["2"]
    assert parse_qs(urlsplit(browser.current_url).query)["head"] == ["2"]


@pytest.mark.slow
def test_page_translates_switches_maps_and_hovers(browser, url, tmp_path):
    text = os.environ.get("ATTN_MT_SERVE_TEXT", "the old man sees a small dog.")
    shot = Path(os.environ.get("ATTN_MT_SCREENSHOT", tmp_path / "serve.png"))
    # a shared link translates on load
    wait = open_page(browser, f"{url}/?text={quote(text)}&beam=1")
    wait.until(translated(1))
    assert browser.find_element(By.ID, "text").get_attribute("value") == text
    assert browser.find_element(By.CSS_SELECTOR, "#nbest-list li .hyp").text
    # it was streamed: the translation grew token by token, then the final list replaced it
    assert int(browser.find_element(By.ID, "nbest-list").get_attribute("data-events") or 0) >= 2
    assert not browser.find_elements(By.CSS_SELECTOR, "#nbest-list li.growing")
    assert "parameters" in browser.find_element(By.ID, "facts-list").text
    src = browser.find_elements(By.CSS_SELECTOR, "#src-tokens .tok")
    assert len(src) >= 2 and src[-1].text == "</s>"

    def signature():
        return browser.execute_script(SIGNATURE)

    seen = [signature()]
    assert seen[0].startswith("cross/1/1|")
    for control, value in [("kind", "encoder_self"), ("layer", "2"), ("head", "2"),
                           ("kind", "decoder_self")]:
        Select(browser.find_element(By.ID, control)).select_by_value(value)
        seen.append(signature())
    assert [s.split("|")[0] for s in seen] == ["cross/1/1", "encoder_self/1/1", "encoder_self/2/1",
                                               "encoder_self/2/2", "decoder_self/2/2"]
    assert len(set(seen)) == len(seen)  # each switch redrew the heatmap

    heads = Select(browser.find_element(By.ID, "head"))
    heads.select_by_value("all")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#heatmaps table")) == len(heads.options) - 1

    Select(browser.find_element(By.ID, "kind")).select_by_value("cross")
    Select(browser.find_element(By.ID, "head")).select_by_value("1")
    before = signature()
    targets = browser.find_elements(By.CSS_SELECTOR, "#tgt-tokens .tok")
    ActionChains(browser).move_to_element(targets[min(2, len(targets) - 1)]).perform()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#heatmaps tr.hl-row"))
    assert signature() != before  # the row of the hovered token stands out
    tinted = browser.execute_script(
        "return [...document.querySelectorAll('#src-tokens .tok')].map(t => "
        "t.style.getPropertyValue('--to'))")
    assert any(float(x or 0) == 1.0 for x in tinted)  # the source token it attends to most
    shot.parent.mkdir(parents=True, exist_ok=True)
    screenshot(browser, shot, 1360)
    # a phone: the maps scroll inside their panel, the page does not
    browser.set_window_size(390, 900)
    assert overflow(browser)[0] <= overflow(browser)[1]

    browser.execute_script("document.getElementById('text').value = ''")
    browser.find_element(By.ID, "go").click()
    assert "Type a sentence" in browser.find_element(By.ID, "status").text


@pytest.mark.slow
def test_an_output_word_lights_up_the_source_words_it_is_aligned_with(browser, url):
    text = "the old man sees a small dog."
    open_page(browser, f"{url}/?text={quote(text)}&beam=2&nbest=2").until(translated(1))
    body = json.dumps({"texts": [text], "beam": 2, "nbest": 2, "align": True}).encode()
    answer = json.load(urlopen(Request(f"{url}/api/translate", data=body,
                                       headers={"Content-Type": "application/json"})))
    source = browser.find_elements(By.CSS_SELECTOR, "#source-words .word")
    assert [w.text for w in source] == text.split()

    def lit() -> list[int]:  # one script, not a round trip to the browser per word
        return browser.execute_script(
            "return [...document.querySelectorAll('#source-words .word')].flatMap((w, i) => "
            "w.classList.contains('linked') ? [i] : [])")

    items = browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")
    hyps = answer["results"][0]["hypotheses"]
    assert len(items) == len(hyps) == 2
    for item, h in zip(items, hyps, strict=True):
        out = item.find_elements(By.CSS_SELECTOR, ".word")
        assert [w.text for w in out] == h["text"].split()
        links = [tuple(map(int, link.split("-"))) for link in h["alignment"].split()]
        for j, word in enumerate(out[:6]):
            ActionChains(browser).move_to_element(word).perform()
            assert lit() == sorted(i for i, t in links if t == j) != []
    # a click keeps them lit after the pointer has gone; a second click lets them go
    first = items[0].find_elements(By.CSS_SELECTOR, ".word")[0]
    first.click()
    want = lit()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "facts")).perform()
    assert lit() == want != []
    first.click()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "facts")).perform()
    assert lit() == []


@pytest.mark.slow
def test_an_export_translates_and_says_why_there_are_no_maps(browser, tiny_run, tmp_path):
    pytest.importorskip("ctranslate2")
    from attn_mt.export.ctranslate2 import export_ct2

    export_ct2(tiny_run / "checkpoint_best.pt", tmp_path / "ct2")
    with serving(create_app(tmp_path / "ct2", device="cpu")) as url:
        settings = {"text": "the old man sees a small dog.", "beam": "2", "nbest": "2"}
        open_page(browser, f"{url}/?{urlencode(settings)}").until(translated(1))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")) == 2
        assert "PyTorch checkpoint" in browser.find_element(By.ID, "no-maps").text
        assert not browser.find_element(By.ID, "tokens").is_displayed()
        assert not browser.find_element(By.ID, "kind").is_displayed()
        share = browser.find_element(By.ID, "share").get_attribute("href")
        # no map to name
        assert parse_qs(urlsplit(share).query) == {k: [v] for k, v in settings.items()}


@pytest.mark.slow
def test_clicking_a_cell_opens_the_steps_inside(browser, url, tmp_path):
    text = "the old man sees a small dog."
    wait = open_page(browser, f"{url}/?text={quote(text)}&beam=1&kind=cross&layer=2&head=all")
    wait.until(translated(1))
    inside = browser.find_element(By.ID, "inside")
    assert not inside.is_displayed()
    att = browser.execute_script("return state.att")  # what /api/attention answered the page

    def shown(view: str):
        return lambda d: inside.get_attribute("data-shown") == view

    head2 = browser.find_elements(By.CSS_SELECTOR, "#heatmaps table")[1]
    head2.find_element(By.CSS_SELECTOR, "td[data-q='1'][data-k='0']").click()  # head 2, query 1
    wait.until(shown("cross/2/2/1"))
    assert [s.find_element(By.TAG_NAME, "h3").text.split("\n")[0] for s in
            inside.find_elements(By.CSS_SELECTOR, "#inside-steps > li")] == ["1", "2–4", "5", "W_o"]
    for words in ("q = x W_q", "q · k", "softmax", "Σ weight · v", "W_o",
                  "max |recomputed − model| = "):
        assert words in inside.text, words
    # the recomputation is the model's output
    assert inside.find_element(By.CSS_SELECTOR, ".diff.ok")
    rows = inside.find_elements(By.CSS_SELECTOR, "#inside-steps table.keys:not(.mix) tbody tr")
    weights = [float(r.find_elements(By.CSS_SELECTOR, "td .num")[2].text) for r in rows]
    # the map's row, as the page shows it
    assert weights == pytest.approx(att["cross"][1][1][1], abs=6e-4)
    assert head2.find_elements(By.CSS_SELECTOR, "tr.picked")  # the row explained stands out

    grid = inside.find_elements(By.CSS_SELECTOR, "#inside-grid button")
    assert (len(grid) == 4
            and len(inside.find_elements(By.CSS_SELECTOR, "#inside-grid button.open")) == 1)
    grid[0].click()  # layer 1, head 1
    wait.until(shown("cross/1/1/1"))

    Select(browser.find_element(By.ID, "kind")).select_by_value("decoder_self")
    browser.find_elements(By.CSS_SELECTOR, "#tgt-tokens .tok")[2].click()  # a query's chip
    wait.until(shown("decoder_self/2/1/2"))
    notes = [n.text for n in inside.find_elements(By.CSS_SELECTOR, "#inside-steps .mask-note")]
    # keys after position 2
    assert notes == ["masked (future)"] * (len(att["target_input_tokens"]) - 3)
    screenshot(browser, tmp_path / "inside.png", 1280)
    browser.set_window_size(390, 900)
    assert overflow(browser)[0] <= overflow(browser)[1]
    screenshot(browser, tmp_path / "inside_390.png", 390)


# for each endpoint and the intro: content wider than its box (a <pre> scrolls inside, which is
# fine)
SPILLS = ("return [...document.querySelectorAll('#api > section')].filter(s => s.scrollWidth > "
          "s.clientWidth).length")
GAP = """const [intro, first] = document.querySelectorAll('#api > section');
const a = intro.getBoundingClientRect(), b = first.getBoundingClientRect();
return [b.top - a.bottom, Math.abs(a.width - b.width)];"""


@pytest.mark.slow
def test_docs_read_well_at_desktop_and_phone_width(browser, url, tmp_path):
    browser.set_window_size(1280, 900)
    browser.get(f"{url}/docs")
    WebDriverWait(browser, 30).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "section.endpoint")) == 4)
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    assert browser.find_elements(By.CSS_SELECTOR, ".intro p code")  # `...` in a description is code
    fields = browser.find_element(By.CSS_SELECTOR, "#post--api-translate .fields").text
    assert "texts" in fields and "nbest" in fields and "optional" in fields
    assert ("results[].hypotheses[].log_prob"
            in browser.find_element(By.ID, "post--api-translate").text)
    info = json.load(urlopen(f"{url}/api/info"))
    examples = [e.text for e in browser.find_elements(By.CSS_SELECTOR,
                                                      "section.endpoint pre.example")]
    sentence = info.get("example") or LANGUAGES[info["languages"]["source"]][1]
    assert (len(examples) == 4 and json.dumps({"texts": [sentence]}, ensure_ascii=False)
            in examples[0])
    for example in examples if shutil.which("curl") else []:  # each runs as shown
        answer = json.loads(subprocess.run(["bash", "-c", example], capture_output=True, check=True,
                                           timeout=60).stdout)
        assert "error" not in answer, (example, answer)
    for width in (1280, 390):
        browser.set_window_size(width, 900)
        assert "`" not in browser.find_element(By.TAG_NAME, "body").text
        scroll_width, inner_width = overflow(browser)
        assert scroll_width <= inner_width, f"{width} px: the page is {scroll_width} px wide"
        assert (browser.execute_script(SPILLS)
                == 0), f"{width} px: a section's content spills sideways"
        gap, widths = browser.execute_script(GAP)
        assert (gap < 40
                and widths < 1), f"{width} px: the intro and the endpoints are not one column"
        screenshot(browser, tmp_path / f"docs_{width}.png", width)
