"""How the web app answers a request that the model worker computes: a JSON `Answer` that holds its
place in the queue until sent, a stream of server-sent events (`stream_answer`), the wait for the
worker's result that notices a client who leaves (`answer`, `ClientGone`), and what a failure says
(`failure`).

Tested in tests/serve/test_serve.py, test_streaming.py and test_hostile_http.py.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from contextlib import contextmanager

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic_core import to_json

from .api import error_body
from .batcher import Batcher, QueueFull, Stopping
from .engine import Detokenizer, Engine
from .scheduler import Scheduler

log = logging.getLogger("attn_mt.serve.app")  # the app's log: its failures are reported there


class Answer(Response):
    """A JSON answer (bytes) that keeps its request's place in the queue until the client has taken
    it: `release` runs once all but the socket buffer's last 64 KB are sent, or the client is gone
    (server.py disconnects one that takes none of it within the read timeout). So answers waiting to
    be sent count against max_queue."""

    media_type = "application/json"

    def __init__(self, body: bytes, release) -> None:
        super().__init__(body)
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body, "more_body": True})
            # waits while the client has not read it
            await send({"type": "http.response.body", "body": b""})
        finally:
            self.release()


def stream_answer(batcher: Batcher | Scheduler, engine: Engine, dcfg, texts: list[str],
                  costs: list[int], align: bool = False) -> StreamingResponse:
    """A translation answered as server-sent events while it is decoded (`"stream": true`): what the
    worker reports (engine.progress: `token`, `hypothesis`, `result`, each with the sentence's
    `index`), then `done` with the answer a plain request gets (with `align`, its word links, a job
    of the worker's once the translation is done), or `error`. The job holds its place
    in the queue until the stream ends; a client that leaves cancels it (its rows leave the running
    batch at the next step)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    detok: dict[int, Detokenizer] = {}

    # in the worker thread, in order: handed over as it is
    def watch(i: int, kind: str, value) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (i, kind, value))

    future = batcher.submit(*engine.job(dcfg, texts), costs, hold=True, watch=watch)
    future.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, None))

    async def lines():
        try:
            # decoded to text here, not in the worker
            while (item := await events.get()) is not None:
                i, kind, value = item
                name, payload = engine.progress(kind, value,
                                                detok.setdefault(i, Detokenizer(engine.tok)))
                yield _event(name, {"index": i, **payload})
            if future.cancelled():
                return
            error, results = future.exception(), None
            if error is None:
                try:
                    results = future.result()
                    if align:
                        linking = batcher.submit(None, [("align", results)])
                        results = await asyncio.wrap_future(linking)
                except Exception as e:  # noqa: BLE001 (answered as an error event)
                    error = e
            if error is not None and not isinstance(error, QueueFull | Stopping):
                log.error("POST /api/translate (streamed) failed: %r", error)
            yield _event("error", failure(error)) if error else _event("done", {"results": results})
        finally:
            future.cancel()  # the client left: the job leaves the queue or the running batch
            batcher.release(future)

    return Stream(lines(), future.cancel, media_type="text/event-stream",
                  headers={"Cache-Control": "no-store"})


class Stream(StreamingResponse):
    """A streamed answer that watches for the client's disconnect itself while it streams, whatever
    ASGI spec the server announces: Starlette stops listening under spec 2.4, and uvicorn 0.29-0.32
    announce it but do not raise when a send finds the client gone, so the job would decode on to
    its end. `gone` (the job's cancel) runs at the disconnect; the events then end."""

    def __init__(self, content, gone, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.gone = gone

    async def __call__(self, scope, receive, send) -> None:
        async def watch() -> None:
            # the body has been read: next comes the disconnect
            await self.listen_for_disconnect(receive)
            self.gone()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except OSError:  # spec 2.4: a send to a client that left
            self.gone()
        finally:
            watcher.cancel()


def _event(name: str, data: dict) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), to_json(data))


@contextmanager
def releasing(batcher: Batcher, future: Future):
    """Free a held job's place if no Answer takes it over (the request failed or was cancelled)."""
    try:
        yield
    except BaseException:
        batcher.release(future)
        raise


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def answer(request: Request, future: Future):
    """The worker's result, or ClientGone, after cancelling the job, if the client leaves first."""
    result = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when the server stops and cancels this request
        gone.cancel()
        if not result.done():
            # the job: dropped if queued; a call whose clients all left stops at its next step
            result.cancel()
    if result.cancelled():
        raise ClientGone
    return result.result()


async def _disconnect(request: Request) -> None:
    # the body has been read, so the next ASGI message is the disconnect (or the end of the
    # response)
    while (await request.receive())["type"] != "http.disconnect":
        pass


def failure(e: BaseException) -> dict:
    """The answer to a request that failed: the queue's reason (full, stopping), else only the kind
    of error, the same in a stream as in a plain answer (the details, paths included, go to the
    log)."""
    if isinstance(e, QueueFull | Stopping):
        return error_body("queue", str(e))
    return {"error": f"internal error: {type(e).__name__}", "field": None}
