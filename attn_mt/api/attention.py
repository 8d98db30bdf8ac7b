"""`Model.attention`'s answer: one sentence, its translation and every attention map, as arrays and
as views."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn_mt.data import checks
from attn_mt.decoding.attention_maps import AttentionMap, plot
from attn_mt.errors import InputError

# argument -> map kind
KINDS = {"encoder": "encoder_self", "decoder": "decoder_self", "cross": "cross"}


def _index(value: object, count: int, field: str, owner: str, what: str) -> int:
    """A layer's or head's number (from 1) as an index (from 0); InputError naming `field`
    otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"must be an integer from 1 to {count}, not {value!r}", field)
    if not 1 <= value <= count:
        raise InputError(f"{value} is out of range: {owner} {count} {what}", field)
    return value - 1


@dataclass(frozen=True)
class Attention:
    """Every attention head of every layer for one sentence: `weights(kind, layer, head)` gives the
    arrays, `source_tokens` / `target_tokens` their axes; a notebook shows it as an interactive head
    view.

    Decoder queries are named by the token they predict (`target_tokens`, </s> last); decoder
    self-attention's keys are the tokens read (`target_inputs`: <s> first).
    """

    source: str
    translation: str
    maps: list[AttentionMap] = field(repr=False)

    def __repr__(self) -> str:
        layers = ", ".join(f"{k} {n}" for k, n in self.layers.items())
        return f"<Attention {self.source!r} -> {self.translation!r}: layers {layers}>"

    @property
    def source_tokens(self) -> list[str]:
        return next(m for m in self.maps if m.kind == "cross").keys

    @property
    def target_tokens(self) -> list[str]:
        return next(m for m in self.maps if m.kind == "cross").queries

    @property
    def target_inputs(self) -> list[str]:
        dec = [m for m in self.maps if m.kind == "decoder_self"]
        return dec[0].keys if dec else []

    @property
    def layers(self) -> dict[str, int]:
        """How many layers each kind has: {"encoder": 3, "decoder": 3, "cross": 3} (the RNN: cross
        only)."""
        return {k: n for k, v in KINDS.items() if (n := sum(m.kind == v for m in self.maps))}

    def map(self, kind: str = "cross", layer: int = 1) -> AttentionMap:
        """One layer's map of `kind` (encoder, decoder or cross), layers from 1."""
        return self._maps(kind)[_index(layer, len(self._maps(kind)), "layer",
                                       f"{kind} attention has", "layers")]

    def _maps(self, kind: str) -> list[AttentionMap]:
        name = KINDS.get(kind, kind) if isinstance(kind, str) else None
        found = [m for m in self.maps if m.kind == name]
        if not found:
            raise InputError(f"{kind!r} is not one of {', '.join(self.layers)}", "kind")
        return found

    def weights(self, kind: str = "cross", layer: int | None = None,
                head: int | None = None) -> np.ndarray:
        """Attention weights as a float32 array: (heads, queries, keys) of one `layer` (from 1), or
        (queries, keys) for one `head` (from 1); without `layer`, every layer stacked in front:
        (layers, heads, queries, keys), or (layers, queries, keys) for one head. Each row sums to 1
        over the keys.

        >>> att.weights("encoder", layer=2, head=1)[att.source_tokens.index("▁dog")]
        >>> att.weights("cross").shape  # (layers, heads, target tokens, source tokens)
        """
        maps = self._maps(kind) if layer is None else [self.map(kind, layer)]
        w = np.stack([m.weights.float().cpu().numpy() for m in maps])  # (L, H, Tq, Tk)
        if head is not None:
            w = w[:, _index(head, w.shape[1], "head", "the model has", "heads")]  # (L, Tq, Tk)
        return w if layer is None else w[0]

    def to_html(self) -> str:
        """The interactive head view as an HTML fragment (self-contained: no network)."""
        from attn_mt.analysis.views import attention_html

        return attention_html(self.translation, self.maps, source=self.source)

    def _repr_html_(self) -> str:
        return self.to_html()

    def save_html(self, path: str | os.PathLike) -> Path:
        """The head view as a standalone HTML page."""
        from attn_mt.analysis.views import save_html

        return save_html(self.to_html(), checks.path(path), f"attention: {self.source}")

    def save_png(self, out_dir: str | os.PathLike) -> list[Path]:
        """Every layer of every kind as `{kind}_layer{n}.png` in `out_dir` (what `attn-mt attention`
        writes)."""
        from attn_mt.files import check_report

        out = checks.path(out_dir, "out_dir")
        check_report(out / "x.png", "out_dir")  # not into a model folder
        out.mkdir(parents=True, exist_ok=True)
        return [plot(m, out / f"{m.kind}_layer{m.layer}.png") for m in self.maps]
