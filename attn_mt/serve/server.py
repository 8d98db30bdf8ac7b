"""Running the app under uvicorn: our own listening socket, header and answer timeouts, and a quick
Ctrl-C.

- `listen(host, port)` binds before anything is printed, so a busy port is one error line.
- `Timeouts` sends without delay (TCP_NODELAY), and closes a connection whose request headers are
  not complete within the limit (uvicorn times out only idle keep-alive connections, and every byte
  received restarts that clock), one whose client takes no part of its answer within the limit, and
  one answered before its body was read whole (uvicorn would go on reading and discarding that body
  for as long as the client sends it).
- `make_server` stops the model worker at the first SIGINT/SIGTERM: the running call ends at its
  next decoder step and queued requests are answered 503, so the server exits within a few seconds.

Tested in tests/serve/test_hostile_http.py (timeouts, Ctrl-C) and tests/serve/test_serve.py.
"""

from __future__ import annotations

import errno
import logging
import socket
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

GRACE_S = 3.0  # after Ctrl-C, how long open requests may take before uvicorn cancels them


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (SO_REUSEADDR, as uvicorn's); OSError naming the address if
    taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = ("in use (another server? pick another port)" if e.errno == errno.EADDRINUSE
               else e.strerror)
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {why}") from None
    return sock


class Timeouts(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing connections that take over `timeout_s` to send their
    headers or to take the next part of their answer, and those answered before their request body
    was read whole."""

    timeout_s = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP; without it, an
            # answer written in two pieces (headers, body) waits for the client's delayed ACK: 40 ms
            # a request
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timer = self._send_timer = None
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE and self._timer is not None:  # the headers are in
            self._timer.cancel()
            self._timer = None

    def on_response_complete(self) -> None:
        # a refusal before the body was read: never drain the rest
        if self.conn.their_state is h11.SEND_BODY:
            self.transport.close()
        super().on_response_complete()
        # next headers: the same time
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()

    # the answer waits in our buffer: the client must take some within timeout_s
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            # frees the buffer
            self._send_timer = self.loop.call_later(self.timeout_s, self.transport.abort)

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def connection_lost(self, exc) -> None:
        for timer in (getattr(self, "_timer", None), getattr(self, "_send_timer", None)):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(self.timeout_s, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_exit) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self.on_exit()  # only sets a flag: safe in a signal handler
        super().handle_exit(sig, frame)


class Aggregate(logging.Filter):
    """Lets each message (its template) through at most once per `every_s` seconds, and says how
    many like it were held back meanwhile: clients cannot flood the log (aborted streams'
    `socket.send() raised exception.`, over-long inputs' truncation warning)."""

    def __init__(self, every_s: float = 60.0, clock=time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        # template -> (when last let through, held back since)
        self.seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now, key = self.clock(), str(record.msg)
        last, held = self.seen.get(key, (-float("inf"), 0))
        if now - last < self.every_s:
            self.seen[key] = (last, held + 1)
            return False
        self.seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {now - last:.0f} s)"
        return True


# the loggers whose messages a client can repeat at will
QUIET = ("asyncio", "attn_mt.decoding.translate")


def make_server(app, header_timeout_s: float = 10.0) -> uvicorn.Server:
    """A uvicorn server for `app` (from create_app); serve it with `.run(sockets=[listen(...)])`.
    Messages a client can make the server repeat are logged once a minute (`Aggregate`)."""
    for name in QUIET:
        logger = logging.getLogger(name)
        if not any(isinstance(f, Aggregate) for f in logger.filters):
            logger.addFilter(Aggregate())
    protocol = type("Timeouts", (Timeouts,), {"timeout_s": header_timeout_s})
    config = uvicorn.Config(app, http=protocol, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=GRACE_S, timeout_keep_alive=5)
    return _Server(config, app.state.batcher.stop)
