"""`attn-mt heads`'s report as an 80-column table, as JSON and as one PNG overview of every head.

Tested in tests/analysis/test_heads.py (the heads command's table and files).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from attn_mt.config.files import check_report, write_report

from .heads import HeadsReport
from .masking import KINDS
from .roles import ROLES

SHARES = ("prev", "same", "next", "rare", "eos", "punct")  # where a head's weight goes; conf and mono apart


def _cell(value: float | None, width: int = 6) -> str:
    return f"{'-' if value is None else f'{value:.2f}':>{width}}"


def table(report: HeadsReport) -> str:
    """Every head's importance and roles, one line each, then the pruning (80 columns)."""
    lines = [f"BLEU {report.bleu:.2f} (greedy), loss {report.loss:.4f} on {report.sentences} sentences; "
             f"{report.seconds_per_head:.1f} s per head",
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
        lines += ["", f"pruned {len(report.pruned)} heads, each the one whose masking raised the loss least:"]
        lines += [f"{i:>4}. {p['head']:<12} BLEU {p['bleu']:6.2f}  loss {p['loss']:.4f}"
                  for i, p in enumerate(report.pruned, 1)]
        lines += [f"BLEU {report.bleu:.2f} -> {report.bleu_after:.2f}, loss {report.loss:.4f} -> "
                  f"{report.loss_after:.4f}; wrote {report.out}",
                  "(same shapes: the pruned heads' rows of W_q, W_k, W_v and columns of W_o are 0)"]
    return "\n".join(lines)


def coref_lines(report: HeadsReport, best: int = 5) -> list[str]:
    """The coreference part: the contrastive accuracy, the best resolving heads (their weights on the
    antecedent and the other noun, the accuracy masking each costs), the top heads masked together."""
    c = report.coref
    lines = [f"contrastive accuracy {report.contrastive:.2%} on {c['items']} items ({c['located']} located)"]
    ranked = sorted((r for r in report.heads if r.get("coref")), key=lambda r: -r["coref"]["resolved"])[:best]
    if ranked:
        lines.append(f"{'best resolving':<15}{'coref':>7}{'antecedent':>12}{'other':>8}{'dacc masked':>13}")
        lines += [f"{r['kind'] + ' ' + str(r['layer']) + '.' + str(r['head']):<15}{r['coref']['resolved']:>7.2%}"
                  f"{r['coref']['antecedent']:>12.3f}{r['coref']['other']:>8.3f}{r['d_contrastive']:>+13.2%}"
                  for r in ranked]
    if c["top"]:
        lines.append("the best resolving heads of a kind masked together: accuracy (change)")
        lines += [f"{t['contrastive']:>9.2%} ({t['d_contrastive']:+.2%})  {', '.join(t['heads'])}" for t in c["top"]]
    return lines


def save(report: HeadsReport, json_path: Path | None = None, png_path: Path | None = None) -> list[Path]:
    """Write the report as JSON and draw it as a PNG, each where a path is given; returns the files written."""
    for option, path in (("json", json_path), ("png", png_path)):  # neither written if one cannot be
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
    """One PNG: a layer x head grid per kind, coloured by the BLEU change when the head is masked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads when drawing (0.75 s)
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
        ax.set_title({"encoder": "encoder self", "decoder": "decoder self", "cross": "cross"}[kind], fontsize=9)
        ax.set_xticks(range(heads), [f"head {h + 1}" for h in range(heads)], fontsize=7)
        ax.set_yticks(range(layers), [f"layer {i + 1}" for i in range(layers)], fontsize=7)
    fig.colorbar(img, ax=list(axes), shrink=0.8, label="BLEU change, head masked")
    fig.suptitle(f"heads of {Path(report.checkpoint).name}: BLEU {report.bleu:.2f} on {report.sentences} "
                 "sentences (greedy)", fontsize=10)
    return write_report(path, lambda f: fig.savefig(f, format="png", dpi=110), "png")
