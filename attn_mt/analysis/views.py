"""HTML views of attention for notebooks and saved pages: a sentence's attention maps as an interactive head
view, an explanation's five steps, a heads report's table and grid. Offline and self-contained: the data goes
in as JSON, the drawing code (static/views.js) and its styles (static/views.css) inline, read from the package
at render time; nothing is fetched, no CDN, no require.js. JupyterLab and VS Code put `_repr_html_`'s HTML into
their page and run its scripts; a saved page (`document`, `save_html`) opens from disk.

Every view gets an id of its own, and its script draws inside that element only, so several views share a
notebook page. The five steps are drawn by views.js's `drawSteps`, the function `attn-mt serve`'s inside view
calls too (the server serves this file as /static/analysis/views.js): one drawing of the steps for both. The
page's own heat maps stay in serve/static/app.js: they are tied to its token chips, share links and requests.
The heads report needs no script: its grid and table are plain HTML (and render where scripts do not run).
Without scripts (an untrusted notebook, GitHub's renderer) the head view says so, the explanation shows its
text (explain_text.render).

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

    from .explain import Explanation
    from .heads import HeadsReport

STATIC = Path(__file__).resolve().parent / "static"
# ColorBrewer's RdBu, as matplotlib's "RdBu" of the heads PNG: red where masking a head costs BLEU
RDBU = [(103, 0, 31), (178, 24, 43), (214, 96, 77), (244, 165, 130), (253, 219, 199), (247, 247, 247),
        (209, 229, 240), (146, 197, 222), (67, 147, 195), (33, 102, 172), (5, 48, 97)]


def asset(name: str) -> str:
    """The text of a file of static/ (views.js, views.css), read now: an edited file shows in the next view."""
    return (STATIC / name).read_text(encoding="utf-8")


def _json(data: object) -> str:
    """JSON that can sit inside <script>: <, > and & escaped as \\u003c ..., which JSON.parse reads back."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# The view's root is the element before its script (as it runs: JupyterLab, VS Code, a saved page), else found
# by its id; an output not yet in the page is looked for again for 5 s.
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


def _view(kind: str, body: str, draw: str | None = None, data: object = None) -> str:
    """One view: a root element with a unique id, its styles, its data as JSON, a body (what shows without
    scripts) and, with `draw`, a script calling views.js's `attnMtViews.<draw>(body, data)` on this root only."""
    root = f"attn-mt-{uuid.uuid4().hex[:12]}"
    parts = [f'<div class="attn-mt-view attn-mt-box" id="{root}" data-view="{kind}">',
             f"<style>{asset('views.css')}</style>"]
    if draw:
        parts.append(f'<script type="application/json" class="attn-mt-data">{_json(data)}</script>')
    parts += [f'<div class="attn-mt-body">{body}</div>', "</div>"]
    if draw:
        js = asset("views.js")
        assert "</script" not in js.lower()
        launch = LAUNCH.replace("ROOT", root).replace("DRAW", draw)
        parts.append(f"<script>(function () {{\n{js}\n{launch}}})();</script>")
    return "\n".join(parts)


def attention_html(translation: str, maps: list[AttentionMap], source: str | None = None) -> str:
    """The head view of one sentence's attention maps (decoding.attention_maps; weights a tensor or an array):
    pick kind, layer and head (or all heads); hover or click a token to see where it attends (lines and shading)
    and what attends to it; a heat map per head. Weights go in as integers per mille (0-1000: 3 decimals, the
    JSON a third as long): about 2.7 bytes a weight, 347 KB for 6 layers x 8 heads x 3 kinds over 30 tokens
    (random softmax weights)."""
    if not maps:
        raise ValueError("attention_html: no attention maps to show (an RNN or an export has none)")
    payload = {"source": source, "translation": translation, "maps": [
        {"kind": m.kind, "layer": m.layer, "queries": list(m.queries), "keys": list(m.keys),
         "permille": _permille(m.weights)} for m in maps]}
    note = ('<p class="nojs">The head view draws itself with JavaScript: run the cell in a trusted notebook, or '
            f"open the saved HTML file. Translation: {html.escape(translation)}</p>")
    return _view("attention", note, "headView", payload)


