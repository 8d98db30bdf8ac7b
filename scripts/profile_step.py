"""Kernels per training step and the device's busy share (attn_mt/measure/profile.py), from the
command line.

    python scripts/profile_step.py --config configs/multi30k_gpu.yaml \
        --set data.dir=/path/to/multi30k \
        --steps 10 --json profile.json

`--variants eager compiled` profiles the step eager and under torch.compile with the config's
options. `--parts` also times the parts of the eager step apart (attn_mt/measure/parts.py: batch,
forward, loss, backward, clip, checks, optimizer, EMA, schedule), in ms per step, median of --steps
steps, against the whole step; `--variants` with no name times only the parts. scripts/gpu_check.py
runs it as its profile step (tests/scripts/test_gpu_check.py runs that on the CPU).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attn_mt.config import load_config
from attn_mt.files import write_atomic
from attn_mt.measure.parts import config_parts, parts_table
from attn_mt.measure.prelude import prelude
from attn_mt.measure.profile import profile_steps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", nargs="*", default=["eager", "compiled"],
                   choices=["eager", "compiled"])
    p.add_argument("--parts", action="store_true", help="also time the parts of a step (forward, "
                   "loss, ...)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    result = profile_steps(cfg, args.steps, args.warmup, tuple(args.variants))
    if args.parts:
        start = prelude(cfg, cfg.model.max_positions, "the config configs/toy.yaml")
        result["parts"] = config_parts(cfg, start, args.steps, args.warmup)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    for name, v in result["variants"].items():
        print(f"{name}: {v['step_s'] * 1e3:.1f} ms per step, {v['tokens_per_s']:.0f} tokens/s, "
              f"kernels per step {v['kernels_per_step']}, device busy {v['device_busy_share']}, "
              f"warm-up {v['warmup_s']:.1f} s")
    if args.parts:
        print("\n".join(parts_table(result["parts"])))
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
