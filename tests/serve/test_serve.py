"""attn-mt serve: the API contract in-process, every bad input, the batcher, a client that leaves,
the CLI."""

from __future__ import annotations

import json
import re
import socket
import threading
from dataclasses import replace

import pytest
from conftest import LOCAL, SERVE_LIMITS, TINY, serving, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.cli import app as cli
from attn_mt.config import load_config
from attn_mt.decoding.translate import translate_nbest
from attn_mt.models import count_params

pytest.importorskip("fastapi")  # the serve extra
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from attn_mt.serve import Limits, create_app  # noqa: E402
from attn_mt.serve.api import TranslateRequest  # noqa: E402
from attn_mt.serve.batcher import Batcher, QueueFull  # noqa: E402

LIMITS = Limits(**SERVE_LIMITS)  # those of conftest's `client`
SENTENCES = ["the old man sees a small dog.", "", "yesterday the big cat runs.", "a dog"]


@pytest.fixture(scope="module")
def rnn_ckpt(tmp_path_factory):
    """A tiny RNN run (a few seconds): the page and API must work with its additive attention."""
    from attn_mt.training.run import train

    cfg = load_config(None, [o for o in TINY if not o.startswith("model.")] + [
        "model.kind=rnn", "model.d_embed=16", "model.d_hidden=16", "model.d_attn=16",
        "model.dropout=0.0", "train.max_epochs=1"])
    run_dir = tmp_path_factory.mktemp("rnn_serve")
    train(cfg, run_dir)
    return run_dir / "checkpoint_best.pt"


# ---- the contract ----

def test_translate_matches_translate_nbest_in_input_order(client, ckpt):
    model, cfg, tok = checkpoint.load_model(ckpt)
    r = client.post("/api/translate", json={"texts": SENTENCES, "beam": 3, "nbest": 2,
                                            "alpha": 1.0})
    assert r.status_code == 200
    results = r.json()["results"]
    dcfg = replace(cfg.decode, beam_size=3, nbest=2, alpha=1.0)
    expected = translate_nbest(model, tok, SENTENCES, dcfg)
    assert [x["source"] for x in results] == SENTENCES
    for got, want in zip(results, expected, strict=True):
        assert got["hypotheses"] == [{"text": h.text, "score": round(h.score, 4),
                                      "log_prob": round(h.log_prob, 4)}
                                     for h in want]
    assert len(results[0]["hypotheses"]) == 2 and results[1]["hypotheses"] == [
        {"text": "", "score": 0.0, "log_prob": 0.0}]  # an empty text: one empty translation


def test_translate_defaults_to_the_checkpoints_decoding(client, ckpt):
    model, cfg, tok = checkpoint.load_model(ckpt)
    r = client.post("/api/translate", json={"texts": SENTENCES[:1]})
    assert (r.json()["results"][0]["hypotheses"][0]["text"]
            == translate_nbest(model, tok, SENTENCES[:1],
                               cfg.decode)[0][0].text)


def test_attention_shapes_and_tokens(client, ckpt):
    model, cfg, tok = checkpoint.load_model(ckpt)
    r = client.post("/api/attention", json={"text": SENTENCES[0], "beam": 1})
    a = r.json()
    assert r.status_code == 200
    s, t = len(a["source_tokens"]), len(a["target_tokens"])
    assert a["source_tokens"][-1] == a["target_tokens"][-1] == "</s>"
    assert a["target_input_tokens"] == ["<s>", *a["target_tokens"][:-1]]
    layers, heads = cfg.model.n_layers, cfg.model.n_heads
    for kind, (tq, tk) in {"encoder_self": (s, s), "decoder_self": (t, t), "cross": (t, s)}.items():
        maps = a[kind]
        assert ((len(maps), len(maps[0]), len(maps[0][0]), len(maps[0][0][0]))
                == (layers, heads, tq, tk)), kind
        assert all(abs(sum(row) - 1) < 1e-2 for layer in maps for head in layer for row in head)
    greedy = client.post("/api/translate", json={"texts": [SENTENCES[0]], "beam": 1}).json()
    assert a["translation"] == greedy["results"][0]["hypotheses"][0]["text"]


