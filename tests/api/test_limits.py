"""The served limits: their checks, and the CLI's `serve` options taking their defaults from
them."""

from __future__ import annotations

import inspect

import pytest

from attn_mt.api.limits import Limits
from attn_mt.cli import serve


@pytest.mark.parametrize("field, value", [("max_texts", 0), ("max_queue", -1),
                                          ("max_wait_ms", -0.5), ("body_timeout_s", float("nan"))])
def test_out_of_range_limits_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        Limits(**{field: value})


def test_serve_options_default_to_the_limits():
    defaults = {name: p.default for name, p in inspect.signature(serve).parameters.items()}
    limits = Limits()
    for option in ("max_texts", "max_chars", "max_work", "max_queue"):
        assert defaults[option] == getattr(limits, option)
    assert defaults["read_timeout"] == limits.header_timeout_s == limits.body_timeout_s
    # room for JSON's escapes of every character
    assert limits.max_body_bytes > 12 * limits.max_chars
