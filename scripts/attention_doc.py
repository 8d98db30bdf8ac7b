"""docs/attention.md from a trained model: what attention computes, its five steps walked through
with the numbers of `attn-mt explain`, then what `attn-mt heads` finds (positional heads, aligning
cross heads, how many heads can go for less than 0.5 BLEU); scripts/pronoun_doc.py's section stays
between the two.

    python scripts/attention_doc.py --checkpoint RUN/checkpoint_best.pt \
        --src /path/to/multi30k/valid.de \
        --ref /path/to/multi30k/valid.en --prune 18 --trained "how the model was trained" \
        --out docs/attention.md --png docs/attention_heads.png
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

import attn_mt
from attn_mt.analysis import overview
from attn_mt.analysis.explanation import NAMES, render
from attn_mt.analysis.overview import HeadsReport
from attn_mt.checkpoint import load
from attn_mt.data.lines import read_lines
from attn_mt.device import describe, pick_device

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pronoun_doc import BEFORE, BEGIN, END, insert  # noqa: E402 - a script beside this one

POSITIONAL, ALIGNED, PARKED, CLOSE = 0.5, 0.5, 0.5, 0.5  # share, rank correlation, share, BLEU


def placeholder(path: Path) -> str:
    """A path as the doc shows it: never this machine's folders."""
    return f"/path/to/{Path(path).name}"


def named(rows: list[dict], test, what) -> list[str]:
    return [f"{r['kind']} {r['layer']}.{r['head']} ({what(r)})" for r in rows if test(r)]


def findings(report: HeadsReport) -> list[str]:
    """What the heads do, in sentences with the numbers."""
    rows, out = report.heads, []
    for role, where in (("prev", "the previous token"), ("same", "their own token"),
                        ("next", "the next token")):
        found = named(rows, lambda r, role=role: (r["roles"][role] or 0) >= POSITIONAL,
                      lambda r, role=role: f"{role} {r['roles'][role]:.2f}")
        out.append(f"- **Positional, {where}** (at least {POSITIONAL:.0%} of their weight): "
                   + (", ".join(found) if found else "none"))
    aligned = named(rows, lambda r: (r["roles"]["mono"] or 0) >= ALIGNED,
                    lambda r: f"mono {r['roles']['mono']:.2f}")
    cross = [r for r in rows if r["kind"] == "cross"]
    best = max(cross, key=lambda r: r["roles"]["mono"])
    out.append("- **Cross-attention heads that align** (rank correlation of their argmax source "
               f"position with the target position at least {ALIGNED}): "
               f"{', '.join(aligned) if aligned else 'none'}; the most monotone is cross "
               f"{best['layer']}.{best['head']} ({best['roles']['mono']:.2f}).")
    parked = named(rows, lambda r: (r["roles"]["eos"] or 0) >= PARKED,
                   lambda r: f"eos {r['roles']['eos']:.2f}")
    out.append("- **Parked on the sentence boundary** (eos of the source, bos of the decoder "
               f"input, at least {PARKED:.0%}): {', '.join(parked) if parked else 'none'}.")
    rare = max(rows, key=lambda r: r["roles"]["rare"] or 0)
    out.append(f"- **The rarest token** gets the most weight from {rare['kind']} "
               f"{rare['layer']}.{rare['head']} ({rare['roles']['rare']:.2f} of it).")
    top = sorted(rows, key=lambda r: (r["d_bleu"], -r["d_loss"]))[:3]
    out.append("- **The most important heads** (BLEU when masked alone): " + ", ".join(
        f"{r['kind']} {r['layer']}.{r['head']} ({r['d_bleu']:+.2f} BLEU, {r['d_loss']:+.3f} loss)"
        for r in top)
        + f"; {sum(r['d_bleu'] >= 0 for r in rows)} of {len(rows)} heads cost no BLEU alone.")
    return out


def can_go(report: HeadsReport) -> int:
    """How many heads the greedy pruning removed before BLEU first fell by CLOSE or more."""
    for k, step in enumerate(report.pruned):
        if report.bleu - step["bleu"] >= CLOSE:
            return k
    return len(report.pruned)


INTRO = (
    "Attention lets each position, a *query*, gather information from other positions, the *keys* "
    "(of the same sentence in self-attention, of the source in cross-attention), in five steps: "
    "project the query's vector to q and every key's vector to k and v, score each key by q . k, "
    "divide the scores by sqrt(d_k), mask and softmax them into weights that sum to 1, and sum the "
    "values v with those weights: softmax(q K^T / sqrt(d_k)) V, the function `attention()` in "
    "attn_mt/models/attention.py. Each head does this with its own slice of d_k columns, and W_o "
    "mixes the heads' outputs. This page first walks one head of a trained model through the five "
    "steps with the model's own numbers (`attn-mt explain`), then shows what the heads do: which "
    "ones resolve *it* in \"the animal didn't cross the street because it was too tired\", each "
    "head's role and cost on Multi30k, and how many can go.")