def test_info(client, ckpt):
    info = client.get("/api/info").json()
    model, cfg, tok = checkpoint.load_model(ckpt)
    state = checkpoint.load(ckpt)
    assert info["parameters"] == count_params(model)
    assert (info["architecture"]["kind"] == "transformer"
            and info["architecture"]["n_heads"] == cfg.model.n_heads)
    assert info["vocabulary"] == {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size,
                                  "joint": True}
    assert info["step"] == state["step"] and info["valid_bleu"] == round(state["best_bleu"], 2)
    assert (info["attention"] == ["encoder_self", "decoder_self", "cross"]
            and info["model"] == "checkpoint")
    assert info["limits"]["max_texts"] == LIMITS.max_texts


def test_the_served_model_is_not_patched(client, rnn_ckpt):
    """The engine passes its interrupt to the search; no method of the model object is replaced."""
    for app in (client.app, create_app(rnn_ckpt, LIMITS, device="cpu")):
        model = app.state.engine.translator.model
        assert model is not None and not any(callable(v) for v in vars(model).values()
                                             if not isinstance(v, type))


def test_page_static_files_and_openapi(client):
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    # nothing fetched from elsewhere
    assert "http" not in client.get("/static/app.js").text.replace("HTTP ", "")
    # the steps' drawing, shared with the notebook's views
    views = client.get("/static/analysis/views.js")
    assert (views.status_code == 200 and "function drawSteps" in views.text
            and "/static/analysis/views.js" in page.text)
    assert client.get("/static/analysis/views.css").status_code == 200
    schema = client.get("/openapi.json").json()
    assert {"/api/translate", "/api/attention", "/api/info"} <= set(schema["paths"])
    docs = client.get("/docs")  # the API reference, rendered from /openapi.json without a CDN
    assert docs.status_code == 200 and "/static/docs.js" in docs.text and "http" not in docs.text
    assert "/openapi.json" in client.get("/static/docs.js").text
    assert "http" not in client.get("/static/docs.js").text


def test_rnn_checkpoint_translation_and_cross_attention_only(rnn_ckpt):
    with TestClient(create_app(rnn_ckpt, device="cpu"), base_url=LOCAL) as c:
        assert c.get("/api/info").json()["attention"] == ["cross"]
        r = c.post("/api/translate", json={"texts": ["a dog", "the cat"], "beam": 2, "nbest": 2})
        assert (r.status_code == 200 and [len(x["hypotheses"]) for x in r.json()["results"]]
                == [2, 2])
        a = c.post("/api/attention", json={"text": "a dog"}).json()
        assert a["encoder_self"] == [] and a["decoder_self"] == []
        cross = a["cross"]
        assert (len(cross), len(cross[0]), len(cross[0][0]), len(cross[0][0][0])) == (
            1, 1, len(a["target_tokens"]), len(a["source_tokens"]))


# ---- bad input: 4xx with a JSON error naming the field, and the server goes on ----

BAD = [
    ('{"texts": ["a"', 400, "body"),  # malformed JSON
    ("", 400, "body"),
    ('["a"]', 400, "body"),
    ("{}", 422, "texts"),
    ('{"texts": "a dog"}', 422, "texts"),
    ('{"texts": []}', 422, "texts"),
    ('{"texts": ["a", 3]}', 422, "texts.1"),
    ('{"texts": [null]}', 422, "texts.0"),
    ('{"texts": ["a"], "beam": "2"}', 422, "beam"),
    ('{"texts": ["a"], "beam": 2.5}', 422, "beam"),
    ('{"texts": ["a"], "beam": true}', 422, "beam"),
    ('{"texts": ["a"], "beam": 0}', 422, "beam"),
    ('{"texts": ["a"], "beam": 7}', 422, "beam"),  # over max_beam
    ('{"texts": ["a"], "beam": 2, "nbest": 3}', 422, "nbest"),
    ('{"texts": ["a"], "nbest": 0}', 422, "nbest"),
    ('{"texts": ["a"], "alpha": -1}', 422, "alpha"),
    ('{"texts": ["a"], "alpha": NaN}', 422, "alpha"),
    ('{"texts": ["a"], "alpha": "big"}', 422, "alpha"),
    ('{"texts": ["a"], "beam_size": 2}', 422, "beam_size"),  # unknown key
    ('{"texts": ["a", "b", "c", "d", "e"]}', 413, "texts"),  # over max_texts
    (json.dumps({"texts": ["x" * 150, "y" * 60]}), 413, "texts"),  # over max_chars
]

