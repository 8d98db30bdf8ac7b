"""HTML views of attention for notebooks and saved pages: a sentence's attention maps as an
interactive head view, an explanation's five steps, a heads report's table and grid. Offline and
self-contained: the data goes in as JSON, the drawing code (static/views.js) and its styles
(static/views.css) inline, read from the package at render time; nothing is fetched, no CDN, no
require.js. JupyterLab and VS Code put `_repr_html_`'s HTML into their page and run its scripts; a
saved page (`document`, `save_html`) opens from disk.

Every view gets an id of its own, and its script draws inside that element only, so several views
share a notebook page. The five steps are drawn by views.js's `drawSteps`, the function `attn-mt
serve`'s inside view calls too (the server serves this file as /static/analysis/views.js): one
drawing of the steps for both. The page's own heat maps stay in serve/static/app.js: they are tied
to its token chips, share links and requests. The heads report needs no script: its grid and table
are plain HTML (and render where scripts do not run). Without scripts (an untrusted notebook,
GitHub's renderer) the head view says so, the explanation shows its text. Each report draws itself
with `view` (explanation.explanation_html, overview.heads_html): this module knows none of them.

    from attn_mt.analysis import views
    views.save_html(views.attention_html(translation, maps), "attention.html", "attention")
"""

from __future__ import annotations

import html
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_mt.decoding.attention_maps import AttentionMap

STATIC = Path(__file__).resolve().parent / "static"


def asset(name: str) -> str:
    """The text of a file of static/ (views.js, views.css), read now: an edited file shows in the
    next view."""
    return (STATIC / name).read_text(encoding="utf-8")


def _json(data: object) -> str:
    """JSON that can sit inside <script>: <, > and & escaped as \\u003c ..., which JSON.parse reads
    back."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# The view's root is the element before its script (as it runs: JupyterLab, VS Code, a saved page),
# else found by its id; an output not yet in the page is looked for again for 5 s.
LAUNCH = """const script = document.currentScript;
(function draw(tries) {
  const before = script && script.previousElementSibling;
  const root = before && before.id === "ROOT" ? before : document.getElementById("ROOT");
  if (!root) {
    if (tries < 50) setTimeout(() => draw(tries + 1), 100);
    return;
  }
  const data = JSON.parse(root.querySelector("script.attn-mt-data").textContent);
  attnMtViews.DRAW(root.querySelector(".attn-mt-body"), data);
})(0);
"""


def view(kind: str, body: str, draw: str | None = None, data: object = None,
         script: str = "views.js") -> str:
    """One view: a root element with a unique id, its styles, its data as JSON, a body (what shows
    without scripts) and, with `draw`, a script calling `attnMtViews.<draw>(body, data)` of `script`
    (a file of static/: views.js, or modelview.js for the model view) on this root only."""
    root = f"attn-mt-{uuid.uuid4().hex[:12]}"
    parts = [f'<div class="attn-mt-view attn-mt-box" id="{root}" data-view="{kind}">',
             f"<style>{asset('views.css')}</style>"]
    if draw:
        parts.append(f'<script type="application/json" class="attn-mt-data">{_json(data)}</script>')
    parts += [f'<div class="attn-mt-body">{body}</div>', "</div>"]
    if draw:
        js = asset(script)
        assert "</script" not in js.lower()
        launch = LAUNCH.replace("ROOT", root).replace("DRAW", draw)
        parts.append(f"<script>(function () {{\n{js}\n{launch}}})();</script>")
    return "\n".join(parts)


def attention_html(translation: str, maps: list[AttentionMap], source: str | None = None) -> str:
    """The head view of one sentence's attention maps (decoding.attention_maps; weights a tensor or
    an array): pick kind, layer and head (or all heads); hover or click a token to see where it
    attends (lines and shading) and what attends to it; a heat map per head. Weights go in as
    integers per mille (0-1000: 3 decimals, the JSON a third as long): about 2.7 bytes a weight, 347
    KB for 6 layers x 8 heads x 3 kinds over 30 tokens (random softmax weights)."""
    if not maps:
        raise ValueError("attention_html: no attention maps to show (an RNN or an export has none)")
    payload = {"source": source, "translation": translation, "maps": [
        {"kind": m.kind, "layer": m.layer, "queries": list(m.queries), "keys": list(m.keys),
         "permille": permille(m.weights)} for m in maps]}
    note = ('<p class="nojs">The head view draws itself with JavaScript: run the cell in a trusted '
            'notebook, or '
            f"open the saved HTML file. Translation: {html.escape(translation)}</p>")
    return view("attention", note, "headView", payload)


def permille(weights) -> list:
    """(H, Tq, Tk) weights, a tensor (any dtype or device) or an array, as nested lists of
    round(1000 w)."""
    import numpy as np

    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    return np.rint(np.asarray(weights, dtype=np.float64) * 1000).astype(np.int64).tolist()


def document(fragment: str, title: str = "attn-mt") -> str:
    """A complete HTML page around a view (or several), to open from disk: nothing in it is
    fetched."""
    return ('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(title)}</title>\n<link rel="icon" href="data:,">\n'
            "<style>body { margin: 1rem; background: #f4f6f9; }</style>\n</head>\n"
            f"<body>\n{fragment}\n</body>\n</html>\n")


def save_html(fragment: str, path: Path | str, title: str = "attn-mt") -> Path:
    """Write `document(fragment, title)` to `path` atomically (a new file beside it, then a rename,
    as checkpoints are written); an OSError names the file."""
    from attn_mt.files import write_report

    path = Path(path)
    try:
        write_report(path, document(fragment, title), "html")
    except OSError as err:
        raise OSError(err.errno, f"{path}: cannot write the page ({err.strerror or err})") from None
    return path
