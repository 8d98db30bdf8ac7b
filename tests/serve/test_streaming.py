"""Streamed answers: greedy tokens, beam hypotheses, errors, and a client that leaves a stream."""

from __future__ import annotations

import itertools
import json
import logging
import time
from types import SimpleNamespace

import pytest
from conftest import serving, wait_until

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
    with httpx.stream("POST", f"{url}/api/translate", json={**body,
                                                            "stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for block in r.read().decode().split("\n\n"):
            if block:
                name, data = block.split("\n")
                out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_greedy_streams_the_translation_token_by_token(server):
    app, url = server
    assert isinstance(app.state.batcher, Scheduler)  # a Transformer checkpoint decodes continuously
    plain = httpx.post(f"{url}/api/translate", json={"texts": [TEXT, ""],
                                                     "beam": 1}, timeout=30).json()
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
    r = httpx.post(f"{url}/api/translate", json={"texts": [TEXT], "beam": 0, "stream": True},
                   timeout=30)
    assert r.status_code == 422 and r.json()["field"] == "beam"
    r = httpx.post(f"{url}/api/translate", json={"texts": [TEXT], "stream": "yes"}, timeout=30)
    assert r.status_code == 422 and r.json()["field"] == "stream"


def test_a_client_that_leaves_a_stream_frees_its_place_and_rows(server):
    app, url = server
    batcher = app.state.batcher
    with httpx.stream("POST", f"{url}/api/translate", json={"texts": [TEXT] * 4, "beam": 1,
                                                            "stream": True},
                      timeout=30) as r:
        next(r.iter_lines())  # the first event: decoding has begun
    wait_until(lambda: not batcher.pending and not batcher._live, what="the job to leave")
    assert (httpx.post(f"{url}/api/translate", json={"texts": ["a dog"]}, timeout=30).status_code
            == 200)


def test_a_model_error_mid_stream_is_answered_as_a_plain_request_is(tiny_run, caplog):
    """The exception's text (a path here) used to reach the client in `event: error` under "field":
    "queue"; now the stream's error is the plain request's 500 body, and the details are in the log
    only."""
    app = create_app(tiny_run / "checkpoint_best.pt", Limits(max_queue=64), device="cpu")
    model, calls = app.state.engine.translator.model, []
    checked = model.decode

    def failing(*args, **kwargs):  # the fifth decoder step fails
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("/home/someone/secret/model.bin: device lost")
        return checked(*args, **kwargs)

    model.decode = failing
    with serving(app) as url:
        got = events(url, {"texts": [TEXT], "beam": 1})
        calls.clear()
        plain = httpx.post(f"{url}/api/translate", json={"texts": [TEXT], "beam": 1}, timeout=30)
    assert [n for n, _ in got][-1] == "error" and len(got) > 1  # some tokens streamed first
    assert (plain.status_code == 500
            and got[-1][1] == plain.json() == {"error": "internal error: RuntimeError",
                                               "field": None})
    assert "secret" not in json.dumps(got) and "secret" in caplog.text


def _endless(app, delay_s: float = 0.01) -> list[float]:
    """The served model never predicts eos (every sentence runs to its length limit), a little
    slowly; returns [the delay of a step], which a test raises once its client leaves: the server's
    few steps to see the disconnect are then long ones, whatever the machine's load."""
    engine = app.state.engine
    model, eos = engine.translator.model, engine.tok.eos_id
    checked = model.decode
    delay = [delay_s]

    def decode(*args, **kwargs):
        time.sleep(delay[0])
        logits = checked(*args, **kwargs)
        logits[..., eos] = -float("inf")
        return logits

    model.decode = decode
    return delay


def test_a_client_that_leaves_a_stream_stops_its_decoding_under_asgi_spec_2_4(tiny_run):
    """uvicorn 0.29-0.32 (which pyproject allows) announce ASGI spec 2.4, so Starlette's
    StreamingResponse stops listening for http.disconnect, and their send() does not raise once the
    client is gone: the job used to decode to its end. Here, a server like theirs: spec 2.4, a send
    that swallows what follows the disconnect."""
    import asyncio

    app = create_app(tiny_run / "checkpoint_best.pt", Limits(max_queue=64), device="cpu")
    delay = _endless(app)
    batcher = app.state.batcher
    body = json.dumps({"texts": [TEXT], "beam": 1, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/api/translate",
             "raw_path": b"/api/translate", "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    left_at: list[int] = []

    async def client() -> list[bytes]:
        left, sent, messages = asyncio.Event(), [], iter([{"type": "http.request", "body": body}])

        async def receive():
            message = next(messages, None)
            if message is not None:
                return message
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if left.is_set():
                return  # uvicorn 0.29-0.32: nothing raised, nothing sent
            sent.append(message.get("body", b""))
            if message["type"] == "http.response.body" and b"event: token" in message["body"]:
                left_at.append(batcher.steps)
                delay[0] = 0.05
                left.set()  # the client leaves after its first token

        await asyncio.wait_for(app(scope, receive, send), 30)
        return sent

    asyncio.run(client())
    wait_until(lambda: not batcher.pending and not batcher._live, what="the decoding to stop")
    assert left_at
    # the limit is dozens of steps away
    assert batcher.steps - left_at[0] <= 4, (left_at, batcher.steps)
    batcher.close()


def test_a_client_that_leaves_a_long_stream_stops_its_decoding_on_a_real_server(tiny_run):
    """The same over a socket, with whichever uvicorn is installed (run it with the oldest pyproject
    allows: docs/reliability.md says how)."""
    app = create_app(tiny_run / "checkpoint_best.pt", Limits(max_queue=64), device="cpu")
    delay = _endless(app)
    batcher = app.state.batcher
    with serving(app) as url:
        with httpx.stream("POST", f"{url}/api/translate",
                          json={"texts": [TEXT], "beam": 1, "stream": True}, timeout=30) as r:
            next(line for line in r.iter_lines() if line.startswith("data:"))
            left_at, delay[0] = batcher.steps, 0.05
        wait_until(lambda: not batcher.pending and not batcher._live, what="the decoding to stop")
        assert batcher.steps - left_at <= 4, (left_at, batcher.steps)
    from attn_mt.serve.server import QUIET, Aggregate

    assert all(any(isinstance(f, Aggregate) for f in logging.getLogger(name).filters)
               for name in QUIET)


@pytest.fixture(scope="module")
def tok(tiny_run):
    from attn_mt.checkpoint import load_model

    return load_model(tiny_run / "checkpoint_best.pt")[2]


def test_the_incremental_detokenizer_gives_the_whole_decode_of_every_prefix(tok):
    """Streams decode each new token on the event loop, only since the last committed word boundary
    (the worker used to decode the whole prefix for every token); every prefix's text is the whole
    decode's, byte pieces, unknowns and control ids included; and it decodes a fraction of the
    tokens."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from attn_mt.serve.engine import Detokenizer

    words = [i for i in range(tok.tgt_vocab_size) if tok.tgt.id_to_piece(i).startswith("▁")]

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(ids=st.lists(st.one_of(st.sampled_from(words), st.integers(0, tok.tgt_vocab_size - 1)),
                        max_size=80),
           every=st.integers(1, 20))
    def prefixes(ids, every):
        d = Detokenizer(tok, every)
        for n in range(len(ids) + 1):
            assert d.text(ids[:n]) == tok.tgt.decode(ids[:n]), (ids[:n], d.cut)
        # not an extension
        assert d.text(ids[: len(ids) // 2]) == tok.tgt.decode(ids[: len(ids) // 2])

    prefixes()
    decoded, real = [], tok.tgt.decode
    d = Detokenizer(tok)
    counting = SimpleNamespace(id_to_piece=tok.tgt.id_to_piece,
                               decode=lambda x: decoded.append(len(x)) or real(x))
    d.tok = SimpleNamespace(tgt=counting)
    sentence = [i for _ in range(50) for i in tok.encode_tgt(["ein alter Mann sieht den Hund"])[0]]
    for n in range(1, len(sentence) + 1):
        assert d.text(sentence[:n]) == real(sentence[:n])
    # decoding every prefix whole: n^2 / 2 tokens
    assert sum(decoded) < 0.2 * len(sentence) ** 2 / 2
