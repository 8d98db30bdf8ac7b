"""The web app: the page, the JSON API, error answers that name the field, and the body-size guard."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from .api import ApiError, AttentionRequest, AttentionResponse, Limits, TranslateRequest, TranslateResponse, error_body
from .batcher import Batcher
from .engine import Engine

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
# the page loads nothing from elsewhere; this keeps it so (and keeps injected markup inert)
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; object-src 'none'"
DESCRIPTION = """Translate with an attn-mt checkpoint and look at its attention.
Requests from concurrent clients are decoded together in batches by one model worker.
Errors are `{"error": "<field>: <why>", "field": "<field>"}` with a 4xx status."""


def create_app(checkpoint: Path, limits: Limits = Limits(), device: str = "auto") -> FastAPI:
    """The FastAPI app serving `checkpoint`: `/` (page), `/api/translate`, `/api/attention`, `/api/info`."""
    engine = Engine(checkpoint, device)
    batcher = Batcher(engine.translate, engine.attention, max_batch=engine.cfg.decode.batch_size,
                      max_wait_s=limits.max_wait_ms / 1000)
    facts = {**engine.info(), "limits": asdict(limits)}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        batcher.close()  # finishes the queued jobs, then the worker thread ends

    # docs_url=None: FastAPI's Swagger page loads its scripts from a CDN; ours renders /openapi.json offline
    app = FastAPI(title="attn-mt", description=DESCRIPTION, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    _error_handlers(app)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(STATIC / "docs.html", headers={"Content-Security-Policy": CSP})

    @app.post("/api/translate", response_model=TranslateResponse, responses=_ERRORS)
    async def translate(body: TranslateRequest, request: Request):
        """Translate sentences; n-best lists with scores, in input order (`attn-mt translate --format jsonl`)."""
        body.check(limits)
        dcfg = engine.decode_config(body.beam, body.alpha, body.nbest)
        return {"results": await _answer(request, batcher.submit(dcfg, body.texts))}

    @app.post("/api/attention", response_model=AttentionResponse, responses=_ERRORS)
    async def attention(body: AttentionRequest, request: Request):
        """Translate one sentence; every attention map of every layer and head, as [layer][head][query][key]."""
        body.check(limits)
        return await _answer(request, batcher.submit(None, [(body.text, engine.decode_config(body.beam))]))

    @app.get("/api/info")
    def info() -> dict:
        """Architecture, parameters, vocabulary, training step, validation BLEU, decoding defaults, limits;
        `served`: model calls so far and the sentences they decoded (their ratio is the mean batch)."""
        return {**facts, "served": {"batches": batcher.batches, "sentences": batcher.items}}

    return app


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _answer(request: Request, future: Future):
    """The worker's result, or ClientGone, after cancelling the job, if the client leaves first."""
    result = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not result.done():
        result.cancel()  # cancels the queued job too; one already in a batch just finishes
        raise ClientGone
    return result.result()


async def _disconnect(request: Request) -> None:
    # the body has been read, so the next ASGI message is the disconnect (or the end of the response)
    while (await request.receive())["type"] != "http.disconnect":
        pass


_ERRORS = {code: {"description": why, "content": {"application/json": {"example": error_body(field, msg)}}}
           for code, why, field, msg in [
               (400, "Malformed JSON", "body", "JSON decode error"),
               (413, "Too many sentences or characters", "texts", "80 sentences; at most 64 per request"),
               (422, "A field of the wrong type or out of range", "beam", "Input should be greater than 0")]}


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        if first["type"] == "json_invalid":  # loc: ("body", character offset)
            at = first["loc"][-1]
            return JSONResponse(error_body("body", f"malformed JSON at character {at}: {first['ctx']['error']}"),
                                status_code=400)
        errors = [(".".join(str(x) for x in err["loc"][1:]) or "body", err["msg"]) for err in e.errors()]
        return JSONResponse({**error_body(*errors[0]), "errors": [error_body(*err) for err in errors]},
                            status_code=400 if errors[0][0] == "body" else 422)

    @app.exception_handler(ApiError)
    async def refused(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(error_body(e.field, e.message), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(e.detail), "field": None}, status_code=e.status_code, headers=e.headers)

    @app.exception_handler(ClientGone)
    async def gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:
        log.error("%s %s failed: %r", request.method, request.url.path, e)
        return JSONResponse({"error": f"internal error: {type(e).__name__}", "field": None}, status_code=500)


class BodyLimit:
    """ASGI middleware: refuse request bodies over `max_bytes` (413) before the app reads them."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                return await self._refuse(send)
            return await self.app(scope, receive, send)
        body = b""  # chunked: read it here, up to the limit, and hand it on in one piece
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return await self._refuse(send)
            if not message.get("more_body"):
                break
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return messages.pop() if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        body = json.dumps(error_body("body", f"request body over {self.max_bytes} bytes")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
