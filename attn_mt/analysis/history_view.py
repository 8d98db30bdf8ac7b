"""A run's attention history (history.py's `History`) as views: an offline HTML page with a step
slider and one PNG summary, for notebooks, saved pages, `attn-mt heads --history` and `attn-mt
serve`'s /history.

The page (static/historyview.js draws it on canvases): for the probe sentence chosen, every module x
head attention map at the step chosen (rows: modules, columns: heads; tokens on the axes where they
fit), each head's role curves over the steps with the step it took its role marked
(`History.role_step`), and the contrastive accuracy and BLEU over the steps with the step the best
coreference head first resolves 80% of the items (`coref_step`) and the step the mean entropy leaves
uniform (`uniform_step`). Weights go in as one byte each (round(255 w), base64). Without JavaScript
the PNG summary stands in, as in the model view. Offline and self-contained as views.py's views:
nothing is fetched, every text is escaped (JSON that cannot close its script; lone surrogates as
U+FFFD).

The PNG: the heads' roles as a heat map over the steps (a row per module and head, a column per
evaluation; the hue is the head's strongest role, every role but conf as History.role_step counts
them, full where it holds it (>= 0.5), paler below; a ring where the head takes its role), above the
contrastive accuracy and BLEU, aligned by evaluation.

    >>> view = HistoryView(history, "runs/pronoun")   # a notebook draws it (_repr_html_)
    >>> view.save_html("history.html"), view.save_png("history.png")

Needs neither torch nor history.py (any object with History's fields draws), so history.py can make
one.

One job: drawing a recorded History (the page's data, its HTML, the PNG); recording and reading it
is history.py's. Tested in tests/analysis/test_history_view.py.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attn_mt.data import checks

from .names import module_head

# matplotlib's tab10, a colour per role (and the page's); other roles take the rest in turn
COLOURS = {"prev": "#1f77b4", "same": "#ff7f0e", "next": "#2ca02c", "rare": "#d62728",
           "eos": "#9467bd", "punct": "#8c564b", "conf": "#7f7f7f", "mono": "#17becf"}
SPARE = ("#bcbd22", "#e377c2", "#393b79", "#637939")
# the share of items the best coreference head resolves at its step (History.coref_step)
COREF_THRESHOLD = 0.8
NO_RECORDS = "no evaluations recorded yet"  # a history of no records: drawn as this line
MAX_LABELS = 64  # rows of the PNG labelled one by one (a label each costs its layout time)
# a head holds a role from this value on (History.role_step's min_share): the PNG's full colour
HOLDS = 0.5


def colours(roles) -> dict[str, str]:
    """A colour per role name: COLOURS', else a spare one in turn."""
    roles = list(roles)
    spare = iter(SPARE * (1 + len(roles)))
    return {r: COLOURS.get(r) or next(spare) for r in roles}


def _number(x: Any, digits: int = 4) -> float | None:
    """A finite number rounded for JSON; None for None and NaN."""
    if x is None:
        return None
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def _curves(array: Any) -> list[list[list[float | None]]] | None:
    """(E, A, H) values as [module][head] -> E numbers (None where NaN)."""
    if array is None:
        return None
    a = np.asarray(array, dtype=np.float64)
    return [[[_number(v, 3) for v in a[:, m, h]] for h in range(a.shape[2])]
            for m in range(a.shape[1])]


def _axes(module: str, probe: Any, q: int, k: int) -> tuple[list[str], list[str]]:
    """A map's (query, key) token labels: cross-attention target x source, encoder self source,
    decoder self target; positions where the tokens do not match the map's shape."""
    src, tgt = [checks.clean(str(t))
                for t in probe.src_tokens], [checks.clean(str(t)) for t in probe.tgt_tokens]
    name = module.lower()
    queries, keys = ((tgt, src) if "cross" in name else (src, src) if name.startswith("encoder")
                     else (tgt, tgt))
    return (queries if len(queries) == q else [str(i) for i in range(q)],
            keys if len(keys) == k else [str(i) for i in range(k)])


