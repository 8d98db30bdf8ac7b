"""Does `attn_mt.train` from Python train as fast as `attn-mt train`? The same config, trained in
turns in fresh processes (the CLI, then a Python process calling the API, then the CLI ...), each
run's tokens/s the median of its evaluation windows after the first (the first holds the warm-up);
prints every run and the ratio of the medians:

    python scripts/api_train_speed.py --config configs/toy.yaml --set train.max_steps=200 --set
    train.eval_every=25
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import attn_mt

API = ("import sys, attn_mt; attn_mt.train(sys.argv[1], sys.argv[2], overrides=sys.argv[3:], "
       "quiet=True)")


def tokens_per_s(run_dir: Path) -> float:
    """The median tokens/s of a finished run's evaluation windows, the first left out when there are
    more."""
    windows = [m["tokens_per_s"] for m in attn_mt.Run(run_dir).metrics]
    return statistics.median(windows[1:] or windows)


def one_run(kind: str, config: str, overrides: list[str], out: Path) -> float:
    sets = [x for o in overrides for x in ("--set", o)]
    cmd = ([sys.executable, "-m", "attn_mt", "--quiet", "train", "--config", config, "--out",
            str(out), *sets]
           if kind == "cli" else [sys.executable, "-c", API, config, str(out), *overrides])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{kind} run failed:\n{done.stderr[-2000:]}")
    return tokens_per_s(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=3, help="Runs of each kind, in turns.")
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()
    seen: dict[str, list[float]] = {"cli": [], "api": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind in ("cli", "api") if r % 2 == 0 else ("api", "cli"):
                seen[kind].append(one_run(kind, args.config, args.overrides,
                                          Path(tmp) / f"{kind}{r}"))
                print(f"round {r + 1} {kind}  {seen[kind][-1]:,.0f} tokens/s", flush=True)
    med = {k: statistics.median(v) for k, v in seen.items()}
    print(f"median tokens/s: attn-mt train {med['cli']:,.0f}, attn_mt.train {med['api']:,.0f} "
          f"({med['api'] / med['cli']:.3f}x)")
    if args.json:
        args.json.write_text(json.dumps({"runs": seen, "median": med,
                                         "ratio": med["api"] / med["cli"]}, indent=2))


if __name__ == "__main__":
    main()
