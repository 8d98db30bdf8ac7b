"""Decoding speed side by side: ours (PyTorch, cached greedy and beam search, fp32 and bf16),
PyTorch's dynamic int8 quantization of ours, and CTranslate2 exports in float32 and int8, with BLEU
for each.

One process, alternated rounds (the order rotates every round), medians; every decoder gets the same
threads (torch and CTranslate2 intra_threads, one inter thread) and the same batch size.

    python scripts/bench_export.py --checkpoint /path/to/run/checkpoint_best.pt \
        --src /path/to/multi30k/test2016.de --ref /path/to/multi30k/test2016.en --json
        docs/export_speed.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from attn_mt.checkpoint import load_model
from attn_mt.data.lines import read_lines
from attn_mt.decoding.metrics import bleu
from attn_mt.decoding.translate import translate
from attn_mt.device import autocast, describe, machine
from attn_mt.export.ctranslate2 import export_ct2
from attn_mt.imports import ct2_translator as ct2
from attn_mt.measure.timing import alternate, timed


def decoders(checkpoint: Path, tmp: Path, threads: int) -> tuple[dict, object]:
    """name -> fn(texts, dcfg) -> best translations; and the checkpoint's decode config."""
    cpu = torch.device("cpu")
    model, cfg, tok = load_model(checkpoint, cpu)
    quantized = torch.ao.quantization.quantize_dynamic(load_model(checkpoint, cpu)[0],
                                                       {torch.nn.Linear}, dtype=torch.qint8)

    def ours(m, precision):
        def run(texts, dcfg):
            with autocast(cpu, precision):
                return translate(m, tok, texts, dcfg, cpu)
        return run

    out = {"ours fp32": ours(model, "fp32"), "ours bf16": ours(model, "bf16"),
           "torch dynamic int8": ours(quantized, "fp32")}
    for quantization in ("float32", "int8"):
        export_ct2(checkpoint, tmp / quantization, quantization)
        exported = ct2.load_exported(tmp / quantization, "cpu", threads=threads)
        out[f"ctranslate2 {quantization}"] = (lambda texts, dcfg,
                                              e=exported: ct2.translate(e, texts, dcfg))
    return out, cfg.decode


def timed_rounds(runs: dict, texts: list[str], rounds: int) -> tuple[dict, dict]:
    """Seconds per round of every run, in rotating order, and each run's last outputs."""
    names = list(runs)
    for name in names:  # warm-up: allocators, thread pools, lazy initialisation
        runs[name](texts[:64])
    outputs: dict[str, list[str]] = {}

    def run(name: str) -> None:
        outputs[name] = runs[name](texts)

    def show(name: str, r: int, seconds: float) -> None:
        print(f"round {r + 1}/{rounds}  {name:32s} {seconds:7.2f} s", file=sys.stderr, flush=True)

    seconds = alternate({n: timed(functools.partial(run, n)) for n in names}, rounds, after=show)
    return seconds, outputs


def rows(seconds: dict, outputs: dict, refs: list[str]) -> list[dict]:
    """One row per run: median sentences/s, BLEU, ratios and agreement with ours fp32 of the same
    search."""
    n, out = len(refs), []
    for name, secs in seconds.items():
        decoder, search = name.rsplit(" | ", 1)
        base = f"ours fp32 | {search}"
        med = statistics.median(secs)
        same = sum(a == b for a, b in zip(outputs[name], outputs[base], strict=True))
        out.append({"decoder": decoder, "search": search, "median_s": round(med, 3),
                    "sentences_per_s": round(n / med, 1), "bleu": bleu(outputs[name], refs),
                    "x_ours_fp32": round(statistics.median(seconds[base]) / med, 2),
                    "same_as_ours_fp32": round(100 * same / n, 1),
                    "seconds": [round(s, 3) for s in secs]})
    return out


def table(result: dict) -> str:
    lines = ["| decoder | search | sentences/s | x ours fp32 | BLEU | same lines as ours fp32 |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['decoder']} | {r['search']} | {r['sentences_per_s']:.1f} | "
              f"{r['x_ours_fp32']:.2f} | {r['bleu']:.2f} | {r['same_as_ours_fp32']:.1f}% |"
              for r in result["rows"]]
    return "\n".join(lines)


def summary(result: dict) -> dict:
    """The issue's targets: CTranslate2 int8 beam against our faster cached beam; float32
    equality."""
    by = {(r["decoder"], r["search"]): r for r in result["rows"]}
    beam = f"beam {result['beam_size']}"
    ours = max((by[("ours fp32", beam)], by[("ours bf16", beam)]),
               key=lambda r: r["sentences_per_s"])
    fast = by[("ctranslate2 int8", beam)]
    return {"ct2_int8_beam_speedup_vs_our_best_beam": round(fast["sentences_per_s"]
                                                            / ours["sentences_per_s"], 2),
            "our_best_beam": ours["decoder"],
            "ct2_int8_beam_bleu_minus_ours": round(fast["bleu"] - ours["bleu"], 2),
            "ct2_float32_greedy_same_lines_pct": by[("ctranslate2 float32",
                                                     "greedy")]["same_as_ours_fp32"],
            "ct2_float32_beam_bleu_minus_ours_fp32": round(by[("ctranslate2 float32", beam)]["bleu"]
                                                           - by[("ours fp32", beam)]["bleu"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--ref", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts, refs = read_lines(args.src), read_lines(args.ref)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        runners, dcfg = decoders(args.checkpoint, Path(tmp), args.threads)
        searches = {"greedy": replace(dcfg, beam_size=1, nbest=1, batch_size=args.batch_size),
                    f"beam {args.beam}": replace(dcfg, beam_size=args.beam, nbest=1,
                                                 batch_size=args.batch_size)}
        runs = {f"{name} | {search}": (lambda t, fn=fn, d=d: fn(t, d))
                for search, d in searches.items() for name, fn in runners.items()}
        seconds, outputs = timed_rounds(runs, texts, args.rounds)
    result = {"command": "python scripts/bench_export.py " + " ".join(sys.argv[1:]),
              "sentences": len(texts), "batch_size": args.batch_size, "beam_size": args.beam,
              "alpha": dcfg.alpha, "rounds": args.rounds,
              "threads": {"torch": torch.get_num_threads(), "ctranslate2_intra": args.threads,
                          "ctranslate2_inter": 1},
              "machine": {**machine(torch.device("cpu")),
                          "described": describe(torch.device("cpu")),
                          "ctranslate2": __import__("ctranslate2").__version__},
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "rows": rows(seconds, outputs, refs)}
    result["summary"] = summary(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