BAD_ATTENTION = [
    ('{"text": ""}', 422, "text"),
    ('{"text": "   "}', 422, "text"),
    ('{"text": ["a"]}', 422, "text"),
    ('{"texts": ["a"]}', 422, "text"),
    (json.dumps({"text": "x" * 101}), 413, "text"),
    ('{"text": "a", "beam": 99}', 422, "beam"),
    ('{"text": "a", "beam": -1}', 422, "beam"),
]


@pytest.mark.parametrize("path,body,status,field", [("/api/translate", *b) for b in BAD]
                         + [("/api/attention", *b) for b in BAD_ATTENTION])
def test_bad_input_names_the_field(client, path, body, status, field):
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()
    assert error["field"] == field and error["error"].startswith(f"{field}: ")
    assert "Traceback" not in r.text


def test_oversized_bodies_are_refused_unread(client):
    big = json.dumps({"texts": ["x" * 10_000]}).encode()
    r = client.post("/api/translate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"
    chunks = (big[i : i + 1000] for i in range(0, len(big), 1000))  # no content-length: chunked
    r = client.post("/api/translate", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"
    r = client.post("/api/translate", content=(c for c in [b'{"texts": ', b'["a dog"]}']),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200


def test_huge_numbers_and_deep_nesting_name_their_field_and_are_not_echoed(client):
    for body, status, field in [('{"texts": ["a"], "beam": %s}' % ("9" * 5000), 422, "beam"),
                                ('{"texts": ["a"], "beam": 2, "nbest": %s}' % ("7" * 4000), 422,
                                 "nbest"),
                                ('{"texts": ["a", %s]}' % ("-" + "1" * 4400), 422, "texts.1"),
                                ('{"texts": ' + "[" * 3000 + '"a"' + "]" * 3000 + "}", 400,
                                 "body")]:
        r = client.post("/api/translate", content=body,
                        headers={"content-type": "application/json"})
        assert r.status_code == status and r.json()["field"] == field, r.text
        assert len(r.content) < 300 and "999999" not in r.text and "777777" not in r.text


def test_other_errors_are_json_too(client):
    assert client.get("/nope").json() == {"error": "Not Found", "field": None}
    assert client.get("/api/translate").status_code == 405


def test_lone_surrogates_and_odd_text_are_translated(client):
    texts = ["\ud800 dog", "\x00\x01", "😀 " * 20, "ß" * 100]
    # "\ud800" escaped, as JSON allows
    r = client.post("/api/translate", content=json.dumps({"texts": texts}),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["results"][0]["source"] == "\ufffd dog"



@pytest.mark.parametrize("path,body", [("/api/attention", {"text": "\ud800 dog"}),
                                       ("/api/explain", {"text": "\ud800 dog", "kind": "encoder"}),
                                       ("/api/explain", {"text": "a dog", "kind": "encoder",
                                                         "token": "\udfff"})])
def test_lone_surrogates_follow_one_rule_everywhere(client, path, body):
    """Each becomes U+FFFD, as /api/translate does (attention and explain used to refuse them: 422
    'unable to parse raw data as a unicode string'): the answer is that of the text with U+FFFD in
    its place."""
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    cleaned = {k: v.replace("\ud800", "\ufffd").replace("\udfff", "\ufffd") if isinstance(v, str)
               else v for k, v in body.items()}
    want = client.post(path, json=cleaned)
    assert (r.status_code, r.json()) == (want.status_code, want.json())
    assert r.status_code == 200 or (r.status_code == 422 and r.json()["field"] == "token")


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 20)
                           | st.floats(allow_nan=False) | st.text(max_size=12),
                           lambda kids: st.lists(kids, max_size=3), max_leaves=6)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(["texts", "text", "beam", "nbest", "alpha", "x"]),
                            json_values))
