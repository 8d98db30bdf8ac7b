"""The web app: the page, the JSON API, and error answers that name the field.

One job: HTTP (routes, error answers); how a worker's result is answered (held, streamed) is
responses.py's, model work engine.py's, queuing batcher.py's and scheduler.py's.

Tested in tests/serve/test_serve.py, test_streaming.py, test_explain_api.py and test_hostile_http.py
(and /history in tests/analysis/test_history_view.py).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic_core import to_json
from starlette.exceptions import HTTPException

from attn_mt.analysis.views import STATIC as VIEWS_STATIC
from attn_mt.api.history_pages import history_file
from attn_mt.api.model import Model, load

from .api import (
    ApiError,
    AttentionRequest,
    AttentionResponse,
    ExplainRequest,
    ExplainResponse,
    Limits,
    TranslateRequest,
    TranslateResponse,
    check_json,
    check_work,
    error_body,
)
from .batcher import Batcher, QueueFull, Stopping
from .engine import Engine
from .guards import LOOPBACK, BodyLimit, HostCheck
from .responses import Answer, ClientGone, answer, failure, releasing, stream_answer
from .scheduler import Scheduler

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
# the page loads nothing from elsewhere; this keeps it so (and keeps injected markup inert)
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "object-src 'none'")
DESCRIPTION = """Translate with an attn-mt checkpoint and look at its attention.
Requests from concurrent clients are decoded together in batches by one model worker.
Errors are `{"error": "<field>: <why>", "field": "<field>"}` with a 4xx status."""


def create_app(model: Model | str | os.PathLike, limits: Limits = Limits(), device: str = "auto",
               allowed_hosts: tuple[str, ...] = LOOPBACK) -> FastAPI:
    """The FastAPI app serving `model` (a loaded `attn_mt.Model`, or the path of a checkpoint file
    or export folder to load on `device`): `/` (page), `/api/translate`, `/api/attention`,
    `/api/explain`, `/api/info`; requests whose Host is not in `allowed_hosts` get 400."""
    engine = Engine(model if isinstance(model, Model) else load(model, device=device))
    batcher = _batcher(engine, limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        batcher.close()  # the running call stops at its next step, queued requests get 503

    # docs_url=None: FastAPI's Swagger page loads its scripts from a CDN; ours renders /openapi.json
    # offline
    app = FastAPI(title="attn-mt", description=DESCRIPTION, lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    app.state.batcher, app.state.engine = batcher, engine
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s,
                       check=check_json)
    app.add_middleware(HostCheck, allowed=allowed_hosts)  # the outermost: checked first
    _error_handlers(app)
    _pages(app)
    _history_page(app, engine, batcher)
    _translation_routes(app, engine, batcher, limits)
    facts = {**engine.info(), "limits": asdict(limits), "allowed_hosts": list(allowed_hosts)}

    @app.get("/api/info")
    def info() -> dict:
        """What was loaded (`model`: checkpoint or export), architecture, parameters, vocabulary,
        training step, validation BLEU, decoding defaults, limits, allowed hosts, `history`: whether
        /history has the attention history of the checkpoint's run; `served`: model calls so far
        (decoder steps, for a checkpoint: requests join and leave between them), the sentences they
        decoded, `rows`: the sentences in each call, summed (rows / batches is the mean batch), and
        the requests waiting now."""
        return {**facts, "served": {"batches": batcher.batches, "sentences": batcher.items,
                                    "rows": batcher.rows, "waiting": len(batcher.pending)},
                "history": history_file(engine.translator) is not None}

    return app


def _batcher(engine: Engine, limits: Limits) -> Batcher | Scheduler:
    """The model worker's queue: a running batch that sentences join and leave at every decoder step
    (a Transformer checkpoint), else whole model calls, abandoned at the next step when their
    clients all left."""
    if engine.continuous:
        return Scheduler(engine.open_batch, engine.run_one, max_batch=engine.decode.batch_size,
                         max_batch_work=limits.max_batch_work, max_queue=limits.max_queue)
    batcher = Batcher(engine.translate, engine.run_one, max_batch=engine.decode.batch_size,
                      max_batch_work=limits.max_batch_work, max_wait_s=limits.max_wait_ms / 1000,
                      max_queue=limits.max_queue)
    engine.interrupt = batcher.check
    return batcher


def _pages(app: FastAPI) -> None:
    """The page, the offline API docs page, and their static files."""
    # drawSteps: shared, first
    app.mount("/static/analysis", StaticFiles(directory=VIEWS_STATIC), name="views")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(STATIC / "docs.html", headers={"Content-Security-Policy": CSP})


def _history_page(app: FastAPI, engine: Engine, batcher: Batcher | Scheduler) -> None:
    """/history: how the heads of the checkpoint's run learned (analysis/history_view.py's page of
    the run's attention_history.npz, drawn once per version of the file: a run still training shows
    its latest evaluation); 404 where the run recorded none. Drawn by the model worker, a job in the
    queue like a translation's (max_queue: 503 beyond it), never in many threads at once. The page
    is self-contained: its CSP allows its own inline scripts and styles, by hash."""
    @app.get("/history", include_in_schema=False)
    async def history(request: Request) -> Response:
        path = history_file(engine.translator)
        if path is None:
            raise HTTPException(404, "no attention history: the checkpoint's run recorded none")
        page = await answer(request, batcher.submit(None, [("history", path)]))
        if page is None:  # cut short or damaged (Engine.history logged why)
            raise HTTPException(500, "the run's attention history cannot be read")
        return Response(page, media_type="text/html; charset=utf-8",
                        headers={"Content-Security-Policy": inline_csp(page)})


def inline_csp(page: str) -> str:
    """A self-contained page's CSP: its inline scripts and styles by their SHA-256, data: images,
    nothing else."""
    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(t.encode()).digest()).decode()}'"
                        for t in found)
    return (f"default-src 'none'; img-src data:; style-src {hashes('style')}; script-src "
            f"{hashes('script')}")


def _translation_routes(app: FastAPI, engine: Engine, batcher: Batcher | Scheduler,
                        limits: Limits) -> None:
    """/api/translate, /api/attention and /api/explain: checked against the limits, then queued for
    the worker."""
    @app.post("/api/translate", response_model=TranslateResponse, responses=_ERRORS)
    async def translate(body: TranslateRequest, request: Request):
        """Translate sentences; n-best lists with scores, in input order (translate's jsonl
        lines)."""
        body.check(limits)
        dcfg = engine.decode_config(body)
        costs = engine.work(body.texts, dcfg.beam_size)
        check_work("texts", costs, limits)
        if body.align:
            engine.require_weights("word alignment")
        if body.stream:
            return stream_answer(batcher, engine, dcfg, body.texts, costs, body.align)
        future = batcher.submit(*engine.job(dcfg, body.texts), costs, hold=True)
        with releasing(batcher, future):
            results = await answer(request, future)
            if body.align:  # the links, computed by the worker like every model call
                results = await answer(request, batcher.submit(None, [("align", results)]))
            return Answer(to_json({"results": results}), lambda: batcher.release(future))

    @app.post("/api/attention", response_model=AttentionResponse, responses=_ERRORS)
    async def attention(body: AttentionRequest, request: Request):
        """Translate one sentence; every attention map of every layer and head, as
        [layer][head][query][key]."""
        body.check(limits)
        engine.require_weights("attention maps")
        dcfg = engine.decode_config(body)
        check_work("text", engine.work([body.text], dcfg.beam_size), limits)
        future = batcher.submit(None, [("attention", (body.text, dcfg))], hold=True)
        # encoded by the model worker: a big answer does not stall the loop
        with releasing(batcher, future):
            return Answer(await answer(request, future), lambda: batcher.release(future))

    @app.post("/api/explain", response_model=ExplainResponse, responses=_ERRORS)
    async def explain(body: ExplainRequest, request: Request):
        """Translate one sentence; one head's attention for one query token, step by step,
        recomputed from the model's weights (explain's JSON)."""
        body.check(limits)
        engine.check_explain(body)
        dcfg = engine.decode_config(body)
        check_work("text", engine.work([body.text], dcfg.beam_size), limits)
        result = await answer(request, batcher.submit(None, [("explain", (body, dcfg))]))
        if isinstance(result, ApiError):  # a token the sentence or its translation does not have
            raise result
        return result


_ERRORS = {code: {"description": why,
                  "content": {"application/json": {"example": error_body(field, msg)}}}
           for code, why, field, msg in [
               (400, "Malformed JSON", "body", "JSON decode error"),
               (413, "Too many sentences, characters or units of work", "texts",
                "80 sentences; at most 64 per request"),
               (422, "A field of the wrong type or out of range", "beam",
                "Input should be greater than 0"),
               (503, "The queue is full (retry after Retry-After seconds), or the server is "
                "stopping", "queue", "64 requests are waiting; at most 64")]}


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        if first["type"] == "json_invalid":  # loc: ("body", character offset)
            at = first["loc"][-1]
            return JSONResponse(error_body("body", f"malformed JSON at character {at}: "
                                           f"{first['ctx']['error']}"),
                                status_code=400)
        errors = [(".".join(str(x) for x in err["loc"][1:]) or "body", err["msg"])
                  for err in e.errors()]
        return JSONResponse({**error_body(*errors[0]),
                             "errors": [error_body(*err) for err in errors]},
                            status_code=400 if errors[0][0] == "body" else 422)

    @app.exception_handler(ApiError)
    async def refused(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(error_body(e.field, e.message), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        field = "body" if e.status_code == 400 else None  # a body the parser refused
        return JSONResponse({"error": f"{field}: {e.detail}" if field else str(e.detail),
                             "field": field},
                            status_code=e.status_code, headers=e.headers)

    @app.exception_handler(QueueFull)
    @app.exception_handler(Stopping)
    async def busy(request: Request, e: Exception) -> JSONResponse:
        return JSONResponse(error_body("queue", str(e)), status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(ClientGone)
    async def gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:
        log.error("%s %s failed: %r", request.method, request.url.path, e)
        return JSONResponse(failure(e), status_code=500)
