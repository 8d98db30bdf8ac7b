"""attn-mt serve against hostile HTTP, over raw sockets to a real server on 127.0.0.1: lying
lengths, chunked floods, slow clients, foreign Host headers (with bodies trickled or flooded),
answers never read, clients that leave mid-decode, Ctrl-C with a full queue."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")  # the serve extra

from conftest import ctrl_c_able, serving, wait_until  # noqa: E402

from attn_mt.serve import Limits, create_app  # noqa: E402
from attn_mt.serve.api import TranslateRequest  # noqa: E402
from attn_mt.serve.guards import host_name  # noqa: E402

LIMITS = Limits(max_texts=4, max_chars=200, max_beam=6, header_timeout_s=1.0, body_timeout_s=1.0)


@pytest.fixture(scope="module")
def server(tiny_run):
    """(app, port) of one real server for the module."""
    app = create_app(tiny_run / "checkpoint_best.pt", LIMITS, device="cpu")
    with serving(app, LIMITS.header_timeout_s) as url:
        yield app, int(url.rsplit(":", 1)[1])


def exchange(port: int, raw: bytes, *, wait: float = 5.0) -> bytes:
    """Send `raw` and read the answer (see read_all)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        try:
            s.sendall(raw)
        except OSError:  # the server refused and closed before we were done: fine
            pass
        return read_all(s, wait)


def read_all(s: socket.socket, wait: float, quiet: float | None = 0.3) -> bytes:
    """What the server sends until it closes, `wait` passes, or `quiet` seconds pass quietly after
    its first bytes (None: until it closes; a stream may pause longer than that on a loaded
    machine)."""
    out, end = b"", time.monotonic() + wait
    while time.monotonic() < end:
        s.settimeout(quiet if out and quiet is not None else max(0.01, end - time.monotonic()))
        try:
            data = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not data:
            break
        out += data
    return out


def status(response: bytes) -> int | None:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(m.group(1)) if m else None


def rss_mb() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def post(port: int, body: bytes, host: bytes = b"localhost",
         path: bytes = b"/api/translate") -> bytes:
    return exchange(port, b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                    b"application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                    % (path, host, len(body), body))


# ---- the body limit counts bytes, whatever the headers say ----

def test_a_chunked_body_behind_a_small_content_length_is_refused_early(server):
    app, port = server
    before = rss_mb()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /api/translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk, sent = b"%x\r\n%s\r\n" % (65536, b"x" * 65536), 0
        try:
            while sent < 200 * 65536:  # 13 MB, unless the server closes first
                s.sendall(chunk)
                sent += 65536
        except OSError:
            pass
        response = read_all(s, 5)
    assert status(response) == 413 and b'"field":"body"' in response.replace(b" ", b"")
    assert sent < 200 * 65536  # closed long before the end
    assert rss_mb() - before < 50


# ---- Host allow-list ----

def test_foreign_host_headers_are_refused(server, tiny_run):
    app, port = server
    for host in (b"evil.example", b"evil.example:%d" % port, b"127.0.0.1.nip.io", b""):
        r = post(port, b'{"texts": ["a dog"]}', host=host)
        assert status(r) == 400 and b'"field":"host"' in r.replace(b" ", b""), (host, r)
    for host in (b"localhost", b"127.0.0.1:%d" % port, b"[::1]:%d" % port, b"LOCALHOST:1"):
        assert status(post(port, b'{"texts": ["a dog"]}', host=host)) == 200, host
    assert [host_name(h) for h in ("[::1]:80", "Example.org:8000", "::1", "[::1]")] == [
        "::1", "example.org", "::1", "::1"]
    from fastapi.testclient import TestClient

    wide = create_app(tiny_run / "checkpoint_best.pt", LIMITS, device="cpu",
                      allowed_hosts=("localhost", "mt.lan"))
    with TestClient(wide, base_url="http://mt.lan:8000") as c:
        assert c.post("/api/translate", json={"texts": ["a dog"]}).status_code == 200
        assert c.get("/api/info").json()["allowed_hosts"] == ["localhost", "mt.lan"]
    with TestClient(wide, base_url="http://127.0.0.1") as c:
        assert c.get("/api/info").status_code == 400


# ---- a refusal closes the connection: the rest of the body is never read ----

def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_refused_host_with_a_trickled_body_is_closed_at_once(server):
    app, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /api/translate HTTP/1.1\r\nHost: evil.example\r\nTransfer-Encoding: "
                  b"chunked\r\n\r\n")
        start, answer, closed = time.monotonic(), b"", False
        # a byte a 0.1 s, well past the 1 s read timeout
        while not closed and time.monotonic() - start < 10:
            try:
                s.sendall(b"1\r\nx\r\n")
                s.settimeout(0.1)
                data = s.recv(65536)
                answer, closed = answer + data, not data
            except TimeoutError:
                pass
            except OSError:
                closed = True
    assert status(answer) == 400 and b"connection: close" in answer.lower()
    assert closed and time.monotonic() - start < 6  # not the 10 s of trickling


