"""ASGI middleware in front of the app: the Host allow-list, and the body limit with its read
timeout.

Both answer in JSON like the app (`{"error": "<field>: <why>", "field": "<field>"}`) and close the
connection with every refusal, so an unread rest of the body is never parsed, buffered or waited for
(server.py also closes any connection answered before its body was read whole).

Tested in tests/serve/test_hostile_http.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from .api import ApiError, error_body

LOOPBACK = ("localhost", "127.0.0.1", "::1")


def host_name(header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower-cased: "[::1]:8000" ->
    "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


async def _send_error(send, status: int, field: str, message: str) -> None:
    body = json.dumps(error_body(field, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HostCheck:
    """Answer 400 unless the Host header names an allowed host: a web page on another site that
    rebinds its DNS name to 127.0.0.1 still sends its own name, and so cannot drive the server."""

    def __init__(self, app, allowed: tuple[str, ...] = LOOPBACK) -> None:
        self.app, self.allowed = app, {host_name(h) for h in allowed}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.allowed:
                return await _send_error(send, 400, "host",
                                         f"{host or '(none)'!r} is not served here; add it to the "
                                         "allowed hosts to allow it")
        await self.app(scope, receive, send)


class BodyLimit:
    """Read the whole request body here, counting the bytes as they arrive, chunked or not.

    A body over `max_bytes` is refused (413) as soon as the count passes the limit, whatever its
    Content-Length said; one not complete within `timeout_s` of the headers is refused with 408.
    `check(body)` may refuse it too, raising ApiError. The app then gets the body in one message.
    """

    def __init__(self, app, max_bytes: int, timeout_s: float,
                 check: Callable[[bytes], None] = lambda b: None,
                 ) -> None:
        self.app, self.max_bytes, self.timeout_s, self.check = app, max_bytes, timeout_s, check

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._too_large(send)  # refused unread
        parts, size, deadline = [], 0, time.monotonic() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return await _send_error(send, 408, "body",
                                         f"not received within {self.timeout_s:g} s")
            if message["type"] != "http.request":
                return  # the client left
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_bytes:
                return await self._too_large(send)
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        try:
            self.check(body)
        except ApiError as e:
            return await _send_error(send, e.status, e.field, e.message)
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return messages.pop() if messages else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send) -> None:
        await _send_error(send, 413, "body", f"request body over {self.max_bytes} bytes")
