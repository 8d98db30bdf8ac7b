"""What `attn-mt serve` answers: the limits of one request and of the server's queue.

One job: the served limits, with their defaults. Here, not in attn_mt/serve, so that the CLI reads
the defaults (its `serve` options) without the web extra that the server needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_mt.data import checks
from attn_mt.errors import InputError


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and what the server holds at once.

    Larger requests are answered 413 and out-of-range values 422; a full queue 503 with Retry-After;
    a client that has not sent its headers (or its body) within the timeout is disconnected (408 for
    a body), and so is one that takes no part of its answer within header_timeout_s.
    """

    max_texts: int = 64  # sentences per /api/translate request
    max_chars: int = 10_000  # characters per request, all sentences together
    # an /api/attention sentence: the maps grow with its length squared
    max_attention_chars: int = 1000
    max_beam: int = 16
    max_work: int = 20_000  # per request: source subwords (with </s>) of all sentences x beam size
    max_batch_work: int = 4096  # per model call: what a one-sentence request may wait behind
    max_queue: int = 64  # requests waiting for or in decoding; more are answered 503
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others
    # from connecting (or the previous answer) to the end of the headers
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0  # from the end of the headers to the end of the body

    def __post_init__(self) -> None:
        """InputError (a ValueError) "key=value: why" for a value that is not an integer >= 1 (a
        count) or a finite number >= 0 (a time)."""
        for key in ("max_texts", "max_chars", "max_attention_chars", "max_beam", "max_work",
                    "max_batch_work", "max_queue", "max_wait_ms", "header_timeout_s",
                    "body_timeout_s"):
            value = getattr(self, key)
            try:
                (checks.number(value, key, least=0) if key.endswith(("_ms", "_s"))
                 else checks.integer(value, key))
            except InputError as e:
                raise InputError(f"{key}={checks.shown(value)}: {e.message}", key,
                                 named=True) from None

    @property
    def max_body_bytes(self) -> int:
        """Request bodies above this are refused: 12 bytes a character covers JSON's \\u escapes."""
        return 12 * self.max_chars + 16 * self.max_texts + 4096
