"""`attn-mt serve`: a local web page and JSON API for translating with a checkpoint and seeing its attention.

    api.py      request/response models, limits, errors that name the field
    batcher.py  dynamic batching: one model worker thread, requests of many clients in one batch
    engine.py   the model: translate, attention maps, checkpoint facts
    app.py      the FastAPI app: page, /api/translate, /api/attention, /api/info
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import uvicorn
except ImportError as e:  # the serve extra is optional
    raise ImportError(f"attn-mt serve needs FastAPI and uvicorn ({e}): pip install 'attn-mt[serve]'") from None

from .api import Limits
from .app import create_app

__all__ = ["Limits", "create_app", "run"]


def run(app, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve `app` until Ctrl-C; one process, so one copy of the model."""
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
