"""A run's attention history drawn (analysis/history_view.py, api/history_pages.py, serve's
/history): the page carries one map per module x head for every probe and step (bytes that read
back), its slider covers every step, hostile tokens and sentences are escaped and nothing points at
the network; the PNG is a PNG of a sane size; `attn-mt heads --history RUN` writes both, checking
its outputs first, and refuses a run without a history in one line; /history is 404 without a
history and serves the page (under a CSP of its own hashes) with one.

In headless Chromium with the network off (skipped without Chromium, chromedriver or selenium): the
page opens from disk, the slider and the probe menu change the maps, the curves are drawn, the page
served under its CSP draws too, and without scripts the PNG shows. Screenshots go to tmp_path.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from conftest import LOCAL, chromium, cli, one_line_error

from attn_mt.analysis.history import History, Probe, save_history
from attn_mt.analysis.history_view import HistoryView, payload
from attn_mt.analysis.names import module_head
from attn_mt.analysis.roles import ROLES
from attn_mt.errors import InputError
from attn_mt.rundir import RunDir

DATA = re.compile(r'<script type="application/json" class="attn-mt-data">(.*?)</script>', re.S)
PNG = b"\x89PNG\r\n\x1a\n"
STEPS = [0, 40, 80, 160, 320]
MODULES = ["encoder 1 self", "decoder 1 self", "decoder 1 cross"]
HOSTILE = ["</script><script>alert(1)</script>", "\"'&<b>", "a\ud800b"]


def history(hostile: bool = False) -> History:
    """5 evaluations, 3 modules, 2 heads, 2 probes: encoder head 1 becomes a `prev` head at step 80,
    cross head 2 resolves the contrastive items from step 160 on, entropy leaves uniform at 80."""
    rng = np.random.default_rng(0)
    e, a, h = len(STEPS), len(MODULES), 2
    src = ["▁the", "▁animal", "▁was", "▁tired", ".", "</s>"]
    tgt = ["<s>", "▁das", "▁Tier", "▁war", "▁müde", "."]
    if hostile:
        src = [*HOSTILE, *src[3:]]
    sentence = "the animal was tired." + ("</script>\ud800\"<i>" if hostile else "")
    probes = [Probe("valid", "a dog.", "ein Hund.", ["▁a", "▁dog", ".", "</s>"],
                    ["<s>", "▁ein", "▁Hund", "."]),
              Probe("classic", sentence, "das Tier war müde.", src, tgt)]
    roles = {r: np.full((e, a, h), 0.1, np.float32) for r in ROLES}
    for r in ("prev", "same", "next"):
        roles[r][:, 2] = np.nan  # self-attention only
    roles["mono"][:, :2] = np.nan  # cross-attention only
    roles["prev"][:, 0, 0] = [0.1, 0.3, 0.6, 0.8, 0.9]
    roles["eos"][:, 1, 1] = [0.2, 0.6, 0.4, 0.7, 0.8]
    roles["mono"][:, 2, 0] = [-0.2, 0.1, 0.5, 0.7, 0.9]
    entropy = np.repeat(np.array([1.0, 0.95, 0.7, 0.6,
                                  0.5], np.float32)[:, None, None], a, 1).repeat(h, 2)
    coref = np.zeros((e, a, h), np.float32)
    coref[:, 2, 1] = [0.0, 0.5, 0.75, 0.85, 1.0]
    maps = []
    for p in probes:
        s, t = len(p.src_tokens), len(p.tgt_tokens)
        per = []
        for q, k in ((s, s), (t, t), (t, s)):
            w = rng.random((e, h, q, k)) ** 3
            per.append((w / w.sum(-1, keepdims=True)).astype(np.float16))
        maps.append(per)
    return History("transformer", STEPS, MODULES, h, roles, entropy, coref,
                   [0.5, 0.5, 0.6, 0.75, 0.9], [None, 1.5, 4.0, 9.5, 12.25], probes, maps)


@pytest.fixture(scope="module")
def page() -> str:
    return HistoryView(history(), "pronoun").to_html()


def test_the_page_carries_every_map_of_every_step_and_its_slider_covers_them(page):
    h = history()
    data = json.loads(DATA.findall(page)[0])
    assert data["steps"] == STEPS and data["modules"] == MODULES and data["heads"] == 2
    slider = re.search(r'<input type="range" class="hv-step" min="0" max="(\d+)" value="(\d+)" '
                       r'step="1">', page)
    # every step, the last shown first
    assert slider and int(slider[1]) == len(STEPS) - 1 == int(slider[2])
    assert len(data["probes"]) == 2 and re.findall(r'<option value="(\d+)"( selected)?>', page) == [
        ("0", ""), ("1", " selected")]  # the probe menu, the classic sentence shown first
    for p, probe in enumerate(data["probes"]):
        # a map per module, each with both heads at every step
        assert len(probe["maps"]) == len(MODULES)
        for a, m in enumerate(probe["maps"]):
            w = h.maps[p][a].astype(np.float32)
            # (E, H, Q, K)
            got = np.frombuffer(base64.b64decode(m["bytes"]), np.uint8).reshape(w.shape)
            assert np.array_equal(got, np.rint(w * 255).astype(np.uint8))
        src, tgt = h.probes[p].src_tokens, h.probes[p].tgt_tokens
        assert ([(m["queries"], m["keys"]) for m in probe["maps"]]
                == [(src, src), (tgt, tgt), (tgt, src)])
    # History.role_step, as the page marks it
    assert data["role_steps"][0][0] == {"role": "prev", "step": 80}
    assert (data["role_steps"][2][0] == {"role": "mono", "step": 80}
            and data["role_steps"][0][1] is None)
    assert (data["coref_step"] == {"module": 2, "head": 1, "step": 160}
            and data["uniform_step"] == 80)
    assert (data["bleu"] == [None, 1.5, 4.0, 9.5, 12.25] and data["roles"]["prev"][2][0] == [None]
            * 5)  # NaN: null
    # as `heads` names it
    assert "cross 1.2 first resolves 80% of the contrastive items at step 160" in page
    assert "the mean attention entropy leaves uniform at step 80" in page


def test_hostile_tokens_and_sentences_are_escaped_and_nothing_points_at_the_network(tmp_path):
    view = HistoryView(history(hostile=True), '</script><img src=x onerror="alert(1)">')
    page = view.to_html()
    assert "alert(1)</script>" not in page and "<img src=x" not in page and "\ud800" not in page
    # no token opened a tag
    assert len(re.findall(r"<script", page)) == 2 and page.count("<img") == 1
    assert "&lt;/script&gt;" in page  # the menu's sentence and the title, as text
    data = json.loads(DATA.findall(page)[0])
    # read back whole
    assert data["probes"][1]["maps"][0]["keys"][:3] == [HOSTILE[0], HOSTILE[1], "a\ufffdb"]
    assert data["probes"][1]["source"].endswith("</script>\ufffd\"<i>")
    assert page.count("http") == 0  # no URL of any kind (the charts are canvases, not SVG)
    for pattern in (r"<[a-z][^>]*\s(src|href)=(?!\"data:)", r"url\(", r"@import", r"\bfetch\(",
                    # a tag's src or href: a data: URL only
                    r"XMLHttpRequest", r"\brequire\(", r"\bimport\("):
        assert not re.search(pattern, page), pattern
    saved = view.save_html(tmp_path / "history.html")
    # a lone surrogate would not encode
    assert saved.read_text(encoding="utf-8").startswith("<!doctype html>")


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG) and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_png_is_a_png_of_a_sane_size_and_the_writers_check_their_paths(tmp_path):
    view = history().view("pronoun")  # History.view: what a notebook shows
    path = view.save_png(tmp_path / "history.png")
    width, height = png_size(path.read_bytes())
    assert 500 <= width <= 1600 and 300 <= height <= 1400 and path.stat().st_size < 200_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.png"]  # no temporary file left
    for bad in (None, {}, ""):
        with pytest.raises(InputError) as err:
            view.save_png(bad)
        assert err.value.field == "path"
        with pytest.raises(InputError):
            view.save_html(bad)
    assert repr(view) == "<HistoryView 'pronoun': 5 steps, 3 modules x 2 heads, 2 probes>"
    # drawn once
    assert 'data-view="history"' in view._repr_html_() and view.picture == path.read_bytes()
    with pytest.raises(InputError) as err:
        history().view(5)
    assert err.value.field == "name"


def test_payload_of_a_history_without_contrastive_items(page):
    h = history()
    bare = History(h.model_kind, h.steps, h.modules, h.n_heads, h.roles, h.entropy, None,
                   [None] * 5, h.bleu, h.probes, h.maps)
    data = payload(bare)
    assert (data["coref"] is None and data["coref_step"] is None and data["contrastive"] == [None]
            * 5)
    # the tooltips'
    assert data["head_names"] == [[module_head(m, h + 1) for h in range(2)] for m in h.modules]
    # as `heads` names them
    assert data["head_names"][-1] == ["cross 1.1", "cross 1.2"], data["modules"]


def test_heads_history_draws_a_recorded_run_and_refuses_one_without(tmp_path):
    run, empty = tmp_path / "run", tmp_path / "empty"
    save_history(history(), RunDir(run))
    empty.mkdir()
    html, png = tmp_path / "out.html", tmp_path / "out.png"
    result = cli("heads", "--history", run, "--html", html, "--png", png)
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(html), str(png)]
    assert "<title>attn-mt history: run</title>" in html.read_text(encoding="utf-8")
    assert png_size(png.read_bytes())[0] > 500

    one_line_error(cli("heads", "--history", empty, "--html", tmp_path / "e.html"), 1,
                   str(RunDir(empty).history), "not found")
    (empty / "attention_history.npz").write_bytes(b"PK\x03\x04 cut short")
    one_line_error(cli("heads", "--history", empty, "--png", tmp_path / "e.png"), 1,
                   str(RunDir(empty).history), "attention history")
    one_line_error(cli("heads", "--history", run, "--html", tmp_path / "e.txt"), 2, "--html",
                   ".html")
    one_line_error(cli("heads", "--history", run), 1, "--html or --png")
    (tmp_path / "e.png").symlink_to(RunDir(run).history)
    one_line_error(cli("heads", "--history", run, "--png", tmp_path / "e.png"), 2,
                   "the same file as the input")
    (tmp_path / "e.png").unlink()
    assert not list(tmp_path.glob("e.*"))  # nothing written


def test_a_history_of_no_records_draws_as_such_everywhere(tiny_run, tmp_path):
    """Train without recording, kill; resume recording, kill inside the last checkpoint's write;
    resume again (its recorder drops the record after the checkpoint: none is left), kill before the
    next evaluation: the file holds no record. `heads --history` (HTML and PNG) and /history crashed
    on it (a reduction over an empty array, steps[0]); each now draws "no evaluations recorded
    yet"."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from attn_mt.analysis.history import load_history, truncated
    from attn_mt.analysis.history_view import NO_RECORDS
    from attn_mt.serve import create_app

    run = tmp_path / "run"
    save_history(truncated(history(), -1), RunDir(run))  # as Recorder.rewind writes it
    assert load_history(run).steps == [] and len(load_history(run).modules) == 3
    html, png = tmp_path / "out.html", tmp_path / "out.png"
    result = cli("heads", "--history", run, "--html", html, "--png", png)
    assert result.exit_code == 0, result.output
    assert NO_RECORDS in html.read_text(encoding="utf-8") and png.read_bytes().startswith(PNG)
    shutil.copy(tiny_run / "checkpoint_best.pt", run / "checkpoint_best.pt")
    with TestClient(create_app(run / "checkpoint_best.pt", device="cpu"), base_url=LOCAL) as c:
        r = c.get("/history")
        assert r.status_code == 200 and NO_RECORDS in r.text