def test_a_refused_host_with_a_flooded_body_stops_being_read(server):
    app, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /api/translate HTTP/1.1\r\nHost: evil.example\r\nContent-Length: "
                  b"100000000000\r\n\r\n")
        block, sent = b"x" * 65536, 0
        try:
            while sent < 64 << 20:  # 64 MB, unless the server closes first
                s.sendall(block)
                sent += len(block)
        except OSError:
            pass
    assert sent < 32 << 20, sent  # what the kernel's buffers took before the close: a few MB


@pytest.mark.slow
def test_answers_that_are_never_read_are_dropped_after_the_read_timeout(tiny_run):
    limits = Limits(max_work=100_000, header_timeout_s=1.0, body_timeout_s=1.0)
    app = create_app(tiny_run / "checkpoint_best.pt", limits, device="cpu")
    text = " ".join(["the old man sees a small dog and the big cat runs to the house"] * 16)[:1000]
    body = json.dumps({"text": text, "beam": 1}).encode()  # an answer of about 2.5 MB
    request = (b"POST /api/attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
               b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    with serving(app, limits.header_timeout_s) as url:
        connections = app.state.server.server_state.connections
        s = socket.socket()
        # the kernel takes little of what is not read
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            s.sendall(request * 4)  # pipelined, and never read: more than the kernel's buffers hold
            wait_until(lambda: connections, what="the server to take the connection")
            wait_until(lambda: not connections, what="the server to let go of the connection")
        finally:
            s.close()
        # the handler's task ends after the connection is gone: its Answer releases the job then
        wait_until(lambda: not app.state.batcher.pending, what="the held answers to be released")


# ---- slow clients ----

@pytest.mark.slow
def test_slow_headers_and_slow_bodies_are_cut_off(server):
    app, port = server
    start = time.monotonic()
    r = exchange(port, b"POST /api/translate HTTP/1.1\r\nHost: loc", wait=10)
    # closed after header_timeout_s=1 (6x: a loaded machine)
    assert r == b"" and time.monotonic() - start < 6
    # one byte a 0.3 s: still cut off
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        start = time.monotonic()
        try:
            for byte in b"GET /api/info HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"y" * 30:
                s.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            pass
        # not the 15 s the headers would take
        assert read_all(s, 1) == b"" and time.monotonic() - start < 7
    start = time.monotonic()
    r = exchange(port, b"POST /api/translate HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
                 b"100\r\n\r\n{\"te", wait=10)
    assert status(r) == 408 and time.monotonic() - start < 6


# ---- a client that leaves mid-decode stops its decoding ----

@pytest.mark.slow
def test_a_client_leaving_mid_decode_stops_the_decoder(server):
    app, port = server
    engine, steps = app.state.engine, []
    # what runs before each decoder step (a whole-call batcher's check, or nothing)
    check = engine.interrupt

    def slow_step():  # each decoder step: counted, slowed, then the usual check
        steps.append(time.monotonic())
        time.sleep(0.05)
        check()

    engine.interrupt = slow_step
    try:
        text = "yesterday the old man sees a small dog and the big cat runs to the house"
        body = json.dumps({"texts": [text], "beam": 1}).encode()
        r = post(port, body)
        assert status(r) == 200
        full = len(steps)
        assert full >= 8, full
        steps.clear()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /api/translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: len(steps) >= 2, what="the decoding to start")
        left = time.monotonic()
        batcher = app.state.batcher
        wait_until(lambda: not batcher.pending and not getattr(batcher, "_live", None),
                   what="the decoding to stop")
        assert len([t for t in steps if t > left]) <= 3 < full - 2, (len(steps), full)
    finally:
        engine.interrupt = check
    assert status(post(port, b'{"texts": ["a dog"]}')) == 200


