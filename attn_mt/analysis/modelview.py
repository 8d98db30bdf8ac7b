"""The model view: every layer and head of one sentence's attention at once, one small map each, on
one colour scale (0 to 1, with its legend), for a notebook or a saved page.

With JavaScript (static/modelview.js) the maps are drawn on canvases: tick boxes choose the kinds
and heads shown, pointing at a map gives the query, the key and the weight under the pointer, and
clicking one opens it large with its tokens, its weights written in the cells when *numbers* is
ticked. Without JavaScript (an untrusted notebook, GitHub's renderer) the same maps show as a PNG
inside the HTML, and the output carries the PNG as image/png too. Offline and self-contained as
views.py's views: nothing is fetched.

    >>> from attn_mt.analysis import model_view
    >>> model_view(model.attention("a dog runs."), heads=["cross 2.1", "cross 2.3"])  # notebook
    >>> model_view(att).save_html("model_view.html")

Tested in tests/analysis/test_modelview.py.
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attn_mt.data import checks
from attn_mt.errors import InputError

from .names import head_name

KIND_NAMES = {"encoder_self": "encoder", "decoder_self": "decoder", "cross": "cross"}
TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the legend's numbers
HEAD = re.compile(r"(encoder|decoder|cross) ([0-9]{1,9})\.([0-9]{1,9})")  # not a 5000-digit int()


def _chosen(maps, heads: Sequence[str] | None) -> list[tuple[str, int, int]]:
    """The (kind, layer, head) triples to draw, layers and heads from 1: all, or those named ("cross
    2.3")."""
    every = [(KIND_NAMES[m.kind], m.layer, h) for m in maps
             for h in range(1, m.weights.shape[0] + 1)]
    if heads is None:
        return every
    if isinstance(heads, str):
        heads = [heads]
    out = []
    for name in heads:
        found = HEAD.fullmatch(str(name).strip())
        triple = found and (found[1], int(found[2]), int(found[3]))
        if triple not in every:
            raise InputError(f"{name!r} is not a head of this model: name one as 'kind "
                             f"layer.head', e.g. '{every[-1][0]} {every[-1][1]}.{every[-1][2]}'",
                             "heads")
        out.append(triple)
    if not out:
        raise InputError("no heads to draw", "heads")
    return out


@dataclass
class ModelView:
    """Every chosen head of one sentence's attention (`model_view` makes one); a notebook draws
    it."""

    source: str
    translation: str
    maps: list = field(repr=False)
    heads: list[tuple[str, int, int]] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:
        return (f"ModelView(source={self.source!r}, translation={self.translation!r}, "
                f"heads={len(self.heads)})")

    def payload(self) -> dict:
        from .views import permille

        chosen = set(self.heads)
        return {"source": self.source, "translation": self.translation, "ticks": list(TICKS),
                "maps": [{"kind": KIND_NAMES[m.kind], "layer": m.layer, "queries": list(m.queries),
                          "keys": list(m.keys), "heads": [h
                                                          for h in range(1, m.weights.shape[0] + 1)
                                                          if (KIND_NAMES[m.kind], m.layer, h)
                                                          in chosen],
                          "permille": permille(m.weights)} for m in self.maps
                         if any((KIND_NAMES[m.kind], m.layer, h) in chosen
                                for h in range(1, 1 + m.weights.shape[0]))]}

    def png(self) -> bytes:
        """The static picture: a row per kind and layer, a column per head, one colour scale with
        its legend."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads when drawing
        from matplotlib.figure import Figure

        rows = list(dict.fromkeys((k, layer) for k, layer, _ in self.heads))
        cols = sorted({h for _, _, h in self.heads})
        fig = Figure(figsize=(1.35 * len(cols) + 1.4, 1.35 * len(rows) + 0.5), dpi=80,
                     layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(rows), len(cols), squeeze=False)
        image = None
        by = {(KIND_NAMES[m.kind], m.layer): m for m in self.maps}
        for r, (kind, layer) in enumerate(rows):
            for c, h in enumerate(cols):
                ax = axes[r][c]
                ax.set_xticks([])
                ax.set_yticks([])
                if (kind, layer, h) not in self.heads:
                    ax.axis("off")
                    continue
                w = by[kind, layer].weights[h - 1]
                w = w.detach().float().cpu().numpy() if hasattr(w, "detach") else w
                image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                                  interpolation="nearest")
                ax.set_title(head_name(kind, layer, h), fontsize=8)
        if image is not None:
            bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, ticks=list(TICKS))
            bar.ax.tick_params(labelsize=7)
            bar.set_label("attention weight", fontsize=7)
        fig.suptitle("rows: queries; columns: keys", fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

    def to_html(self, png: bytes | None = None) -> str:
        """The view as an HTML fragment: the picture (what shows without scripts) and the
        interactive maps."""
        from .views import view

        png = self.png() if png is None else png
        e = html.escape
        picture = base64.b64encode(png).decode("ascii")
        body = (f'<p class="mv-caption">{e(self.source)} → {e(self.translation)}</p>'
                '<img class="mv-static" alt="every chosen head\'s attention map, one colour scale '
                f'from 0 to 1" src="data:image/png;base64,{picture}">')
        return view("model", body, "modelView", self.payload(), script="modelview.js")

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        png = self.png()
        return {"text/html": self.to_html(png), "image/png": base64.b64encode(png).decode("ascii"),
                "text/plain": repr(self)}

    def save_html(self, path: str | os.PathLike) -> Path:
        """The view as a standalone page that opens from disk."""
        from .views import save_html

        return save_html(self.to_html(), checks.path(path), f"attn-mt model view: {self.source}")


def model_view(att, heads: Sequence[str] | None = None) -> ModelView:
    """Every head of `att` (an `attn_mt.Attention`: `model.attention(text)`), or those named in
    `heads` ("encoder 1.2", "cross 2.3": kind, layer.head from 1)."""
    maps = getattr(att, "maps", None)
    if not isinstance(maps, list) or not maps or not all(isinstance(getattr(att, a, None), str)
                                                          for a in ("source", "translation")):
        raise InputError("expected the attention of a sentence: model.attention(text)", "att")
    names = None if heads is None else checks.texts(heads, "heads", files=False)[0]
    return ModelView(att.source, att.translation, maps, _chosen(maps, names))