def test_serve_has_a_history_page_only_when_the_run_recorded_one(tiny_run, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from attn_mt.serve import create_app

    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(tiny_run / "checkpoint_best.pt", folder / "checkpoint_best.pt")
    with TestClient(create_app(folder / "checkpoint_best.pt", device="cpu"), base_url=LOCAL) as c:
        r = c.get("/history")
        assert r.status_code == 404 and "no attention history" in r.json()["error"]
        assert c.get("/api/info").json()["history"] is False
        # app.js shows it where there is one
        assert 'id="history-link" href="/history" hidden' in c.get("/").text
        # read at each request: a run that records while it is served
        save_history(history(), RunDir(folder))
        r = c.get("/history")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'data-view="history"' in r.text and r.text.startswith("<!doctype html>")
        csp = r.headers["content-security-policy"]
        # 2 styles, 1 script
        assert csp.startswith("default-src 'none'; img-src data:;") and csp.count("'sha256-") == 3
        assert c.get("/api/info").json()["history"] is True
        RunDir(folder).history.write_bytes(b"not a history")
        r = c.get("/history")
        assert r.status_code == 500 and str(folder) not in r.text


def test_history_is_drawn_once_per_file_version_by_the_model_worker_under_the_queue_limit(
        tiny_run, tmp_path, monkeypatch):
    """/history read and drew the file at every request (0.8-1.4 s), each in a thread of its own: 40
    requests at once saturated the CPU, took RSS from 330 MB to 1.6 GB and kept /api/info waiting
    5.2 s. Now the page is drawn once per version of the file, by the model worker, as a job of the
    queue: beyond max_queue, 503."""
    pytest.importorskip("fastapi")
    import threading as threads

    from fastapi.testclient import TestClient

    from attn_mt.analysis import history as history_mod
    from attn_mt.serve import Limits, create_app

    folder = tmp_path / "run"
    save_history(history(), RunDir(folder))
    shutil.copy(tiny_run / "checkpoint_best.pt", folder / "checkpoint_best.pt")
    loads, load = [], history_mod.load_history
    gate = threads.Event()
    gate.set()

    def counted(path):
        loads.append(threads.current_thread().name)
        gate.wait(10)
        return load(path)

    monkeypatch.setattr(history_mod, "load_history", counted)
    app = create_app(folder / "checkpoint_best.pt", device="cpu", limits=Limits(max_queue=1))
    with TestClient(app, base_url=LOCAL) as c:
        first = c.get("/history")
        assert (first.status_code == 200 and [c.get("/history").text for _ in range(3)]
                == [first.text] * 3)
        assert loads == ["attn-mt-model"]  # drawn once, by the model worker
        # a new record: a new version of the file
        save_history(history(hostile=True), RunDir(folder))
        assert c.get("/history").text != first.text and len(loads) == 2
        save_history(history(), RunDir(folder))
        gate.clear()  # the next drawing holds the worker, the one place in the queue taken
        busy = threads.Thread(target=c.get, args=("/history",))
        busy.start()
        while len(loads) < 3:
            threads.Event().wait(0.01)
        r = c.get("/history")
        gate.set()
        busy.join()
        assert r.status_code == 503 and r.json()["field"] == "queue"


# ---- in a browser: the page from disk and as served, with the network off ----

MAPS = "return [...document.querySelectorAll('canvas.hv-map')].map(c => c.toDataURL()).join('|')"
INK = """return [...document.querySelectorAll('canvas.hv-curve, canvas.hv-overall')].map(c => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, seen = new Set();
    for (let i = 0; i < d.length; i += 4)
      if (d[i + 3] > 200) seen.add(d[i] << 16 | d[i + 1] << 8 | d[i + 2]);
    return seen.size; });"""


@pytest.fixture(scope="module")
def browser():
    with chromium("--window-size=1280,1000", "--proxy-server=127.0.0.1:9") as d:
        yield d  # every request but the loopback's fails: no network


def problems(browser) -> list:
    # a script error, a CSP refusal
    return [m for m in browser.get_log("browser") if m["level"] == "SEVERE"]


def slide(browser, index: int) -> None:
    browser.execute_script("const s = document.querySelector('.hv-step'); s.value = arguments[0];"
                           "s.dispatchEvent(new Event('input'));", index)


@pytest.mark.slow
def test_the_page_draws_from_disk_and_its_slider_changes_the_maps(browser, tmp_path):
    from selenium.webdriver.support.ui import Select

    path = HistoryView(history(hostile=True), "pronoun").save_html(tmp_path / "history.html")
    browser.get(path.resolve().as_uri())
    assert not problems(browser)
    # fetched nothing
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    # the drawings replace the PNG
    assert not browser.find_element("css selector", ".hv-static").is_displayed()
    assert len(browser.find_elements("css selector", "canvas.hv-map")) == len(MODULES) * 2
    body = browser.find_element("css selector", ".attn-mt-body")
    assert (body.get_attribute("data-step") == str(STEPS[-1])
            and body.get_attribute("data-probe") == "1")  # classic
    assert min(browser.execute_script(INK)) >= 4  # every chart drew lines of several colours
    seen = [browser.execute_script(MAPS)]
    for i in (0, 2):
        slide(browser, i)
        assert body.get_attribute("data-step") == str(STEPS[i])
        assert (f"step {STEPS[i]} ({i + 1} of 5)"
                in browser.find_element("css selector", ".hv-at").text)
        seen.append(browser.execute_script(MAPS))
    Select(browser.find_element("css selector", ".hv-probe")).select_by_value("0")
    seen.append(browser.execute_script(MAPS))
    assert len(set(seen)) == 4  # each step and the other probe drew other maps
    assert not problems(browser)
    browser.set_window_size(
        1280, browser.execute_script("return document.documentElement.scrollHeight") + 140)
    browser.save_screenshot(str(tmp_path / "history.png"))
    assert (tmp_path / "history.png").stat().st_size > 10_000

    # GitHub's renderer drops scripts: the summary PNG shows
    page = path.read_text(encoding="utf-8")
    (tmp_path / "bare.html").write_text(
        re.sub(r"<script(?![^>]*application/json)[^>]*>.*?</script>", "", page,
               flags=re.S), encoding="utf-8")
    browser.get((tmp_path / "bare.html").resolve().as_uri())
    picture = browser.find_element("css selector", ".hv-static")
    assert (picture.is_displayed()
            and browser.execute_script("return arguments[0].naturalWidth", picture) > 500)


@pytest.mark.slow
def test_the_served_page_draws_under_its_content_security_policy(browser, tmp_path):
    from attn_mt.api.history_pages import history_page
    from attn_mt.serve.app import inline_csp

    save_history(history(), RunDir(tmp_path))
    page = history_page(RunDir(tmp_path).history).encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Security-Policy", inline_csp(page.decode("utf-8")))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/history")
        assert not problems(browser)  # no inline script or style refused
        assert len(browser.find_elements("css selector", "canvas.hv-map")) == len(MODULES) * 2
        assert min(browser.execute_script(INK)) >= 4
    finally:
        server.shutdown()
        thread.join(5)
