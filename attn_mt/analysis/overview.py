"""`attn-mt heads`'s report (`HeadsReport`, what heads.py measures) as an 80-column table, as JSON,
as one PNG overview of every head and as an HTML view (a layer x head grid and a table, plain HTML
through views.py).

One job: the heads report and its forms.

Tested in tests/analysis/test_heads.py (the heads command's table and files) and
tests/analysis/test_views.py.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attn_mt.data import checks
from attn_mt.files import check_report, write_report

from .names import KINDS, head_name
from .roles import ROLES

# where a head's weight goes; conf and mono apart
SHARES = ("prev", "same", "next", "rare", "eos", "punct")


@dataclass
class HeadsReport:
    """What `attn-mt heads` found (BLEU greedy; layers and heads count from 1)."""

    checkpoint: str
    sentences: int
    bleu: float
    loss: float
    # per head: kind, layer, head, bleu, loss (masked), d_bleu with its 95% bootstrap interval
    # (d_bleu_low, d_bleu_high: intervals.py), d_loss, roles; with a contrastive set also coref
    # (coref.Resolution.row), contrastive and d_contrastive (masked)
    heads: list[dict]
    seconds_per_head: float
    seconds: float = 0.0
    contrastive: float | None = None  # the contrastive accuracy, no head masked
    # items, located (with word positions), top: the best resolving heads masked together
    coref: dict | None = None
    # listed by the checkpoint (not pruned again)
    pruned_before: list[str] = field(default_factory=list)
    # per removal: head, bleu and loss with it (and those before) gone
    pruned: list[dict] = field(default_factory=list)
    bleu_after: float | None = None
    loss_after: float | None = None
    out: str | None = None

    # a notebook shows the grid and the table (views.py loads only when drawn)
    def _repr_html_(self) -> str:
        return heads_html(self)

    def __repr__(self) -> str:
        pruned = f", {len(self.pruned)} pruned" if self.pruned else ""
        return (f"<HeadsReport {Path(self.checkpoint).name}: {len(self.heads)} heads masked on "
                f"{self.sentences} sentences, BLEU {self.bleu:.2f}{pruned}; .table() prints them>")

    def table(self) -> str:
        """Every head's importance and roles, one line each, then the pruning: what `attn-mt heads`
        prints."""
        return table(self)

    def save_html(self, path: Path | str) -> Path:
        """The report as an HTML page that opens from disk (`overview.save` writes its JSON and
        PNG)."""
        from .views import save_html

        return save_html(heads_html(self), checks.path(path),
                         f"attn-mt heads: {Path(self.checkpoint).name}")


def _cell(value: float | None, width: int = 6) -> str:
    return f"{'-' if value is None else f'{value:.2f}':>{width}}"


def table(report: HeadsReport) -> str:
    """Every head's importance and roles, one line each, then the pruning (80 columns)."""
    lines = [f"BLEU {report.bleu:.2f} (greedy), loss {report.loss:.4f} on {report.sentences} "
             f"sentences; {report.seconds_per_head:.1f} s per head",
             "dBLEU, dloss: the change when that head alone is masked. Then where its",
             "attention goes: the previous, same, next, rarest token, eos (the decoder: bos),",
             "punctuation; conf: its mean largest weight; mono: the rank correlation of",
             "cross-attention's argmax source position with the target position",
             *(["coref: how often the pronoun's weight on its antecedent beats the other noun's"]
               if report.coref else []),
             "",
             f"{'head':<11}{'dBLEU':>7}{'dloss':>8}" + "".join(f"{r:>6}" for r in ROLES)
             + (f"{'coref':>6}" if report.coref else "")]
    for row in report.heads:
        name = f"{row['kind']} {row['layer']}.{row['head']}"
        lines.append(f"{name:<11}{row['d_bleu']:>+7.2f}{row['d_loss']:>+8.3f}"
                     + "".join(_cell(row["roles"][r]) for r in ROLES)
                     + (_cell((row.get("coref") or {}).get("resolved")) if report.coref else ""))
    if report.coref:
        lines += ["", *coref_lines(report)]
    if report.pruned_before:
        lines.append(f"pruned before (by the checkpoint): {', '.join(report.pruned_before)}")
    if report.pruned:
        lines += ["", f"pruned {len(report.pruned)} heads, each the one whose masking raised the "
                  "loss least:"]
        lines += [f"{i:>4}. {p['head']:<12} BLEU {p['bleu']:6.2f}  loss {p['loss']:.4f}"
                  for i, p in enumerate(report.pruned, 1)]
        lines += [f"BLEU {report.bleu:.2f} -> {report.bleu_after:.2f}, loss {report.loss:.4f} -> "
                  f"{report.loss_after:.4f}; wrote {report.out}",
                  "(same shapes: the pruned heads' rows of W_q, W_k, W_v and columns of W_o are 0)"]
    return "\n".join(lines)


