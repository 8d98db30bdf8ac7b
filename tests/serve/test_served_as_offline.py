"""Continuous batching under load: 250 sentences sent by 8 and by 32 concurrent clients get, every
one, the translation `attn-mt translate` gives them (greedy and beam 5, fp32)."""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import replace
from http.client import HTTPConnection
from urllib.parse import urlsplit

import pytest
from conftest import serving

from attn_mt.decoding.translator import checkpoint_translator, hypotheses_json

pytest.importorskip("fastapi")  # the serve extra

from attn_mt.serve import Limits, create_app  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_run):
    # room for 64 sentences of beam 5 at once (the default work bound holds about 5): the answers do
    # not depend on the bounds, and the test takes a third of the time
    app = create_app(tiny_run / "checkpoint_best.pt", Limits(max_queue=64, max_batch_work=16384),
                     device="cpu")
    with serving(app) as url:
        yield app, url


def load(url: str, texts: list[str], clients: int, beam: int) -> list[dict]:
    """The texts in requests of 1 to 12 sentences, sent by `clients` closed-loop clients (one
    kept-alive http.client connection each: cheaper than httpx, so the server has the CPU); the
    answers in order."""
    chunks, start = [], 0
    for i in itertools.count():
        if start >= len(texts):
            break
        n = 1 + (i * 7) % 12
        chunks.append(range(start, min(start + n, len(texts))))
        start += n
    answers: list = [None] * len(texts)
    todo = iter(chunks)
    lock = threading.Lock()
    port = urlsplit(url).port

    def client():
        http = HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                chunk = next(todo, None)
            if chunk is None:
                return http.close()
            body = json.dumps({"texts": [texts[i] for i in chunk], "beam": beam}).encode()
            http.request("POST", "/api/translate", body, {"Content-Type": "application/json"})
            r = http.getresponse()
            data = r.read()
            results = json.loads(data)["results"] if r.status == 200 else [data] * len(chunk)
            for i, result in zip(chunk, results, strict=True):
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
    """250 sentences (a quarter of test2016: 40 requests of 1 to 12 sentences, more than one per
    client even at 32, and batches of 30-50 rows a step; twice as many took twice the time and
    proved nothing more), by 8 and by 32 concurrent clients: every answer is what `attn-mt
    translate` gives for the file (fp32), none differs."""
    from attn_mt.data.toy import make_toy_corpus

    app, url = server
    texts = [s for s, _ in make_toy_corpus(1200)["train"][:250]]
    translator = checkpoint_translator(tiny_run / "checkpoint_best.pt", "cpu")
    dcfg = replace(translator.decode, beam_size=beam, nbest=1)
    want = [{"source": t, "hypotheses": hypotheses_json(n)} for t, n in
            zip(texts, translator.translate_nbest(texts, dcfg), strict=True)]
    batcher = app.state.batcher
    for clients in (8, 32):
        rows, steps = batcher.rows, batcher.steps
        got = load(url, texts, clients, beam)
        # clients' sentences share steps
        assert (batcher.rows - rows) / (batcher.steps - steps) > clients / 2
        differ = [i for i, (a, b) in enumerate(zip(got, want, strict=True))
                  if not isinstance(a, dict)
                  or a["hypotheses"][0]["text"] != b["hypotheses"][0]["text"]]
        assert not differ, (clients, len(differ), [(got[i], want[i]) for i in differ[:3]])
        scores = [(a["hypotheses"][0]["score"], b["hypotheses"][0]["score"]) for a,
                  b in zip(got, want, strict=True)]
        assert max(abs(a - b) for a, b in scores) <= 2e-4