# ---- no request makes a 5xx, kills the worker or grows memory ----

METHODS = st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"DELETE", b"PATCH",
                           b"BREW", b"G\x00T"])
PATHS = st.sampled_from([b"/", b"/api/translate", b"/api/attention", b"/api/info", b"/docs",
                         b"/static/app.js", b"/static/../../etc/passwd", b"/%00", b"*",
                         b"/api/translate?x=1"])
JSONISH = st.sampled_from([b'{"texts": ["a dog"]}', b'{"text": "a dog", "beam": 2}',
                           b'{"texts": ["a"', b'{"texts": ["a dog"], "beam": 6, "nbest": 6}', b"[]",
                           b"null", b'{"texts": [1e999]}'])
BODIES = JSONISH | st.binary(max_size=300) | st.builds(lambda n, b: b * n, st.integers(1, 3000),
                                                       st.binary(min_size=1,
                                                                 max_size=40))
HEADER = st.tuples(st.sampled_from([b"X-A", b"Content-Type", b"Expect", b"Connection", b"Accept",
                                    b"Host", b"Transfer-Encoding"]),
                   st.sampled_from([b"application/json", b"100-continue", b"close", b"keep-alive",
                                    b"chunked", b"gzip, chunked", b"\xff\xfe", b"a" * 2000, b""]))