def coref_lines(report: HeadsReport, best: int = 5) -> list[str]:
    """The coreference part: the contrastive accuracy, the best resolving heads (their weights on
    the antecedent and the other noun, the accuracy masking each costs), the top heads masked
    together."""
    c = report.coref
    lines = [f"contrastive accuracy {report.contrastive:.2%} on {c['items']} items ({c['located']} "
             "located)"]
    ranked = sorted((r for r in report.heads if r.get("coref")),
                    key=lambda r: -r["coref"]["resolved"])[:best]
    if ranked:
        lines.append(f"{'best resolving':<15}{'coref':>7}{'antecedent':>12}{'other':>8}"
                     f"{'dacc masked':>13}")
        lines += [f"{r['kind'] + ' ' + str(r['layer']) + '.' + str(r['head']):<15}"
                  f"{r['coref']['resolved']:>7.2%}{r['coref']['antecedent']:>12.3f}{r['coref']['other']:>8.3f}{r['d_contrastive']:>+13.2%}"
                  for r in ranked]
    if c["top"]:
        lines.append("the best resolving heads of a kind masked together: accuracy (change)")
        lines += [f"{t['contrastive']:>9.2%} ({t['d_contrastive']:+.2%})  {', '.join(t['heads'])}"
                  for t in c["top"]]
    return lines


def save(report: HeadsReport, json_path: Path | None = None,
         png_path: Path | None = None) -> list[Path]:
    """Write the report as JSON and draw it as a PNG, each where a path is given; returns the files
    written."""
    # neither written if one cannot be
    for option, path in (("json", json_path), ("png", png_path)):
        if path:
            check_report(path, option)
    written = [write_json(report, json_path)] if json_path else []
    return written + ([plot(report, png_path)] if png_path else [])


def write_json(report: HeadsReport, path: Path) -> Path:
    return write_report(path, json.dumps(asdict(report), indent=2) + "\n", "json")


def _label(row: dict) -> str:
    """A cell's text: the BLEU change, the largest share and (cross-attention) the monotony."""
    roles = row["roles"]
    top = max((r for r in SHARES if roles[r] is not None), key=lambda r: roles[r])
    text = f"{row['d_bleu']:+.1f}\n{top} {roles[top]:.2f}"
    text += f"\nmono {roles['mono']:.2f}" if roles["mono"] is not None else ""
    return text + (f"\ncoref {row['coref']['resolved']:.2f}" if row.get("coref") else "")


def plot(report: HeadsReport, path: Path) -> Path:
    """One PNG: a layer x head grid per kind, coloured by the BLEU change when the head is
    masked."""
    # matplotlib loads when drawing (0.75 s)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_kind = {k: [r for r in report.heads if r["kind"] == k] for k in KINDS}
    layers = max(r["layer"] for r in report.heads)
    heads = max(r["head"] for r in report.heads)
    worst = max(0.5, max(abs(r["d_bleu"]) for r in report.heads))
    fig = Figure(figsize=(3 * max(2.0, 1.1 * heads), 1.0 + 0.9 * layers), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(KINDS), squeeze=False)[0]
    for ax, kind in zip(axes, KINDS, strict=True):
        grid = [[0.0] * heads for _ in range(layers)]
        for r in by_kind[kind]:
            grid[r["layer"] - 1][r["head"] - 1] = r["d_bleu"]
            ax.text(r["head"] - 1, r["layer"] - 1, _label(r), ha="center", va="center", fontsize=6)
        img = ax.imshow(grid, cmap="RdBu", vmin=-worst, vmax=worst, aspect="auto")
        ax.set_title({"encoder": "encoder self", "decoder": "decoder self", "cross": "cross"}[kind],
                     fontsize=9)
        ax.set_xticks(range(heads), [f"head {h + 1}" for h in range(heads)], fontsize=7)
        ax.set_yticks(range(layers), [f"layer {i + 1}" for i in range(layers)], fontsize=7)
    fig.colorbar(img, ax=list(axes), shrink=0.8, label="BLEU change, head masked")
    fig.suptitle(f"heads of {Path(report.checkpoint).name}: BLEU {report.bleu:.2f} on "
                 f"{report.sentences} sentences (greedy)", fontsize=10)
    return write_report(path, lambda f: fig.savefig(f, format="png", dpi=110), "png")


# ColorBrewer's RdBu, as matplotlib's "RdBu" of the heads PNG: red where masking a head costs BLEU
RDBU = [(103, 0, 31), (178, 24, 43), (214, 96, 77), (244, 165, 130), (253, 219, 199),
        (247, 247, 247), (209, 229, 240), (146, 197, 222), (67, 147, 195), (33, 102, 172),
        (5, 48, 97)]


def _rdbu(x: float) -> str:
    """RdBu at x in [-1, 1] (-1 red, 0 white, 1 blue) as a CSS colour."""
    t = min(max((x + 1) / 2, 0.0), 1.0) * (len(RDBU) - 1)
    i = min(int(t), len(RDBU) - 2)
    a, b = RDBU[i], RDBU[i + 1]
    return "rgb({},{},{})".format(
        *(round(u + (v - u) * (t - i)) for u, v in zip(a, b, strict=True)))


