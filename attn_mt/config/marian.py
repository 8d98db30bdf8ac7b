"""The `model:` section of a MarianMT model (`kind: marian`): a post-norm Transformer in Marian's
layout, which imports/marian.py reads and models/imported.py builds. Sections written before this
kind existed (`kind: transformer` with `output_bias: true`) are read as one (`upgrade`).

Tested in tests/marian/test_marian.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from attn_mt.config.model import TransformerConfig
from attn_mt.config.yamlconf import ConfigError


@dataclass(frozen=True)
class MarianConfig(TransformerConfig):
    """A Transformer with Marian's sinusoid table (sin in the first half of the dimensions, cos
    in the second), a fixed bias on the logits (final_logits_bias), target ids never generated."""

    kind: Literal["marian"] = "marian"
    positions: Literal["halves"] = "halves"
    banned_ids: tuple[int, ...] = ()  # Marian's pad, its decoder start

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_model % 2:
            raise ConfigError(f"model.d_model={self.d_model}: must be even", "model.d_model")
        if any(i < 0 for i in self.banned_ids):
            raise ConfigError(f"model.banned_ids={list(self.banned_ids)}: must be token ids >= 0",
                              "model.banned_ids")


def upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """A config dict whose model section was written by an attn-mt without `kind: marian`: a
    MarianMT model's (`output_bias: true`) becomes one; every other model's drops the two keys
    it wrote at their defaults (`output_bias: false`, `banned_ids: []`)."""
    model = raw.get("model") if isinstance(raw, dict) else None  # build() names what is not a dict
    if not isinstance(model, dict) or model.get("kind", "transformer") != "transformer" \
            or "output_bias" not in model:
        return raw
    model = dict(model)
    if model.pop("output_bias") is True:
        model["kind"] = "marian"
    elif model.get("banned_ids") == []:
        del model["banned_ids"]
    return {**raw, "model": model}
