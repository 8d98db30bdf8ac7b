"""compare-rnn's report: report.json (every number), report.md (tables, and a verdict only where the
measurement can be trusted) and two PNG plots.

Tested in tests/measure/test_compare.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from attn_mt.files import write_atomic
from attn_mt.measure.timing import NOISY_SPREAD

# report["trust"]["clock"] -> how the text names it
CLOCK_WORDS = {"wall": "wall-clock", "cpu": "CPU"}


def _table(head: list[str], rows: list[list]) -> str:
    cells = [head, ["---"] * len(head), *[["" if v is None else str(v) for v in r] for r in rows]]
    return "\n".join("| " + " | ".join(r) + " |" for r in cells)


def tables(report: dict) -> dict[str, str]:
    """The four markdown tables of the report: a throughput, b quality, c length, d decoding."""
    m = report["models"]
    names = list(m)
    beam = report["decode"]["beam_size"]
    a = _table(["model", "parameters", "target tokens/s", "s/epoch", "peak memory (MB)", "steps",
                "epochs"],
               [[k, f"{v['params'] / 1e6:.2f}M", f"{v['train_tokens_per_s']:,.0f}",
                 v["seconds_per_epoch"], v["peak_memory_mb"], v["steps"], v["epochs"]] for k,
                v in m.items()])
    test_beam = m[names[0]]["test_beam_size"]
    b = _table(["model", "training time (s)", "best valid BLEU", f"test BLEU (beam {test_beam})",
                "test chrF", "valid BLEU along the way (s: BLEU)"],
               [[k, v["train_seconds"], v["best_valid_bleu"], v["test_bleu"], v["test_chrf"],
                 ", ".join(f"{p['elapsed_s']:.0f}: {p['valid_bleu']:.1f}" for p in v["curve"])]
                for k, v in m.items()])
    rows = []
    for r in report["length_scaling"]:
        t, n = r.get("transformer_ms"), r.get("rnn_ms")
        rows.append([r["length"], r["batch_size"], t, n, f"{n / t:.1f}x" if t and n else None,
                     r["transformer_sequential_steps"], r["rnn_sequential_steps"],
                     r.get("transformer_mb"), r.get("rnn_mb")])
    c = _table(["length n", "sentences/batch", "Transformer ms", "RNN ms", "RNN / Transformer",
                "sequential steps/layer: Transformer", "RNN", "activations MB: Transformer", "RNN"],
               rows)
    d = _table(["model", "greedy sentences/s", f"beam {beam} sentences/s", "greedy decoder steps",
                "output tokens", "encoder sequential steps/layer"],
               [[k, v["greedy_sentences_per_s"], v["beam_sentences_per_s"],
                 v["greedy_decoder_calls"], v["greedy_output_tokens"],
                 v["encoder_sequential_steps_per_layer"]] for k, v in m.items()])
    out = {"a": a, "b": b, "c": c, "d": d}
    if all("contrastive" in v for v in m.values()):
        bins = m[names[0]]["contrastive"]["by_distance"]  # the same items for both models
        out["e"] = _table(["model", "contrastive accuracy",
                           *(f"distance {b} ({v['items']})" for b, v in bins.items())],
                          [[k, f"{v['contrastive']['accuracy']:.1%}",
                            *(f"{v['contrastive']['by_distance'].get(b, {}).get('accuracy', 0):.1%}"
                              for b in bins)]
                           for k, v in m.items()])
    return out


def _machine_lines(report: dict) -> list[str]:
    mc = report["machine"]
    lines = [f"Machine: {mc['device_name']} ({mc['device']}), {mc['threads']} torch threads of "
             f"{mc['cpu_count']} CPUs, torch {mc['torch']}, precision {mc['precision']}."]
    if report.get("trust", {}).get("clock") == "cpu":
        lines.append("Clock: this process's CPU seconds per torch thread (compare.clock=cpu), for "
                     "the budgets and every timing: other processes do not shorten them.")
    for phase, load in report["background_load"].items():
        own = f"; this process used {load['own_cores']} cores" if "own_cores" in load else ""
        lines.append(f"Background load during {phase.replace('_', ' ')} ({load['seconds']:.0f} s "
                     f"wall): {load['background_cores']} cores busy with other processes on "
                     f"average{own} (1-min load average {load['loadavg_1min_start']:.2f} -> "
                     f"{load['loadavg_1min_end']:.2f}).")
    return lines


def _growth(report: dict) -> str:
    """How the time per batch grew from the shortest to the longest length both models ran, or why
    it is not told (a noisy row)."""
    names = list(report["models"])
    rows = [r for r in report["length_scaling"] if all(r.get(f"{k}_ms") for k in names)]
    if len(rows) < 2:
        return ""
    first, last = rows[0], rows[-1]
    noisy = [f"n = {r['length']} ({k})" for r in (first, last) for k in names
             if (r.get(f"{k}_spread") or 0) > NOISY_SPREAD]
    if noisy:
        return (f" No conclusion on length: the rounds of {', '.join(noisy)} spread more than "
                f"{NOISY_SPREAD:.0%}.")
    grew = " against ".join(f"x{last[f'{k}_ms'] / first[f'{k}_ms']:.2f} ({k})" for k in names)
    ratio = [r[f"{names[-1]}_ms"] / r[f"{names[0]}_ms"] for r in (first, last)]
    return (f" From n = {first['length']} to {last['length']} the time per batch grew {grew}; "
            f"{names[-1]} / {names[0]}: {ratio[0]:.1f}x -> {ratio[1]:.1f}x.")


def _noisy(report: dict) -> str:
    noisy = report.get("trust", {}).get("noisy")
    return f" Noisy (rounds spread over {NOISY_SPREAD:.0%}): {'; '.join(noisy)}." if noisy else ""


def verdict(report: dict) -> str:
    """What the report concludes, or, where the load leaves the measurement untrusted, why it
    concludes nothing (empty for a report without `trust`)."""
    t = report.get("trust")
    if t is None:
        return ""
    if not t["trusted"]:
        fix = ("a quieter machine, or compare.clock=cpu with train.threads=1"
               if t["clock"] == "wall" else "train.threads=1" if t["threads"] > 1
               else "a quieter machine")
        return ("**No conclusions: the machine's load leaves this measurement untrusted** "
                f"({'; '.join(t['reasons'])}). The numbers below are as measured; rerun with "
                f"{fix}.")
    m = report["models"]
    bleu = " against ".join(f"{v['test_bleu']:.1f} ({k})" for k, v in m.items())
    return (f"**Verdict:** for the same {report['budget_minutes']} min of training "
            f"({CLOCK_WORDS[t['clock']]} clock), test BLEU {bleu}.{_growth(report)}")


def markdown(report: dict) -> str:
    t = tables(report)
    dec = report["decode"]
    return "\n\n".join([
        "# compare-rnn report", "\n".join(_machine_lines(report)),
        *([v] if (v := verdict(report)) else []), "## a. Training throughput\n\nSame batches for "
        f"both models ({report['batch_tokens']} padded tokens per batch). Peak memory: "
        f"{report['memory_method']}.\n\n{t['a']}",
        f"## b. Quality for an equal training-time budget ({report['budget_minutes']} min "
        "each)\n\nValidation BLEU is greedy on the first sentences of the validation split; the "
        "clock counts each model's own training steps only. Test BLEU uses the best validation "
        f"checkpoint. ({report['sacrebleu_signature']})\n\n{t['b']}\n\n![BLEU against training "
        "time](bleu_vs_time.png)", "## c. Cost against sentence length\n\nForward + backward time "
        f"per batch of {report['compare']['length_batch_tokens']} tokens of random ids, median of "
        f"{report['compare']['repeats']} alternated rounds (outliers dropped), on the models "
        f"before training.{_noisy(report)}\n\n{t['c']}\n\n![time per batch against "
        "length](time_vs_length.png)", f"## d. Decoding\n\n{dec['sentences']} test sentences, "
        f"batches of {dec['batch_size']}, median of {report['compare']['decode_repeats']} "
        "alternated rounds. Both decoders need one sequential step per output token; the RNN "
        f"encoder also steps through the source.\n\n{t['d']}",
        *(["## e. Pronouns by antecedent distance\n\nThe test split's contrastive set: an item is "
           "right when the model scores the reference above every variant with another pronoun; "
           "distance in words from the antecedent to the pronoun (items per bin in the "
           f"header).\n\n{t['e']}"] if "e" in t else []),
    ]) + "\n"


def summary(report: dict) -> str:
    """The plain-text summary printed at the end of compare-rnn."""
    m = report["models"]
    rows = [("", *m), ("parameters", *(f"{v['params'] / 1e6:.2f}M" for v in m.values())),
            ("train tokens/s", *(f"{v['train_tokens_per_s']:,.0f}" for v in m.values())),
            ("s/epoch", *(str(v["seconds_per_epoch"]) for v in m.values())),
            ("peak memory MB", *(str(v["peak_memory_mb"]) for v in m.values())),
            ("best valid BLEU", *(str(v["best_valid_bleu"]) for v in m.values())),
            ("test BLEU", *(str(v["test_bleu"]) for v in m.values())),
            *([("contrastive acc", *(f"{v['contrastive']['accuracy']:.1%}" for v in m.values()))]
              if all("contrastive" in v for v in m.values()) else []),
            ("greedy sent/s", *(str(v["greedy_sentences_per_s"]) for v in m.values())),
            ("beam sent/s", *(str(v["beam_sentences_per_s"]) for v in m.values()))]
    rows += [(f"ms/batch n={r['length']}", str(r.get("transformer_ms")), str(r.get("rnn_ms")))
             for r in report["length_scaling"]]
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, width, strict=True))) for r in rows]
    return "\n".join([*lines, *_machine_lines(report), *([v.replace("**", "")]
                                                         if (v := verdict(report)) else [])])


def plots(report: dict, out_dir: Path) -> list[Path]:
    """bleu_vs_time.png and time_vs_length.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, NullLocator, ScalarFormatter

    colors = {"transformer": "tab:blue", "rnn": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, v in report["models"].items():
        ax.plot([p["elapsed_s"] / 60 for p in v["curve"]], [p["valid_bleu"] for p in v["curve"]],
                "o-", color=colors.get(k), label=f"{k} ({v['params'] / 1e6:.2f}M parameters)")
    ax.set(xlabel="training time on the model's own clock (min)", ylabel="validation BLEU (greedy)",
           title="Quality for the same training time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths = [out_dir / "bleu_vs_time.png", out_dir / "time_vs_length.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    rows = report["length_scaling"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for k in report["models"]:
        pts = [(r["length"], r[f"{k}_ms"], r.get(f"{k}_mb")) for r in rows if r.get(f"{k}_ms")]
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors.get(k), label=k)
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], "o-", color=colors.get(k), label=k)
    tokens = report["compare"]["length_batch_tokens"]
    ax1.set(yscale="log", ylabel="ms per batch", title=f"forward + backward, {tokens} tokens per "
            "batch")
    ax2.set(ylabel="MB saved for backward", title="activation memory per batch")
    ax1.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax1.yaxis.set_major_formatter(ScalarFormatter())
    ax1.yaxis.set_minor_formatter(NullFormatter())
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["length"] for r in rows], [str(r["length"]) for r in rows])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("sentence length n (tokens)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def write_report(report: dict, out_dir: Path) -> None:
    write_atomic(out_dir / "report.json", json.dumps(report, indent=2) + "\n")
    write_atomic(out_dir / "report.md", markdown(report))
    plots(report, out_dir)