def _shown(value: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def heads_html(report: HeadsReport) -> str:
    """A heads report (analysis.heads) as HTML: a layer x head grid per kind coloured by the BLEU
    change when the head is masked (as the heads command's PNG), each cell with its largest share of
    attention, then the table of every head's dBLEU, dloss and roles, then the pruning. Plain HTML,
    no script."""
    from .views import view

    e = html.escape
    worst = max(0.5, max(abs(r["d_bleu"]) for r in report.heads))  # the darkest shade
    grids = [_grid(report, kind, worst) for kind in KINDS
             if any(r["kind"] == kind for r in report.heads)]
    parts = [f'<h2 class="title">Heads of {e(Path(report.checkpoint).name)}: BLEU '
             f'{report.bleu:.2f}, loss '
             f"{report.loss:.4f} on {report.sentences} sentences (greedy), "
             f"{report.seconds_per_head:.1f} s per head</h2>",
             '<p class="legend">Each head masked alone: the change in BLEU (red: the head '
             'mattered, blue: BLEU rose '
             "without it; the interval: 95% of the changes on the sentences resampled 1000 times, "
             "so a change whose interval holds 0 may be the sentences drawn, not the head), where "
             "its attention goes most (the previous, same, next, rarest token, eos, punctuation) "
             "and, for cross-attention, the monotony of its alignment.</p>",
             f'<div class="grids">{"".join(grids)}</div>',
             '<div class="scroll"><table class="report"><thead><tr><th>head</th><th>dBLEU</th>'
             '<th title="95% paired bootstrap interval over the sentences">95% '
             'interval</th><th>dloss</th>' + "".join(f"<th>{k}</th>" for k in ROLES)
             + ("<th>coref</th>" if report.coref else "")
             + f"</tr></thead><tbody>{''.join(_table_rows(report, worst))}</tbody></table></div>",
             *_heads_notes(report)]
    return view("heads", "\n".join(parts))


def _grid(report: HeadsReport, kind: str, worst: float) -> str:
    """The layer x head grid of one kind: a row per layer, a cell per head (empty where the report
    has none)."""
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
    """One head's cell: its BLEU change (the colour too), its largest share, monotony and
    coreference."""
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
            f'data-layer="{layer}" data-head="{h}" title="{head_name(kind, layer, h)}: BLEU change '
            f'{r["d_bleu"]:+.2f} '
            f'{html.escape(_interval(r).replace("<b>", "").replace("</b>", ""))}, loss change '
            f'{r["d_loss"]:+.4f}">{"<br>".join(lines)}</td>')


def _interval(r: dict) -> str:
    """A head's dBLEU interval, "[-1.20, +0.35]", bold where it excludes 0; "–" in reports made
    without one."""
    if r.get("d_bleu_low") is None:
        return "–"
    text = f"[{r['d_bleu_low']:+.2f}, {r['d_bleu_high']:+.2f}]"
    return f"<b>{text}</b>" if r["d_bleu_low"] > 0 or r["d_bleu_high"] < 0 else text


def _table_rows(report: HeadsReport, worst: float) -> list[str]:
    """A table row per head: dBLEU with a bar, dloss, the roles (and with a contrastive set,
    coref)."""
    rows = []
    for r in report.heads:
        width = round(40 * min(abs(r["d_bleu"]) / worst, 1))
        bar = ('<span class="dbar" '
               f'style="width:{width}px;background:{_rdbu(r["d_bleu"] / worst)}"></span>')
        rows.append(f"<tr><td>{html.escape(r['kind'])} "
                    f"{r['layer']}.{r['head']}</td><td>{r['d_bleu']:+.2f}{bar}</td><td>{_interval(r)}</td>"
                    f"<td>{r['d_loss']:+.4f}</td>"
                    + "".join(f"<td>{_shown(r['roles'].get(k))}</td>" for k in ROLES)
                    + (f"<td>{_shown((r.get('coref') or {}).get('resolved'))}</td>" if report.coref
                       else "") + "</tr>")
    return rows


def _heads_notes(report: HeadsReport) -> list[str]:
    """What follows the table: the coreference lines, the heads pruned before and the pruning."""
    e, parts = html.escape, []
    if report.coref:
        parts.append(f'<pre class="coref">{e(chr(10).join(coref_lines(report)))}</pre>')
    if report.pruned_before:
        parts.append("<p>Pruned before (by the checkpoint): "
                     f"{e(', '.join(report.pruned_before))}</p>")
    if report.pruned:
        items = "".join(f"<li>{e(p['head'])}: BLEU {p['bleu']:.2f}, loss {p['loss']:.4f}</li>"
                        for p in report.pruned)
        parts.append(f"<p>Pruned {len(report.pruned)} heads, each the one whose masking raised the "
                     "loss least:</p>"
                     f'<ol class="pruned">{items}</ol><p>BLEU {report.bleu:.2f} → '
                     f'{_shown(report.bleu_after)}, '
                     f"loss {report.loss:.4f} → {_shown(report.loss_after, '{:.4f}')}; wrote "
                     f"{e(str(report.out))}</p>")
    return parts