def counting(e) -> str:
    """How positions, layers and heads are counted and a decoder query named, on the example's
    query."""
    word = e.query_token.lstrip("\u2581")
    same = (f": `--token {word}` and `--token {e.query_index}` pick the same query below"
            if word and e.target_tokens.index(e.query_token) == e.query_index else "")
    return ("**Counting.** Layers and heads count from 1 (*cross 3.3* is cross-attention, layer 3, "
            "head 3), positions from 0. An encoder query is a source token. A decoder query at "
            "position t reads token t of the decoder input (`<s>`, then the translation) and "
            "predicts token t of the translation; `attn-mt explain` names it by the token it "
            f"predicts, as the rows of the attention maps are{same}.")


def the_query(e) -> str:
    """The query in words: a source token, or the position that predicts a token, whose input is the
    one before (the *same* position in roles.py's words)."""
    if e.kind == "encoder_self":
        return f"query {e.query_index}, the source token {e.query_token!r}"
    return (f"query {e.query_index}, the position that predicts {e.query_token!r} (its input there "
            f"is the token before, {e.query_input!r}: a head that looks at it looks at the *same* "
            "position)")


def walk(e, command: str) -> list[str]:
    """The five steps in prose, with the numbers of one explanation."""
    keys = [k for k in e.keys if not k.masked]
    top = max(keys, key=lambda k: k.weight)
    biggest = max(keys, key=lambda k: k.score)
    contrib = sorted(keys, key=lambda k: -k.contribution)[:3]
    q_norm = sum(x * x for x in e.q) ** 0.5
    return [
        f"The sentence *{e.source}* translates as *{e.translation}*. We follow {NAMES[e.kind]}, "
        f"layer {e.layer}, head {e.head}, for {the_query(e)}. The model has d_model = {e.d_model} "
        f"split into {e.n_heads} heads of d_k = {e.d_k}.",
        "",
        f"1. **Q, K, V.** The query's input x ({e.d_model} numbers) times W_q gives this head's "
        f"q = [{', '.join(f'{x:+.3f}' for x in e.q[:4])}, ...] (norm {q_norm:.3f}); every key "
        f"token j gets k_j = c_j W_k and v_j = c_j W_v from its own vector c_j.",
        f"2. **Scores.** q . k_j for each of the {len(e.keys)} keys: the highest is "
        f"{biggest.score:.3f} for {biggest.token!r}.",
        f"3. **Divided by sqrt(d_k) = {e.d_k ** 0.5:.3g}**: {biggest.score:.3f} becomes "
        f"{biggest.scaled:.3f}.", "4. **Softmax** (masked keys first: "
        f"{sum(k.masked for k in e.keys)} here) turns the scaled scores into weights that sum to "
        f"1: {top.token!r} gets {top.weight:.3f}.",
        "5. **Weighted sum of the values.** The largest contributions |w_j v_j|: " + ", ".join(
            f"{k.token!r} {k.contribution:.3f}" for k in contrib) + ".",
        "",
        f"The {e.n_heads} heads' outputs ({e.n_heads} x {e.d_k} numbers) are concatenated and "
        "projected by W_o; recomputed this way from the weights, the output differs from the "
        f"model's own by at most {e.max_abs_diff:.1e}.",
        "",
        "```text",
        f"$ {command}",
        render(e),
        "```",
    ]