def _permille(weights) -> list:
    """(H, Tq, Tk) weights, a tensor (any dtype or device) or an array, as nested lists of round(1000 w)."""
    import numpy as np

    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    return np.rint(np.asarray(weights, dtype=np.float64) * 1000).astype(np.int64).tolist()


def explanation_html(e: Explanation) -> str:
    """One head's five steps for one query (analysis.explain): vectors as strips, scores, scaling, mask and
    softmax weights as bars, the largest contributions, every head's output and W_o's, checked against the
    model's own output."""
    from dataclasses import asdict

    from .explain_text import render

    return _view("explanation", f'<pre class="nojs">{html.escape(render(e))}</pre>', "explanationView", asdict(e))


def _rdbu(x: float) -> str:
    """RdBu at x in [-1, 1] (-1 red, 0 white, 1 blue) as a CSS colour."""
    t = min(max((x + 1) / 2, 0.0), 1.0) * (len(RDBU) - 1)
    i = min(int(t), len(RDBU) - 2)
    a, b = RDBU[i], RDBU[i + 1]
    return "rgb({},{},{})".format(*(round(u + (v - u) * (t - i)) for u, v in zip(a, b, strict=True)))


def _cell(value: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def heads_html(report: HeadsReport) -> str:
    """A heads report (analysis.heads) as HTML: a layer x head grid per kind coloured by the BLEU change when the
    head is masked (as the PNG of `attn-mt heads --png`), each cell with its largest share of attention, then
    the table of every head's dBLEU, dloss and roles, then the pruning. Plain HTML, no script."""
    from .masking import KINDS
    from .roles import ROLES

    e = html.escape
    worst = max(0.5, max(abs(r["d_bleu"]) for r in report.heads))  # the darkest shade
    grids = [_grid(report, kind, worst) for kind in KINDS if any(r["kind"] == kind for r in report.heads)]
    parts = [f'<h2 class="title">Heads of {e(Path(report.checkpoint).name)}: BLEU {report.bleu:.2f}, loss '
             f"{report.loss:.4f} on {report.sentences} sentences (greedy), {report.seconds_per_head:.1f} s per head"
             "</h2>",
             '<p class="legend">Each head masked alone: the change in BLEU (red: the head mattered, blue: BLEU rose '
             "without it), where its attention goes most (the previous, same, next, rarest token, eos, punctuation) "
             "and, for cross-attention, the monotony of its alignment.</p>",
             f'<div class="grids">{"".join(grids)}</div>',
             '<div class="scroll"><table class="report"><thead><tr><th>head</th><th>dBLEU</th><th>dloss</th>'
             + "".join(f"<th>{k}</th>" for k in ROLES) + ("<th>coref</th>" if report.coref else "")
             + f"</tr></thead><tbody>{''.join(_table_rows(report, worst))}</tbody></table></div>",
             *_heads_notes(report)]
    return _view("heads", "\n".join(parts))


def _grid(report: HeadsReport, kind: str, worst: float) -> str:
    """The layer x head grid of one kind: a row per layer, a cell per head (empty where the report has none)."""
    layers = max(r["layer"] for r in report.heads)
    n_heads = max(r["head"] for r in report.heads)
    rows = {(r["layer"], r["head"]): r for r in report.heads if r["kind"] == kind}
    body = []
    for layer in range(1, layers + 1):
        cells = [_grid_cell(rows[layer, h], worst) if (layer, h) in rows else "<td></td>"
                 for h in range(1, n_heads + 1)]
        body.append(f"<tr><th>layer {layer}</th>{''.join(cells)}</tr>")
    head = "".join(f"<th>head {h}</th>" for h in range(1, n_heads + 1))
    name = {"encoder": "encoder self", "decoder": "decoder self", "cross": "cross"}[kind]
    return (f'<table class="grid"><caption>{name}</caption><thead><tr><th></th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _grid_cell(r: dict, worst: float) -> str:
    """One head's cell: its BLEU change (the colour too), its largest share, monotony and coreference."""
    from .overview import SHARES

    kind, layer, h, roles = r["kind"], r["layer"], r["head"], r["roles"]
    top = max((s for s in SHARES if roles.get(s) is not None), key=lambda s: roles[s], default=None)
    lines = [f"<b>{r['d_bleu']:+.1f}</b>", f"{top} {roles[top]:.2f}" if top else ""]
    if roles.get("mono") is not None:
        lines.append(f"mono {roles['mono']:.2f}")
    if r.get("coref"):
        lines.append(f"coref {r['coref']['resolved']:.2f}")
    shade = r["d_bleu"] / worst
    ink = "#fff" if abs(shade) > 0.6 else "#1d2330"
    return (f'<td style="background:{_rdbu(shade)};color:{ink}" data-kind="{kind}" '
            f'data-layer="{layer}" data-head="{h}" title="{kind} {layer}.{h}: BLEU change '
            f'{r["d_bleu"]:+.2f}, loss change {r["d_loss"]:+.4f}">{"<br>".join(lines)}</td>')


def _table_rows(report: HeadsReport, worst: float) -> list[str]:
    """A table row per head: dBLEU with a bar, dloss, the roles (and with a contrastive set, coref)."""
    from .roles import ROLES

    rows = []
    for r in report.heads:
        width = round(40 * min(abs(r["d_bleu"]) / worst, 1))
        bar = (f'<span class="dbar" style="width:{width}px;background:{_rdbu(r["d_bleu"] / worst)}"></span>')
        rows.append(f"<tr><td>{html.escape(r['kind'])} {r['layer']}.{r['head']}</td><td>{r['d_bleu']:+.2f}{bar}</td>"
                    f"<td>{r['d_loss']:+.4f}</td>" + "".join(f"<td>{_cell(r['roles'].get(k))}</td>" for k in ROLES)
                    + (f"<td>{_cell((r.get('coref') or {}).get('resolved'))}</td>" if report.coref else "") + "</tr>")
    return rows


def _heads_notes(report: HeadsReport) -> list[str]:
    """What follows the table: the coreference lines, the heads pruned before and the pruning."""
    e, parts = html.escape, []
    if report.coref:
        from .overview import coref_lines

        parts.append(f'<pre class="coref">{e(chr(10).join(coref_lines(report)))}</pre>')
    if report.pruned_before:
        parts.append(f"<p>Pruned before (by the checkpoint): {e(', '.join(report.pruned_before))}</p>")
    if report.pruned:
        items = "".join(f"<li>{e(p['head'])}: BLEU {p['bleu']:.2f}, loss {p['loss']:.4f}</li>" for p in report.pruned)
        parts.append(f"<p>Pruned {len(report.pruned)} heads, each the one whose masking raised the loss least:</p>"
                     f'<ol class="pruned">{items}</ol><p>BLEU {report.bleu:.2f} → {_cell(report.bleu_after)}, loss '
                     f"{report.loss:.4f} → {_cell(report.loss_after, '{:.4f}')}; wrote {e(str(report.out))}</p>")
    return parts


def document(fragment: str, title: str = "attn-mt") -> str:
    """A complete HTML page around a view (or several), to open from disk: nothing in it is fetched."""
    return ('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(title)}</title>\n<link rel="icon" href="data:,">\n'
            "<style>body { margin: 1rem; background: #f4f6f9; }</style>\n</head>\n"
            f"<body>\n{fragment}\n</body>\n</html>\n")


def save_html(fragment: str, path: Path | str, title: str = "attn-mt") -> Path:
    """Write `document(fragment, title)` to `path` atomically (a new file beside it, then a rename, as
    checkpoints are written); an OSError names the file."""
    from attn_mt.config.files import write_report

    path = Path(path)
    try:
        write_report(path, document(fragment, title), "html")
    except OSError as err:
        raise OSError(err.errno, f"{path}: cannot write the page ({err.strerror or err})") from None
    return path
