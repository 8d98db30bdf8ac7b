"""Per-token training cost of speedrun recipes against a reference recipe, in one run
(docs/speedrun.md).

Every recipe is the config with its `--set`-style overrides; all train on the same batches with the
trainer's own step (optimizer included), taking turns round after round; figures are medians after a
warm-up round, and each recipe's cost is its seconds per target token over the first recipe's (the
reference), per precision.

    python scripts/speedrun_cost.py --config configs/speedrun.yaml \\
        --set data.dir=/path/to/multi30k \\
        --recipe "old:train.optimizer=adamw,train.schedule=inverse_sqrt" --recipe "new:" --threads 1
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch

from attn_mt.config import load_config
from attn_mt.data.batching import token_batches
from attn_mt.device import describe, precisions_for
from attn_mt.files import write_atomic
from attn_mt.measure.bench import Variant, build
from attn_mt.measure.prelude import prelude
from attn_mt.measure.timing import alternate


def parse_recipe(text: str) -> tuple[str, list[str]]:
    """"name:key=value,key=value" -> (name, ["key=value", ...])."""
    name, _, sets = text.partition(":")
    return name, [s for s in sets.split(",") if s]


def measure(config: str, sets: list[str], recipes: list[tuple[str, list[str]]], *, steps: int,
            repeats: int, threads: int) -> dict:
    base = load_config(config, [*sets, f"train.threads={threads}"])
    start = prelude(base, base.model.max_positions, "configs/toy.yaml")
    corpus, device, tc = start.corpus, start.device, base.train
    split = base.data.splits.train
    index = token_batches(*corpus.lengths(split), tc.batch_tokens, tc.seed, 0)
    fns, precisions, sources = {}, precisions_for(device), {}
    for name, overrides in recipes:
        cfg = load_config(config, [*sets, f"train.threads={threads}", *overrides])
        # the same pairs for every recipe; their sources split anew where the recipe samples
        # subwords
        batches = [b.to(device) for b in corpus.batches(split, index[:steps],
                                                        cfg.train.subword_sampling,
                                                        (tc.seed, 0, 0))]
        tokens = sum(b.n_tokens for b in batches)  # target tokens: the same for every recipe
        sources[name] = sum(int((b.src != corpus.tok.pad_id).sum()) for b in batches)
        for p in precisions:
            variant = Variant(name, build("ours", cfg, corpus.tok, device), p, cfg, device)
            fns[f"{name}/{p}"] = functools.partial(variant.run, batches)
    times = alternate(fns, repeats, warmup=True)
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    ref = recipes[0][0]
    rows = [{"recipe": name, "precision": p, "tokens_per_s": tokens / med[f"{name}/{p}"],
             "cost_vs_reference": med[f"{name}/{p}"] / med[f"{ref}/{p}"],
             "source_tokens_per_round": sources[name]}
            for name, _ in recipes for p in precisions]
    return {"machine": describe(device), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "tokens_per_round": tokens, "steps": steps,
            "repeats": repeats, "reference": ref,
            "recipes": {name: overrides for name, overrides in recipes}, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="key=value for every recipe")
    ap.add_argument("--recipe", action="append", required=True,
                    help="name:key=value,... (the first: reference)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    r = measure(args.config, args.sets, [parse_recipe(t) for t in args.recipe], steps=args.steps,
                repeats=args.repeats, threads=args.threads)
    print(f"{r['machine']}, {r['threads']} thread(s), torch {r['torch']}; {r['tokens_per_round']} "
          f"target tokens per round ({r['steps']} steps), medians of {r['repeats']} rounds")
    for row in r["rows"]:
        print(f"{row['recipe']:>16s} {row['precision']:5s} {row['tokens_per_s']:9,.0f} tokens/s  "
              f"cost x{row['cost_vs_reference']:.3f}")
    if args.json:
        write_atomic(Path(args.json), json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