def test_no_request_body_makes_a_server_error(client, body):
    for path in ("/api/translate", "/api/attention"):
        r = client.post(path, content=json.dumps(body),
                        headers={"content-type": "application/json"})  # Infinity too
        assert r.status_code in (200, 400, 413, 422), (path, body, r.text)
        if r.status_code != 200:
            assert set(r.json()) >= {"error", "field"}


def test_custom_limits(ckpt):
    with TestClient(create_app(ckpt, Limits(max_texts=1, max_chars=5), device="cpu"),
                    base_url=LOCAL) as c:
        assert c.post("/api/translate", json={"texts": ["a", "b"]}).json()["field"] == "texts"
        assert c.post("/api/translate", json={"texts": ["abcdef"]}).status_code == 413
        assert c.post("/api/translate", json={"texts": ["abc"]}).status_code == 200


# ---- dynamic batching ----

def test_batcher_puts_waiting_requests_into_one_batch():
    gate, busy, calls = threading.Event(), threading.Event(), []

    def run_batch(key, items):
        calls.append((key, list(items)))
        busy.set()
        gate.wait(30)
        return [x * 2 for x in items]

    b = Batcher(run_batch, lambda item: item, max_batch=64, max_wait_s=0.0)
    first = b.submit("k", [0])  # occupies the worker until the gate opens
    assert busy.wait(30)  # the worker holds it: what follows waits together
    futures = [b.submit("k", [i, i + 100]) for i in range(1, 9)] + [b.submit("other", [7])]
    gate.set()
    assert first.result(30) == [0]
    assert [f.result(30) for f in futures[:8]] == [[2 * i, 2 * (i + 100)] for i in range(1, 9)]
    assert futures[8].result(30) == [14]
    assert [len(items) for _, items in calls] == [1, 16, 1]  # 8 requests decoded in one call
    b.close()


def test_batcher_skips_cancelled_jobs_and_survives_errors():
    gate, busy, seen = threading.Event(), threading.Event(), []

    def run_batch(key, items):
        seen.extend(items)
        busy.set()
        gate.wait(30)
        if "boom" in items:
            raise RuntimeError("model failed")
        return items

    b = Batcher(run_batch, lambda item: item, max_wait_s=0.0)
    first = b.submit("a", ["first"])
    assert busy.wait(30)
    assert b.submit("b", ["gone"]).cancel()  # the client left while it waited
    gate.set()
    assert first.result(30) == ["first"]
    with pytest.raises(RuntimeError):
        b.submit("c", ["boom"]).result(30)
    assert b.submit("d", ["after"]).result(30) == ["after"]
    assert "gone" not in seen
    b.close()


def test_batcher_takes_from_every_waiting_request_in_turn():
    gate, busy, calls = threading.Event(), threading.Event(), []

    def run_batch(key, items):
        calls.append(list(items))
        busy.set()
        gate.wait(30)
        return items

    b = Batcher(run_batch, lambda item: item, max_batch=4, max_batch_work=25, max_wait_s=0.0)
    b.submit("k", ["hold"])
    assert busy.wait(30)
    huge = b.submit("k", [f"h{i}" for i in range(40)], costs=[10] * 40)  # one client's huge request
    small = b.submit("k", ["small"], costs=[3])  # then a one-sentence request
    gate.set()
    assert small.result(30) == ["small"] and huge.result(30) == [f"h{i}" for i in range(40)]
    before = next(i for i, call in enumerate(calls) if "small" in call)
    # it waited for no huge call
    assert sum(len(c) for c in calls[1:before]) == 0 and len(calls[before]) <= 4
    # calls bounded by work
    assert all(sum(3 if x == "small" else 10 for x in c) <= 25 for c in calls[1:])
    b.close()


