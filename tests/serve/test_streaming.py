"""Continuous batching seen from clients: streamed answers, and the same translations as `translate` under load."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import replace

import pytest
from conftest import serving

from attn_mt.decoding.translator import checkpoint_translator, hypotheses_json

pytest.importorskip("fastapi")  # the serve extra
httpx = pytest.importorskip("httpx")

from attn_mt.serve import Limits, create_app  # noqa: E402
from attn_mt.serve.scheduler import Scheduler  # noqa: E402

TEXT = "yesterday the old man sees a small dog and the big cat"


@pytest.fixture(scope="module")
def server(tiny_run):
    app = create_app(tiny_run / "checkpoint_best.pt", Limits(max_queue=64), device="cpu")
    with serving(app) as url:
        yield app, url


def events(url: str, body: dict) -> list[tuple[str, dict]]:
    """The server-sent events of a streamed /api/translate: (name, data)."""
    out = []
    with httpx.stream("POST", f"{url}/api/translate", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for block in r.read().decode().split("\n\n"):
            if block:
                name, data = block.split("\n")
                out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_greedy_streams_the_translation_token_by_token(server):
    app, url = server
    assert isinstance(app.state.batcher, Scheduler)  # a Transformer checkpoint decodes continuously
    plain = httpx.post(f"{url}/api/translate", json={"texts": [TEXT, ""], "beam": 1}, timeout=30).json()
    got = events(url, {"texts": [TEXT, ""], "beam": 1})
    names = [n for n, _ in got]
    assert names[-1] == "done" and got[-1][1] == plain  # the last event is the plain answer
    grown = [d["text"] for n, d in got if n == "token" and d["index"] == 0]
    final = plain["results"][0]["hypotheses"][0]["text"]
    assert len(grown) >= 3 and grown[-1] == final and all(b.startswith(a.rstrip("▁")) for a, b in
                                                             itertools.pairwise(grown))
    results = {d["index"]: d["result"] for n, d in got if n == "result"}
    assert results == dict(enumerate(plain["results"])) and names.index("result") < len(names) - 1


def test_beam_streams_each_finished_hypothesis(server):
    _, url = server
    got = events(url, {"texts": [TEXT], "beam": 4, "nbest": 2})
    found = [d["hypothesis"] for n, d in got if n == "hypothesis"]
    final = got[-1][1]["results"][0]["hypotheses"]
    assert got[-1][0] == "done" and len(final) == 2 and all(h in found for h in final)


def test_a_bad_streamed_request_is_a_plain_json_error(server):
    _, url = server
    r = httpx.post(f"{url}/api/translate", json={"texts": [TEXT], "beam": 0, "stream": True}, timeout=30)
    assert r.status_code == 422 and r.json()["field"] == "beam"
    r = httpx.post(f"{url}/api/translate", json={"texts": [TEXT], "stream": "yes"}, timeout=30)
    assert r.status_code == 422 and r.json()["field"] == "stream"


def test_a_client_that_leaves_a_stream_frees_its_place_and_rows(server):
    app, url = server
    batcher = app.state.batcher
    with httpx.stream("POST", f"{url}/api/translate", json={"texts": [TEXT] * 4, "beam": 1, "stream": True},
                      timeout=30) as r:
        next(r.iter_lines())  # the first event: decoding has begun
    for _ in range(100):
        if not batcher.pending and not batcher._live:
            break
        time.sleep(0.02)
    assert not batcher.pending and not batcher._live
    assert httpx.post(f"{url}/api/translate", json={"texts": ["a dog"]}, timeout=30).status_code == 200


def load(url: str, texts: list[str], clients: int, beam: int) -> list[dict]:
    """The texts in requests of 1 to 4 sentences, sent by `clients` closed-loop clients; the answers in order."""
    sizes = [1 + (i * 7) % 4 for i in range(len(texts))]
    chunks, start = [], 0
    for n in sizes:
        if start < len(texts):
            chunks.append(range(start, min(start + n, len(texts))))
            start += n
    answers: list = [None] * len(texts)
    todo = iter(chunks)
    lock = threading.Lock()

    def client():
        with httpx.Client(timeout=60) as c:
            while True:
                with lock:
                    chunk = next(todo, None)
                if chunk is None:
                    return
                r = c.post(f"{url}/api/translate", json={"texts": [texts[i] for i in chunk], "beam": beam})
                for i, result in zip(chunk, r.json()["results"] if r.status_code == 200 else [r.text] * len(chunk),
                                     strict=True):
                    answers[i] = result

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 5])
def test_sentences_served_under_load_get_translate_s_translation(server, tiny_run, beam):
    """A test2016-sized input (1000 sentences), in requests of 1 to 4 sentences, by 8 and by 32 concurrent
    clients: every answer is what `attn-mt translate` gives for the file (fp32), none differs."""
    from attn_mt.data.toy import make_toy_corpus

    app, url = server
    texts = [s for s, _ in make_toy_corpus(1200)["train"][:1000]]
    translator = checkpoint_translator(tiny_run / "checkpoint_best.pt", "cpu")
    dcfg = replace(translator.decode, beam_size=beam, nbest=1)
    want = [{"source": t, "hypotheses": hypotheses_json(n)} for t, n in
            zip(texts, translator.translate_nbest(texts, dcfg), strict=True)]
    batcher = app.state.batcher
    for clients in (8, 32):
        rows, steps = batcher.rows, batcher.steps
        got = load(url, texts, clients, beam)
        assert (batcher.rows - rows) / (batcher.steps - steps) > clients / 2  # clients' sentences share steps
        differ = [i for i, (a, b) in enumerate(zip(got, want, strict=True))
                  if not isinstance(a, dict) or a["hypotheses"][0]["text"] != b["hypotheses"][0]["text"]]
        assert not differ, (clients, len(differ), [(got[i], want[i]) for i in differ[:3]])
        scores = [(a["hypotheses"][0]["score"], b["hypotheses"][0]["score"]) for a, b in zip(got, want, strict=True)]
        assert max(abs(a - b) for a, b in scores) <= 2e-4