def _bytes(weights: Any) -> str:
    """(E, H, Q, K) weights as one byte each, round(255 w), base64 (the page reads them back with
    atob)."""
    w = np.nan_to_num(np.asarray(weights, dtype=np.float32), nan=0.0)
    return base64.b64encode(np.rint(np.clip(w, 0.0, 1.0) * 255).astype(np.uint8).tobytes()).decode(
        "ascii")


def experts(history: Any) -> list[str]:
    """The roles a head can be the expert of, as History.role_step counts them: every role but conf
    (how sharp a head is, not where it looks)."""
    return [r for r in history.roles if r != "conf"]


def dominant(history: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each head's largest role value at each step: (index into `experts(history)`, value), both (E,
    A, H); index -1 and value 0 where no role applies to the head."""
    # (R, E, A, H)
    values = np.stack([np.asarray(history.roles[r], dtype=np.float64) for r in experts(history)])
    filled = np.where(np.isnan(values), -np.inf, values)
    index = filled.argmax(axis=0)
    value = np.take_along_axis(filled, index[None], axis=0)[0]
    missing = ~np.isfinite(value)
    return np.where(missing, -1, index), np.where(missing, 0.0, value)


def _role_steps(history: Any) -> list[list[dict | None]]:
    """[module][head] -> {"role", "step"} where the head takes its dominant role
    (History.role_step), else None."""
    found = history.role_step()
    out: list[list[dict | None]] = []
    for m in range(len(history.modules)):
        row: list[dict | None] = []
        for h in range(history.n_heads):
            got = found.get((m, h))
            row.append({"role": str(got[0]), "step": int(got[1])} if got else None)
        out.append(row)
    return out


def payload(history: Any) -> dict:
    """What the page draws, as JSON-ready data (every text clean, every number finite or None)."""
    coref = history.coref_step(COREF_THRESHOLD)
    uniform = history.uniform_step()
    probes = []
    for p, probe in enumerate(history.probes):
        maps = []
        for m, module in enumerate(history.modules):
            w = history.maps[p][m]  # (E, H, Q, K)
            queries, keys = _axes(module, probe, w.shape[2], w.shape[3])
            maps.append({"queries": queries, "keys": keys, "bytes": _bytes(w)})
        probes.append({"kind": checks.clean(str(probe.kind)),
                       "source": checks.clean(str(probe.source)),
                       "target": checks.clean(str(probe.target)), "maps": maps})
    return {"model_kind": checks.clean(str(history.model_kind)),
            "steps": [int(s) for s in history.steps],
            "modules": [checks.clean(str(m)) for m in history.modules],
            "heads": int(history.n_heads), "head_names": [[checks.clean(module_head(str(m), h + 1))
                                                           for h in range(history.n_heads)]
                                                          for m in history.modules],
            "roles": {checks.clean(str(r)): _curves(v) for r, v in history.roles.items()},
            "colours": colours(checks.clean(str(r)) for r in history.roles),
            "entropy": _curves(history.entropy), "coref": _curves(history.coref),
            "contrastive": [_number(x) for x in history.contrastive],
            "bleu": [_number(x, 2) for x in history.bleu], "role_steps": _role_steps(history),
            "coref_step": None if coref is None else {"module": int(coref[0]),
                                                      "head": int(coref[1]), "step": int(coref[2])},
            "coref_threshold": COREF_THRESHOLD, "uniform_step": None if uniform is None
            else int(uniform), "probes": probes}


def _marks(history: Any) -> list[str]:
    """The page's and the PNG's sentences on the coreference and entropy steps."""
    coref, uniform = history.coref_step(COREF_THRESHOLD), history.uniform_step()
    lines = []
    if coref is not None:
        lines.append(f"{checks.clean(module_head(str(history.modules[coref[0]]), coref[1] + 1))} "
                     f"first resolves {COREF_THRESHOLD:.0%} of the contrastive items at step "
                     f"{coref[2]}")
    elif history.coref is not None:
        lines.append(f"no head resolves {COREF_THRESHOLD:.0%} of the contrastive items")
    lines.append(f"the mean attention entropy leaves uniform at step {uniform}"
                 if uniform is not None else "the mean attention entropy stays near uniform")
    return lines


def png(history: Any, name: str = "") -> bytes:
    """The summary picture: the heads' roles over the steps, then the contrastive accuracy and
    BLEU."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads when drawing
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    steps, n_heads = list(history.steps), history.n_heads
    if not steps:  # a run resumed with recording switched on, killed before its first evaluation
        fig = Figure(figsize=(6.0, 1.2), dpi=90)
        FigureCanvasAgg(fig)
        fig.text(0.5, 0.5, f"{checks.clean(name) + ': ' if name else ''}{NO_RECORDS}", ha="center",
                 va="center")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    rows = [checks.clean(module_head(str(m), h + 1)) for m in history.modules
            for h in range(n_heads)]
    roles, hue = experts(history), colours(history.roles)
    index, value = dominant(history)  # (E, A, H)
    hues = np.array([to_rgb(hue[r]) for r in roles] + [(1.0, 1.0, 1.0)])  # -1: white
    depth = np.clip(value / HOLDS, 0.0, 1.0)[..., None]  # full where the head holds the role
    # (E, A, H, 3): white to the role's colour by its value
    picture = 1.0 - depth * (1.0 - hues[index])
    picture = picture.reshape(len(steps), len(rows), 3).transpose(1, 0, 2)  # (rows, E, 3)
    width = min(16.0, max(8.5, 3.5 + 0.3 * len(steps)))
    tall = 0.24 * min(len(rows), MAX_LABELS)  # inches: past MAX_LABELS rows, the rows are thinner
    fig = Figure(figsize=(width, 2.6 + tall), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, height_ratios=[max(2.0, tall), 1.9])
    top.imshow(picture, aspect="auto", interpolation="nearest")
    rings = np.array([(steps.index(got[1]), m * n_heads + h) for (m, h),
                      got in history.role_step().items() if got is not None
                      and got[1] in steps]).reshape(-1, 2)  # (column, row): one artist
    top.plot(rings[:, 0], rings[:, 1], "o", ls="none", mfc="none", mec="black", ms=7, mew=1.3)
    tick = max(1, len(steps) // 12)
    top.set_xticks(range(0, len(steps), tick), [str(s) for s in steps[::tick]], fontsize=7)
    # a label for every row up to MAX_LABELS rows, else every n-th
    every = max(1, len(rows) // MAX_LABELS)
    top.set_yticks(range(0, len(rows), every), rows[::every], fontsize=7)
    top.set_xlabel("training step", fontsize=8)
    top.set_title(f"each head's strongest role: full colour where it holds it (>= {HOLDS}), paler "
                  "below\n(mono: its alignment's rank correlation); ring: the step from which it "
                  "holds it", fontsize=9)
    top.legend(handles=[Patch(color=hue[r], label=r) for r in roles], fontsize=7, loc="upper left",
               bbox_to_anchor=(1.01, 1.0), frameon=False, title="role", title_fontsize=7)
    _curves_panel(bottom, history)
    if name:
        fig.suptitle(checks.clean(name), fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _curves_panel(ax, history: Any) -> None:
    """The contrastive accuracy (left axis) and BLEU (right axis) over the steps (a column each, as
    the heat map above), the coref and entropy steps."""
    steps, plotted = list(history.steps), []
    x = range(len(steps))
    acc = [np.nan if x is None else x for x in history.contrastive]
    if any(x is not None for x in history.contrastive):
        plotted += ax.plot(x, acc, "o-", ms=3, color="#2f6fb3", label="contrastive accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("accuracy", fontsize=8)
    bleu = [np.nan if x is None else x for x in history.bleu]
    if any(x is not None for x in history.bleu):
        right = ax.twinx()
        plotted += right.plot(x, bleu, "s-", ms=3, color="#d95f02", label="BLEU")
        right.set_ylim(0, max(1.0, np.nanmax(bleu) * 1.1))
        right.set_ylabel("BLEU", fontsize=8)
        right.tick_params(labelsize=7)
    coref, uniform = history.coref_step(COREF_THRESHOLD), history.uniform_step()
    if coref is not None and coref[2] in steps:
        plotted.append(ax.axvline(steps.index(coref[2]), color="#2f6fb3", ls="--", lw=1,
                                  label=f"coref head at {coref[2]}"))
    if uniform is not None and uniform in steps:
        plotted.append(ax.axvline(steps.index(uniform), color="#555", ls=":", lw=1,
                                  label=f"entropy leaves uniform at {uniform}"))
    tick = max(1, len(steps) // 12)
    ax.set_xticks(range(0, len(steps), tick), [str(s) for s in steps[::tick]])
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.tick_params(labelsize=7)
    ax.set_xlabel("training step", fontsize=8)
    if plotted:
        ax.legend(handles=plotted, fontsize=7, loc="upper left", bbox_to_anchor=(1.08, 1.0),
                  frameon=False)


@dataclass
class HistoryView:
    """A run's attention history as a page (`_repr_html_`, `save_html`) and a summary picture
    (`save_png`)."""

    history: Any = field(repr=False)
    name: str = ""  # the run's name or folder, for titles
    # png(), drawn once
    picture: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        h = self.history
        return (f"<HistoryView {self.name!r}: {len(h.steps)} steps, {len(h.modules)} modules x "
                f"{h.n_heads} heads, {len(h.probes)} probes>")

    def png(self) -> bytes:
        if self.picture is None:
            self.picture = png(self.history, self.name)
        return self.picture

    def to_html(self, picture: bytes | None = None) -> str:
        """The page as an HTML fragment: the PNG summary (what shows without scripts), controls,
        maps, curves."""
        from .views import view

        h, e = self.history, html.escape
        if not h.steps:
            title = e(checks.clean(self.name)) + ": " if self.name else ""
            return view("history",
                        f'<h2 class="title">How the heads learned: {title}{NO_RECORDS}</h2>')
        picture = self.png() if picture is None else picture
        last = len(h.steps) - 1
        # "the animal ... tired."
        first = next((i for i, p in enumerate(h.probes) if p.kind == "classic"), 0)
        probes = "".join('<option '
                         f'value="{i}"{" selected" if i == first else ""}'
                         f'>{e(checks.clean(str(p.kind)))}: '
                         f"{e(checks.clean(str(p.source)))}</option>" for i,
                         p in enumerate(h.probes))
        body = ('<h2 class="title">How the heads '
                f'learned{": " + e(checks.clean(self.name)) if self.name else ""}'
                f" ({e(checks.clean(str(h.model_kind)))}, {len(h.steps)} evaluations, steps "
                f"{h.steps[0]} to {h.steps[-1]})</h2>"
                + "".join(f'<p class="hv-mark">{e(line)}</p>' for line in _marks(h))
                + '<div class="hv-controls" hidden><label>probe <select class="hv-probe">'
                f'{probes}</select></label><button type="button" class="hv-play">play</button>'
                f'<label>step <input type="range" class="hv-step" min="0" max="{last}" '
                f'value="{last}" step="1"></label> <span class="hv-at"></span></div>'
                '<img class="hv-static" alt="the heads\' roles over training, the contrastive '
                'accuracy and BLEU" '
                f'src="data:image/png;base64,{base64.b64encode(picture).decode("ascii")}">')
        return view("history", body, "historyView", payload(h), script="historyview.js")

    def _repr_html_(self) -> str:
        return self.to_html()

    def save_html(self, path: str | os.PathLike) -> Path:
        """The page as one file that opens from disk (nothing fetched)."""
        from .views import save_html

        return save_html(self.to_html(), checks.path(path),
                         f"attn-mt history{': ' + self.name if self.name else ''}")

    def save_png(self, path: str | os.PathLike) -> Path:
        """The summary picture as a PNG file, written atomically."""
        from attn_mt.files import write_report

        path = checks.path(path)
        return write_report(path, self.png(), "path")
