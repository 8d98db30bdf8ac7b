"""`attn-mt serve`: a local web page and JSON API for translating with a checkpoint and seeing its
attention.

    api.py      request/response models, errors that name the field (limits: attn_mt/api/limits.py)
    guards.py   ASGI middleware: Host allow-list, body limit and body read timeout
    batcher.py  the bounded job queue and one model worker thread; whole model calls (exports, RNN
                checkpoints)
    scheduler.py  continuous batching (Transformer checkpoints): requests join and leave at every
                  decoder step
    engine.py   the loaded model (`attn_mt.Model`): translate, attention maps, explain, facts
    app.py      the FastAPI app: page, /api/translate (JSON or streamed events), /api/attention,
                /api/explain, /api/info
    server.py   uvicorn: our own socket, header and answer timeouts, no body read after a refusal, a
                quick Ctrl-C

May import config, checkpoint, device, data, models, decoding, api (a loaded model, `api.Model`) and
analysis; never training, measure or export.
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as e:  # the serve extra is optional
    raise ImportError(f"attn-mt serve needs FastAPI and uvicorn ({e}): pip install "
                      "'attn-mt[serve]'") from None

from .api import Limits
from .app import create_app
from .guards import LOOPBACK
from .server import listen, make_server

__all__ = ["LOOPBACK", "Limits", "allowed_hosts", "create_app", "listen", "run", "serve"]


def allowed_hosts(host: str, extra: list[str] | None = None) -> tuple[str, ...]:
    """The Host header names answered: the loopback names, the bound interface unless it is a
    wildcard (0.0.0.0, ::), and `extra`."""
    return (*LOOPBACK, *([host] if host not in ("0.0.0.0", "::") else []), *(extra or []))


def run(app, sock, limits: Limits = Limits()) -> None:
    """Serve `app` (from create_app) on the bound socket `sock` until Ctrl-C; one process, one copy
    of the model."""
    make_server(app, limits.header_timeout_s).run(sockets=[sock])


def serve(path, host: str = "127.0.0.1", port: int = 8000, *, device: str = "auto",
          limits: Limits = Limits(), allow_host: list[str] | None = None,
          ready=lambda url: None) -> None:
    """Load the model at `path` and serve it on host:port until Ctrl-C: the port is bound first (a
    busy one is one error, before the model loads), then `ready(url)` is called and requests are
    answered."""
    from attn_mt.api.model import load

    sock = listen(host, port)
    app = create_app(load(path, device=device), limits,
                     allowed_hosts=allowed_hosts(host, allow_host))
    ready(f"http://{host}:{port}/")
    run(app, sock, limits)