def document(args, report: HeadsReport, explanations: list, png: str | None) -> str:
    state = load(args.checkpoint)
    cfg = state["config"]["model"]
    command = " ".join(["python scripts/attention_doc.py", "--checkpoint",
                        placeholder(args.checkpoint), "--src", placeholder(args.src), "--ref",
                        placeholder(args.ref), "--sentences", str(args.sentences), "--prune",
                        str(args.prune)])
    lines = [
        "# Attention, step by step, on a trained model",
        "",
        f"<!-- generated by `{command}`; edit scripts/attention_doc.py, not this file -->",
        "",
        INTRO,
        "",
        f"The model: a Transformer of {cfg['n_layers']} encoder and {cfg['n_layers']} decoder "
        f"layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, at step "
        f"{state.get('step', '?')}; {args.trained or 'trained with its config'}. BLEU here is "
        f"greedy on the first {report.sentences} lines of {Path(args.src).name} / "
        f"{Path(args.ref).name} (BLEU {report.bleu:.2f}, loss {report.loss:.4f}).",
        "",
        "## One head, one query: the five steps (`attn-mt explain`)",
        "",
        counting(explanations[0]),
        "",
    ]
    why = ["The cross-attention head whose alignment is the most monotone (see below):",
           "The decoder self-attention head that looks at the previous token most; here the mask "
           "hides the future:"]
    for e, intro in zip(explanations, why, strict=True):
        cmd = (f"attn-mt explain --checkpoint {placeholder(args.checkpoint)} \"{e.source}\" --kind "
               f"{e.kind.split('_')[0]} --layer {e.layer} --head {e.head} --token {e.query_index}")
        lines += [intro, "", *walk(e, cmd), ""]
    lines += [f"{BEFORE} (`attn-mt heads`)", "",
              f"Each of the {len(report.heads)} heads masked alone ({report.seconds_per_head:.1f} "
              f"s per head, {report.seconds:.0f} s in all with the pruning below, on "
              f"{args.machine}):", "", *findings(report), ""]
    if png:
        lines += [f"![every head: BLEU change when masked, its main role]({png})", ""]
    lines += ["```text", f"$ attn-mt heads --checkpoint {placeholder(args.checkpoint)} --src "
              f"{placeholder(args.src)} --ref {placeholder(args.ref)} --sentences {args.sentences} "
              f"--prune {args.prune} --out pruned.pt", overview.table(report), "```", ""]
    if report.pruned:
        k = can_go(report)
        lines += ["## How many heads can go", "",
                  "Removing heads greedily (each time the one whose masking raises the loss least, "
                  f"re-measured after every removal), **{k} of {len(report.heads)} heads can go "
                  f"for less than {CLOSE} BLEU** ({report.bleu:.2f} -> "
                  f"{report.pruned[k - 1]['bleu'] if k else report.bleu:.2f})"
                  + (f"; the next removal, {report.pruned[k]['head']}, costs "
                     f"{report.bleu - report.pruned[k]['bleu']:.2f}." if k < len(report.pruned) else
                     f", and all {len(report.pruned)} removals tried stayed within it."),
                  "Pruning zeroes the heads' rows of W_q, W_k, W_v and columns of W_o: the "
                  "checkpoint keeps its shapes (and its speed), and translate, evaluate, serve and "
                  "both exporters take it.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--ref", type=Path, required=True)
    p.add_argument("--sentence", help="The sentence to explain (default: the first line of --src).")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--prune", type=int, default=18)
    p.add_argument("--trained", default="", help="How the model was trained, for the doc.")
    p.add_argument("--machine", default="", help="The machine, for the doc (default: its CPU and "
                   "cores).")
    p.add_argument("--out", type=Path, default=Path("docs/attention.md"))
    p.add_argument("--png", type=Path, help="Also draw the heads' overview here (linked by its "
                   "name).")
    p.add_argument("--json", type=Path, help="Write the heads report and the explanations here.")
    args = p.parse_args(argv)
    args.machine = args.machine or f"{describe(pick_device('cpu'))}, torch {torch.__version__}"
    model = attn_mt.load(args.checkpoint, device="cpu")
    report = (model.prune(args.prune, args.src, args.ref, sentences=args.sentences).report
              if args.prune else model.heads(args.src, args.ref, sentences=args.sentences))
    report.out = "pruned.pt" if args.prune else None  # not written: the doc names what it would be
    sentence = args.sentence or read_lines(args.src)[0]
    cross = max((r for r in report.heads if r["kind"] == "cross"), key=lambda r: r["roles"]["mono"])
    previous = max((r for r in report.heads if r["kind"] == "decoder"),
                   key=lambda r: r["roles"]["prev"])
    first = model.explain(sentence, kind="cross", layer=cross["layer"], head=cross["head"])
    # a query inside the sentence: the decoder self-attention's mask shows
    middle = len(first.target_tokens) // 2
    explanations = [model.explain(sentence, kind="cross", layer=cross["layer"], head=cross["head"],
                                  token=middle),
                    model.explain(sentence, kind="decoder", layer=previous["layer"],
                                  head=previous["head"], token=middle)]
    png = overview.plot(report, args.png).name if args.png else None
    page = document(args, report, explanations, png)
    old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    # the pronoun section (scripts/pronoun_doc.py) stays after the five steps
    if BEGIN in old and END in old:
        page = insert(page, old[old.index(BEGIN) : old.index(END) + len(END)])
    args.out.write_text(page, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps({"heads": asdict(report),
                                         "explain": [asdict(e) for e in explanations]},
                                        indent=1) + "\n", encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
