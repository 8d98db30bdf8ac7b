"""attn-mt serve in a real browser: headless Chromium loads the page, translates, switches maps, hovers.

Skipped where there is no Chromium, chromedriver or selenium. ATTN_MT_SERVE_CHECKPOINT and
ATTN_MT_SERVE_TEXT run it on another model and sentence; ATTN_MT_SCREENSHOT says where the
screenshot goes (docs/serve.png was taken with the Multi30k model that way).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("no Chromium and chromedriver", allow_module_level=True)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from test_serve import serving  # noqa: E402

from attn_mt import checkpoint  # noqa: E402
from attn_mt.config import to_dict  # noqa: E402
from attn_mt.models import build_model  # noqa: E402
from attn_mt.serve import create_app  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1360,1250"]
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
    checkpoint.save({"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tok.state(), "step": 0},
                    path)
    return path


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="attn-mt-chromium-")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_page_translates_switches_maps_and_hovers(browser, two_layer_ckpt, tmp_path):
    ckpt = os.environ.get("ATTN_MT_SERVE_CHECKPOINT", str(two_layer_ckpt))
    text = os.environ.get("ATTN_MT_SERVE_TEXT", "the old man sees a small dog.")
    shot = Path(os.environ.get("ATTN_MT_SCREENSHOT", tmp_path / "serve.png"))
    with serving(create_app(ckpt, device="cpu")) as url:
        browser.get(f"{url}/?text={quote(text)}&beam=1")  # a shared link translates on load
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-translations") == "1")
        assert browser.find_element(By.ID, "text").get_attribute("value") == text
        assert browser.find_element(By.CSS_SELECTOR, "#nbest-list li .hyp").text
        assert "parameters" in browser.find_element(By.ID, "facts-list").text
        src = browser.find_elements(By.CSS_SELECTOR, "#src-tokens .tok")
        assert len(src) >= 2 and src[-1].text == "</s>"

        def signature():
            return browser.execute_script(SIGNATURE)

        seen = [signature()]
        assert seen[0].startswith("cross/1/1|")
        for control, value in [("kind", "encoder_self"), ("layer", "2"), ("head", "2"), ("kind", "decoder_self")]:
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
            "return [...document.querySelectorAll('#src-tokens .tok')].map(t => t.style.getPropertyValue('--to'))")
        assert any(float(x or 0) == 1.0 for x in tinted)  # the source token it attends to most
        shot.parent.mkdir(parents=True, exist_ok=True)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1360, height + 140)  # the whole page; the window frame takes some
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000

        browser.execute_script("document.getElementById('text').value = ''")
        browser.find_element(By.ID, "go").click()
        assert "Type a sentence" in browser.find_element(By.ID, "status").text