@st.composite
def requests(draw) -> bytes:
    method, path, body = draw(METHODS), draw(PATHS), draw(BODIES)
    head = [b"%s %s HTTP/1.1" % (method, path)]
    host = draw(st.sampled_from([b"localhost", b"127.0.0.1", b"evil.example", b"evil.example",
                                 b"[::1]", None]))
    head += [b"Host: " + host] if host is not None else []
    head += [b"%s: %s" % h for h in draw(st.lists(HEADER, max_size=3))]
    framing = draw(st.sampled_from(["length", "wrong length", "chunked", "length+chunked", "none",
                                    "bad length", "huge length", "endless chunked"]))
    if framing in ("chunked", "length+chunked", "endless chunked"):
        cut = draw(st.integers(1, 64))
        pieces = [body[i : i + cut] for i in range(0, len(body), cut)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        # endless: more chunks may follow
        body += b"" if framing == "endless chunked" else b"0\r\n\r\n"
        head.append(b"Transfer-Encoding: chunked")
    if framing == "huge length":
        head.append(b"Content-Length: 100000000000")
    if framing in ("length", "length+chunked"):
        head.append(b"Content-Length: %d" % (len(body) if framing == "length" else 5))
    elif framing == "wrong length":
        head.append(b"Content-Length: %d" % draw(st.integers(0, 10**12)))
    elif framing == "bad length":
        head.append(b"Content-Length: "
                    + draw(st.sampled_from([b"-1", b"1e3", b" 7", b"0x10", b"5, 6"])))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


@pytest.fixture(scope="module")
def cli_server(tiny_run):
    """(process, port) of `attn-mt serve` in its own process (its memory is its own), 1 s read
    timeouts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "attn_mt", "serve", "--checkpoint",
                             str(tiny_run / "checkpoint_best.pt"), "--port", str(port), "--device",
                             "cpu", "--max-texts", "4", "--max-chars", "200", "--read-timeout",
                             "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=ctrl_c_able)
    def ready() -> bool:
        try:
            return status(exchange(port, b"GET /api/info HTTP/1.1\r\nHost: localhost\r\n\r\n",
                                   wait=1)) == 200
        except OSError:
            assert proc.poll() is None, proc.stdout.read().decode()
            return False

    try:
        wait_until(ready, timeout=60, interval=0.1, what="`attn-mt serve` to answer")
        yield proc, port
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


def proc_rss_mb(proc) -> float:
    return (int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{proc.pid}/status").read_text()).group(1))
            / 1024)


def deliver(port: int, raw: bytes, pace: str, pid: int) -> int | None:
    """Send `raw` at `pace`; the status of the answer (None: closed without one). "trickled": then a
    byte a 0.1 s, "flooded": then 64 KB blocks, "unread": and never read the answer; in each case
    the server must let go of the connection within 10 s (read timeout 1 s), not read or hold it for
    ever."""
    if pace == "at once":
        return status(exchange(port, raw, wait=3))
    fds, start, answer = open_fds(pid), time.monotonic(), b""
    chunked = b"transfer-encoding: chunked" in raw.lower()  # what is sent after it: more chunks
    byte, block = ((b"1\r\nx\r\n", b"10000\r\n" + b"x" * 65536 + b"\r\n") if chunked
                   else (b"x", b"x" * 65536))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.settimeout(0.1)
        try:
            s.sendall(raw)
            if pace == "flooded":
                for _ in range(512):  # 32 MB, unless the server closes first
                    s.sendall(block)
                raise AssertionError("the server read a 32 MB flood after the request")
            if pace == "unread":
                wait_until(lambda: open_fds(pid) <= fds, timeout=10, interval=0.1,
                           what="the server to let go of an unread connection")
                return status(answer)  # closed: nothing more to wait for
            while time.monotonic() - start < 10:
                s.sendall(byte)
                try:
                    data = s.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return status(answer)
                answer += data
            raise AssertionError(f"the server held a {pace} connection for 10 s")
        except OSError:  # reset, or the flood refused
            return status(answer)


@pytest.mark.slow
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=requests(), pace=st.sampled_from(["at once", "at once", "trickled", "flooded",
                                             "unread"]))
@example(raw=b"POST /api/translate HTTP/1.1\r\nHost: evil.example\r\nTransfer-Encoding: "
         # the issue's: a refused Host, its body a byte at a time
         b"chunked\r\n\r\n", pace="trickled")
@example(raw=b"POST /api/translate HTTP/1.1\r\nHost: evil.example\r\nContent-Length: "
         b"100000000000\r\n\r\n", pace="flooded")
def test_hostile_requests_never_make_a_server_error(cli_server, raw, pace):
    proc, port = cli_server
    before = proc_rss_mb(proc)
    code = deliver(port, raw, pace, proc.pid)
    assert code is None or code < 500, (code, raw[:300])  # None: closed without an answer
    # the worker lives, the server goes on
    assert status(post(port, b'{"texts": ["a dog"]}')) == 200
    assert proc.poll() is None and proc_rss_mb(proc) - before < 30


# ---- Ctrl-C with a full queue ----

def test_ctrl_c_ends_the_server_within_seconds_with_a_full_queue(tiny_run):
    limits = Limits(max_queue=40)
    app = create_app(tiny_run / "checkpoint_best.pt", limits, device="cpu")
    batcher, engine = app.state.batcher, app.state.engine
    decoding = threading.Event()
    # a slow model: each job takes seconds
    engine.interrupt = lambda: decoding.set() or time.sleep(0.05)
    with serving(app) as url:
        server = app.state.server
        texts = ["the old man sees a small dog and the big cat"] * 2
        dcfg = engine.decode_config(TranslateRequest(texts=texts, beam=1))
        futures = [batcher.submit(*engine.job(dcfg, texts)) for _ in range(39)]
        assert decoding.wait(30)  # the worker is decoding the first job
        start = time.monotonic()
        server.handle_exit(signal.SIGINT, None)  # what Ctrl-C does
        server_thread = app.state.thread
        server_thread.join(30)
        took = time.monotonic() - start
        assert not server_thread.is_alive() and took < 10, took  # not the 39 jobs' minutes
        # every job fails: those decoding stop at their next step (a second's decoding from its
        # end), the rest are answered 503, never decoded
        assert [f for f in futures if f.exception(1) is None] == []
        assert "shutting down" in str(futures[-1].exception(1))
        assert url.startswith("http://127.0.0.1:")


# ---- streams: clients that leave mid-stream, never read, or mix settings ----

STREAM_TEXTS = ["a dog", "the old man sees a small dog and the big cat", "",
                "yesterday the cat runs to the house"]


@st.composite
def streamed(draw) -> tuple[dict, str]:
    """A translate request (streamed or not, any beam, alpha and n-best the limits allow) and what
    its client does: reads it all, leaves after a few events, or never reads and goes."""
    beam = draw(st.integers(1, 4))
    body = {"texts": draw(st.lists(st.sampled_from(STREAM_TEXTS), min_size=1, max_size=4)),
            "beam": beam, "alpha": draw(st.sampled_from([0.0, 0.3, 0.6, 1.0, 1.7])),
            "nbest": draw(st.integers(1, beam)), "stream": draw(st.booleans())}
    return body, draw(st.sampled_from(["read", "read", "leave 0", "leave 1", "leave 3",
                                       "never read"]))


def stream_client(port: int, body: dict, how: str) -> bytes:
    """What the client read before it closed the connection."""
    raw = json.dumps(body).encode()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /api/translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                  b"application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(raw), raw))
        if how == "never read":
            time.sleep(0.2)
            return b""
        if how.startswith("leave"):
            out, want = b"", int(how.split()[1])
            s.settimeout(10)
            while out.count(b"\n\n") <= want and (data := s.recv(256)):
                out += data
            return out
        return read_all(s, 60, quiet=None)  # Connection: close: the server closes at the end


def same_answer(a: dict, b: dict) -> bool:
    """The same texts, and scores equal but for float rounding (a batch of other rows sums in
    another order)."""
    flat = [[(h["text"], h["score"], h["log_prob"]) for h in r["hypotheses"]] for r in (a, b)
            for r in r["results"]]
    half = len(flat) // 2
    return ([[t for t, *_ in r] for r in flat[:half]] == [[t for t, *_ in r] for r in flat[half:]]
            and all(
        x == pytest.approx(y, abs=1e-3) for r, q in zip(flat[:half], flat[half:], strict=True)
        for (_, *x), (_, *y) in zip(r, q, strict=True)))


@pytest.mark.slow
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(clients=st.lists(streamed(), min_size=1, max_size=5))
def test_streams_left_unread_or_mixed_never_hold_the_queue(cli_server, clients):
    """Concurrent clients, streamed or not, with mixed settings: whoever reads to the end gets the
    answer a plain request of those settings gets, never a 5xx; whoever leaves or never reads frees
    its place (the queue is empty again within seconds) and the server's memory stays flat."""
    import concurrent.futures

    proc, port = cli_server
    before = proc_rss_mb(proc)
    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        got = list(pool.map(lambda c: stream_client(port, *c), clients))
    for (body, how), answer in zip(clients, got, strict=True):
        if how != "read":
            continue
        assert status(answer) == 200, answer[:300]
        plain = json.loads(
            post(port, json.dumps({**body, "stream": False}).encode()).split(b"\r\n\r\n", 1)[1])
        payload = answer.split(b"\r\n\r\n", 1)[1]
        if body["stream"]:
            payload = re.sub(rb"\r\n[0-9a-f]+\r\n", b"", b"\r\n" + payload)  # chunked framing
            events = re.findall(rb"event: (\w+)\ndata: (.*)\n", payload)
            assert events[-1][0] == b"done", payload[-300:]
            assert same_answer(json.loads(events[-1][1]), plain)
        else:
            assert same_answer(json.loads(payload), plain)
    def waiting() -> int:
        return json.loads(exchange(port, b"GET /api/info HTTP/1.1\r\nHost: "
                                   b"localhost\r\nConnection: close\r\n\r\n"
                                   ).split(b"\r\n\r\n", 1)[1])["served"]["waiting"]

    wait_until(lambda: waiting() == 0, interval=0.1, what="the queue to empty")
    assert status(post(port, b'{"texts": ["a dog"]}')) == 200 and proc_rss_mb(proc) - before < 30


@pytest.mark.slow
def test_ctrl_c_of_the_command_ends_it_at_once(cli_server):
    # the module's last test: it ends the server the others share
    proc, port = cli_server
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    assert proc.wait(30) == 130 and time.monotonic() - start < 10  # not the 30 s wait
    assert "serve: http://127.0.0.1" in proc.stdout.read().decode()
