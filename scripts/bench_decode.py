"""Translation speed and quality: greedy and beam search, with and without the key/value cache.

All four variants run in one process on the same sentences, round after round, taking turns
in a rotating order; each speed is the median over the rounds. BLEU and chrF (sacrebleu) come
from the first round's outputs, and later rounds must reproduce them exactly. The background
load (os.getloadavg) is recorded before and after every timed run.

    python scripts/bench_decode.py --checkpoint /path/to/checkpoint_best.pt \\
        --src /path/to/multi30k/test2016.de --ref /path/to/multi30k/test2016.en \\
        --out-json docs/bench_decode.json --out-md docs/bench_decode.md
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from attn_mt.checkpoint import load_model
from attn_mt.data.lines import read_lines
from attn_mt.decoding.metrics import score
from attn_mt.decoding.translate import translate
from attn_mt.measure.timing import alternate, timed

VARIANTS = {  # name: (beam size, use the cache)
    "greedy, cache": (1, True),
    "greedy, no cache": (1, False),
    "beam 5, cache": (5, True),
    "beam 5, no cache": (5, False),
}


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    model, cfg, tok = load_model(args.checkpoint, "cpu")
    sources, refs = read_lines(args.src), read_lines(args.ref)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    cfgs = {name: replace(cfg.decode, beam_size=k, nbest=1, batch_size=args.batch_size)
            for name, (k, _) in VARIANTS.items()}
    for name, (_, cache) in VARIANTS.items():  # warm-up: allocator, thread pool, kernels
        translate(model, tok, sources[: args.batch_size], cfgs[name], use_cache=cache)
    names = list(VARIANTS)
    outputs: dict[str, list[str]] = {}
    loads = [load1()]

    def run_variant(name: str) -> None:
        hyps = translate(model, tok, sources, cfgs[name], use_cache=VARIANTS[name][1])
        if outputs.setdefault(name, hyps) != hyps:
            raise RuntimeError(f"{name}: a later round translated differently from round 1")

    seconds = alternate({n: timed(functools.partial(run_variant, n)) for n in names}, args.repeats,
                        after=lambda name, r, seconds: loads.append(load1()))
    rows = {}
    for name in names:
        med = statistics.median(seconds[name])
        cached = name.replace("no cache", "cache")
        s = score(outputs[name], refs)
        rows[name] = {"sentences_per_s": round(len(sources) / med, 2), "median_s": round(med, 2),
                      "seconds": [round(x, 2) for x in seconds[name]], "bleu": s["bleu"],
                      "chrf": s["chrf"], "same_output_as_cached": outputs[name] == outputs[cached]}
    report = {
        "checkpoint": str(args.checkpoint), "src": str(args.src), "sentences": len(sources),
        "batch_size": args.batch_size, "alpha": cfg.decode.alpha, "repeats": args.repeats,
        "rows": rows,
        "speedup_cache_beam5": round(rows["beam 5, cache"]["sentences_per_s"]
                                     / rows["beam 5, no cache"]["sentences_per_s"], 2),
        "speedup_cache_greedy": round(rows["greedy, cache"]["sentences_per_s"]
                                      / rows["greedy, no cache"]["sentences_per_s"], 2),
        "bleu_beam5_minus_greedy": round(rows["beam 5, cache"]["bleu"]
                                         - rows["greedy, cache"]["bleu"], 2),
        "bleu_signature": score(outputs["greedy, cache"], refs)["bleu_signature"],
        "loadavg_1min": {"min": min(loads), "max": max(loads), "all": loads},
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if args.check_batch1:  # the same beam-5 hypotheses translating one sentence at a time
        one = translate(model, tok, sources, replace(cfgs["beam 5, cache"], batch_size=1))
        report["beam5_batch1_differing_lines"] = sum(
            a != b for a, b in zip(one, outputs["beam 5, cache"], strict=True))
    return report


def markdown(r: dict) -> str:
    lines = [f"{r['sentences']} sentences of `{r['src']}`, batch {r['batch_size']}, alpha "
             f"{r['alpha']}, {r['threads']} CPU threads, median of {r['repeats']} rounds; "
             f"load average (1 min) {r['loadavg_1min']['min']}-{r['loadavg_1min']['max']}.",
             "", "| decoding | sentences/s | BLEU | chrF |", "| --- | ---: | ---: | ---: |"]
    for name, row in r["rows"].items():
        lines.append(f"| {name} | {row['sentences_per_s']:.1f} | {row['bleu']:.2f} | "
                     f"{row['chrf']:.2f} |")
    lines += ["", f"Cache speed-up: beam 5 {r['speedup_cache_beam5']:.1f}x, "
              f"greedy {r['speedup_cache_greedy']:.1f}x; beam 5 minus greedy BLEU: "
              f"{r['bleu_beam5_minus_greedy']:+.2f} ({r['bleu_signature']})."]
    if "beam5_batch1_differing_lines" in r:
        lines.append(f"Beam 5 in batches of 1 vs {r['batch_size']}: "
                     f"{r['beam5_batch1_differing_lines']} differing lines.")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--ref", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=0, help="only the first N sentences (0: all)")
    p.add_argument("--check-batch1", action="store_true",
                   help="also compare beam 5 in batches of 1")
    p.add_argument("--out-json", type=Path)
    p.add_argument("--out-md", type=Path)
    args = p.parse_args()
    report = run(args)
    md = markdown(report)
    print(md, end="")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(report, indent=2) + "\n")
    if args.out_md:
        args.out_md.parent.mkdir(parents=True, exist_ok=True)
        args.out_md.write_text(md)


if __name__ == "__main__":
    main()
