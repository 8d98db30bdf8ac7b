"""Does keeping freed memory in the heap (attn_mt/training/memory.py) speed up training? Measure it.

Runs the same 25 bf16 training steps on the first Multi30k batches in fresh processes, alternating
glibc's default allocator settings (ATTN_MT_MALLOC=system) with attn-mt's, and prints tokens/s and
page faults per step of each round, then the medians:

    python scripts/malloc_check.py --config configs/multi30k.yaml --set data.dir=/path/to/multi30k
    --rounds 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attn_mt.measure.timing import alternate, timed


def child(args) -> None:
    """One round in this process: warm-up steps, then timed steps; prints a JSON line."""
    import torch

    from attn_mt.config import load_config
    from attn_mt.data.corpus import load_corpus
    from attn_mt.device import pick_precision
    from attn_mt.models import build_model
    from attn_mt.training.memory import reuse_freed_memory
    from attn_mt.training.trainer import Trainer

    applied = reuse_freed_memory()
    cfg = load_config(args.config, args.overrides)
    tc, device = cfg.train, torch.device("cpu")
    precision = pick_precision(tc.precision, device)
    corpus = load_corpus(cfg, cfg.model.max_positions)
    torch.manual_seed(tc.seed)
    trainer = Trainer(build_model(cfg.model, **corpus.tok.sizes()).train(), cfg, corpus, device,
                      precision)
    seconds, tokens = 0.0, 0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if trainer.epoch_done:
            trainer.next_epoch()
        t0 = time.perf_counter()
        step = trainer.step(lambda: 0.0, spent=0.0)
        if i >= args.warmup:
            seconds, tokens = seconds + time.perf_counter() - t0, tokens + step.n_tokens
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(json.dumps({"heap_reuse": applied, "precision": precision,
                      "threads": torch.get_num_threads(), "tokens_per_s": tokens / seconds,
                      "faults_per_step": faults / args.steps}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    base = [sys.executable, __file__, "--child", "--config", str(args.config),
            "--steps", str(args.steps), "--warmup", str(args.warmup)]
    base += [x for o in args.overrides for x in ("--set", o)]
    results: dict[str, list] = {"system": [], "attn-mt": []}

    def one_round(name: str) -> None:
        env = {**os.environ, "ATTN_MT_MALLOC": "system" if name == "system" else ""}
        out = subprocess.run(base, env=env, capture_output=True, text=True, check=True)
        results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def show(name: str, r: int, seconds: float) -> None:
        row = results[name][-1]
        print(f"round {r + 1} {name:8s} {row['tokens_per_s']:7.0f} tokens/s "
              f"{row['faults_per_step']:9.0f} page faults/step", flush=True)

    # the two settings take turns in fresh processes, so background load hits both alike
    alternate({name: timed(functools.partial(one_round, name)) for name in results}, args.rounds,
              after=show)
    med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in results.items()}
    print(f"median tokens/s: system {med['system']:.0f}, attn-mt {med['attn-mt']:.0f} "
          f"({med['attn-mt'] / med['system']:.2f}x); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