def test_batcher_is_fair_across_settings_and_attention_jobs():
    """The issue's case: 20 requests of 64 sentences, each with its own settings, and 10 attention
    jobs wait; then a one-sentence request. It waits for one call of each group, each within
    max_batch_work, and the attention jobs take one call between them."""
    gate, busy, calls = threading.Event(), threading.Event(), []

    def run_batch(key, items):
        calls.append((key, list(items)))
        busy.set()
        gate.wait(30)
        return items

    def run_one(item):
        calls.append((None, [item]))
        gate.wait(30)
        return item

    b = Batcher(run_batch, run_one, max_batch=64, max_batch_work=4096, max_wait_s=0.0)
    b.submit("hold", ["hold"])
    assert busy.wait(30)
    # 20 alphas: each its own group; a sentence of 15 subwords at beam 16 is 240 units
    for i in range(20):
        b.submit(("alpha", i), [f"s{i}.{k}" for k in range(64)], costs=[240] * 64)
    for i in range(10):
        b.submit(None, [f"map{i}"], costs=[8000])
    small = b.submit("default", ["small"], costs=[20])
    gate.set()
    assert small.result(30) == ["small"]
    before = calls[1 : next(i for i, (_, items) in enumerate(calls) if items == ["small"])]
    keys = [key for key, _ in before]
    # one call of each group ahead; the attention jobs: one
    assert len(keys) == len(set(keys)) == 21
    # each within the work
    assert all(len(items) == 4096 // 240 for key, items in before if key is not None)
    b.close()


def test_a_held_answer_keeps_its_place_in_the_queue_until_released():
    b = Batcher(lambda key, items: items, lambda item: item, max_queue=1, max_wait_s=0.0)
    # the app holds it until the client has taken the answer
    answered = b.submit("k", ["a"], hold=True)
    assert answered.result(30) == ["a"]
    with pytest.raises(QueueFull):
        b.submit("k", ["b"])
    b.release(answered)
    # not held: freed when answered
    assert b.submit("k", ["b"]).result(30) == ["b"] and not b.pending
    b.close()


def test_batcher_queue_is_bounded_and_stop_fails_the_waiting():
    gate, busy = threading.Event(), threading.Event()
    b = Batcher(lambda key, items: busy.set() or gate.wait(30) and items, lambda item: item,
                max_queue=2, max_wait_s=0.0)
    first = b.submit("k", ["running"])
    assert busy.wait(30)  # taken by the worker: the next one waits
    waiting = b.submit("k", ["waiting"])
    with pytest.raises(QueueFull):
        b.submit("k", ["one too many"])
    b.stop()
    gate.set()
    first.result(30)
    with pytest.raises(Exception, match="shutting down"):
        waiting.result(30)
    b.close()


def test_a_full_queue_is_answered_503_with_retry_after(ckpt):
    app = create_app(ckpt, replace(LIMITS, max_queue=2), device="cpu")  # the held job and one more
    gate, holding = threading.Event(), threading.Event()
    app.state.batcher.run_one = lambda item: holding.set() or gate.wait(10)
    with TestClient(app, base_url=LOCAL) as c:
        held = app.state.batcher.submit(None, ["hold"])
        assert holding.wait(30)
        app.state.batcher.submit("k", ["fills the queue"])
        r = c.post("/api/translate", json={"texts": ["a dog"]})
        assert (r.status_code == 503 and r.headers["retry-after"] == "1"
                and r.json()["field"] == "queue")
        gate.set()
        held.result(30)


def test_work_per_request_is_bounded_and_named(ckpt):
    with TestClient(create_app(ckpt, replace(LIMITS, max_work=40), device="cpu"),
                    base_url=LOCAL) as c:
        assert c.get("/api/info").json()["limits"]["max_work"] == 40
        r = c.post("/api/translate", json={"texts": ["the old man sees a small dog."], "beam": 6})
        assert (r.status_code == 413 and r.json()["field"] == "texts"
                and "max_work=40" in r.json()["error"])
        assert c.post("/api/translate", json={"texts": ["the old man sees a small dog."],
                                              "beam": 1}).status_code == 200
        r = c.post("/api/attention", json={"text": "the old man sees a small dog.", "beam": 6})
        assert r.status_code == 413 and r.json()["field"] == "text"


def test_attention_weights_are_sent_rounded(client):
    r = client.post("/api/attention", json={"text": SENTENCES[0]})
    assert r.status_code == 200 and not re.search(r"\d\.\d{5,}", r.text)  # 4 decimals at most


def test_concurrent_clients_share_batches(ckpt):
    app = create_app(ckpt, LIMITS, device="cpu")
    with TestClient(app, base_url=LOCAL) as c:
        def ask(i):
            return c.post("/api/translate", json={"texts": [SENTENCES[i % 4] or "a cat"],
                                                  "beam": 1}).json()

        threads_out = [None] * 16
        workers = [threading.Thread(target=lambda i=i: threads_out.__setitem__(i, ask(i)))
                   for i in range(16)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert all(r and len(r["results"]) == 1 for r in threads_out)
        assert threads_out[0]["results"][0]["source"] == SENTENCES[0]
        batcher = app.state.batcher
        assert batcher.mean_batch > 1.5  # decoder steps ran several clients' sentences together
        assert c.get("/api/info").json()["served"] == {"batches": batcher.batches, "sentences": 16,
                                                        "rows": batcher.rows, "waiting": 0}


def test_a_client_that_disconnects_costs_nothing(ckpt):
    app = create_app(ckpt, LIMITS, device="cpu")
    batcher, gate, decoded = app.state.batcher, threading.Event(), []
    open_batch = batcher.open_batch
    holding = threading.Event()
    # holds the worker until the gate opens
    batcher.run_one = lambda item: holding.set() or gate.wait(10)

    def recording(key):  # a running batch that notes every text joining it
        batch = open_batch(key)
        add = batch.add
        batch.add = lambda items: decoded.extend(text for _, (text, _) in items) or add(items)
        return batch

    batcher.open_batch = recording
    with serving(app) as url:
        held = batcher.submit(None, ["hold"])
        assert holding.wait(30)
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"texts": ["left early"]}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /api/translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            job = wait_until(lambda: batcher.waiting and batcher.waiting[0],
                             what="the job to wait in the queue")
        wait_until(job.future.cancelled, what="the server to see the disconnect and cancel the job")
        gate.set()
        held.result(30)
        r = httpx.post(f"{url}/api/translate", json={"texts": ["still here"]}, timeout=30)
        assert r.status_code == 200
    assert "left early" not in decoded and "still here" in decoded


# ---- the command ----

def test_cli_serve_help_and_errors(tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["serve", "--help"]).output
    assert "--port" in out and "--max-texts" in out and "127.0.0.1" in out
    r = runner.invoke(cli, ["serve", "--checkpoint", str(tmp_path / "none.pt")])
    assert r.exit_code == 1 and "checkpoint not found" in r.output and "Traceback" not in r.output
    assert runner.invoke(cli, ["serve", "--checkpoint", "x.pt", "--port", "0"]).exit_code == 2


def test_cli_serve_on_a_busy_port_is_one_line_without_banner(ckpt):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(cli, ["serve", "--checkpoint", str(ckpt), "--port", str(port)])
    assert r.exit_code == 1 and "serving" not in r.output and "http://" not in r.output
    assert (r.output.strip().count("\n") == 0 and f"127.0.0.1:{port}" in r.output
            and "in use" in r.output)
    assert "--allow-host" in CliRunner().invoke(cli, ["serve", "--help"]).output


@pytest.mark.slow  # CTranslate2 threads contend on a loaded 2-core machine: 3-18 s
def test_an_export_folder_is_served_without_attention_maps(ckpt, tmp_path):
    pytest.importorskip("ctranslate2")
    import attn_mt
    from attn_mt.export.ctranslate2 import export_ct2

    export_ct2(ckpt, tmp_path / "ct2")
    with TestClient(create_app(tmp_path / "ct2", LIMITS, device="cpu"), base_url=LOCAL) as c:
        info = c.get("/api/info").json()
        assert info["model"] == "export" and info["attention"] == []
        r = c.post("/api/translate", json={"texts": SENTENCES[:1], "beam": 2})
        want = attn_mt.load(tmp_path / "ct2", device="cpu").translate(SENTENCES[0], beam=2)
        assert r.status_code == 200 and r.json()["results"][0]["hypotheses"][0]["text"] == want
        r = c.post("/api/attention", json={"text": "a dog"})
        assert r.status_code == 404 and "CTranslate2 export" in r.json()["error"]


def test_answers_are_sent_without_waiting_for_the_clients_ack(ckpt):
    """Each accepted connection has TCP_NODELAY: without it an answer written in two pieces waited
    for the client's delayed ACK, 40 ms a request (asyncio sets it only on sockets made with
    IPPROTO_TCP)."""
    app = create_app(ckpt, LIMITS, device="cpu")
    with serving(app) as url, httpx.Client() as c:
        assert c.get(f"{url}/api/info").status_code == 200  # the connection stays open (keep-alive)
        (conn,) = app.state.server.server_state.connections
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_requests_that_differ_in_alpha_or_nbest_share_the_running_batch(ckpt):
    """Each distinct setting used to open its own running batch, with its own decoder call every
    step; alpha and n-best are now each sentence's own, so six alphas (greedy) and three of beam 3
    open two batches."""
    app = create_app(ckpt, LIMITS, device="cpu")
    batcher, engine, gate, keys = app.state.batcher, app.state.engine, threading.Event(), []
    open_batch = batcher.open_batch
    batcher.open_batch = lambda key: keys.append(key) or open_batch(key)
    batcher.run_one = lambda item: gate.wait(10)  # holds the worker until every job waits
    held = batcher.submit(None, ["hold"])
    settings = [(1, a, 1) for a in (0.0, 0.2, 0.4, 0.6, 0.8,
                                    1.0)] + [(3, 0.0, 1), (3, 1.0, 3), (3, 0.5, 2)]
    text = SENTENCES[0]

    def dcfg(beam: int, alpha: float, nbest: int):  # a request's decode settings
        return engine.decode_config(TranslateRequest(texts=[text], beam=beam, alpha=alpha,
                                                     nbest=nbest))

    jobs = [batcher.submit(*engine.job(dcfg(*s), [text])) for s in settings]
    gate.set()
    held.result(30)
    results = [job.result(30)[0] for job in jobs]
    assert len(keys) == 2 and {k.beam_size for k in keys} == {1, 3}
    for s, result in zip(settings, results, strict=True):  # each as it is decoded alone
        assert result == engine.translate(dcfg(*s), [text])[0], s
    batcher.close()


def test_messages_a_client_can_repeat_are_logged_once_a_minute(caplog):
    """170 aborted streams logged `socket.send() raised exception.` 18 times, and each over-long
    input its own warning; the server now lets each through once a minute, with the count held
    back."""
    import logging

    from attn_mt.serve.server import Aggregate

    now = [0.0]
    logger = logging.getLogger("attn_mt.test_aggregate")
    logger.addFilter(Aggregate(60, clock=lambda: now[0]))
    with caplog.at_level(logging.WARNING, logger="attn_mt.test_aggregate"):
        for i in range(100):
            now[0] = i * 0.5  # 50 s
            logger.warning("socket.send() raised exception.")
            logger.warning("%d input line(s) longer than the model's limit of %d tokens were "
                           "truncated", 1, 64)
        now[0] = 61.0
        logger.warning("socket.send() raised exception.")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["socket.send() raised exception.",
                     "1 input line(s) longer than the model's limit of 64 tokens were truncated",
                     "socket.send() raised exception. (99 more like it in the last 61 s)"]
