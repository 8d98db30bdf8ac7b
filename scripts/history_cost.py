"""What recording attention (train.record_attention) costs a run: the same config trained in one
process with recording on and off, in turns (on, off, then off, on ...), each run's training time
(results.json's train_seconds: steps and evaluations, the recording at step 0 and at each evaluation
included) and its process CPU time; prints every run and the ratios of the medians (on / off):

    python scripts/history_cost.py --config configs/multi30k_quick.yaml --set train.max_minutes=0 \\
        --set train.max_steps=400 --set train.eval_every=100 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import attn_mt


def one_run(config: str, overrides: list[str], record: bool, out: Path) -> dict[str, float]:
    """Train once; the run's train_seconds and the process's CPU seconds for the whole call."""
    cpu = time.process_time()
    run = attn_mt.train(config, out,
                        overrides=[*overrides, f"train.record_attention={str(record).lower()}"],
                        quiet=True)
    return {"train_s": run.results["train_seconds"], "cpu_s": time.process_time() - cpu,
            "steps": run.results["steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each kind, in turns.")
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()
    seen: dict[str, list[dict]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind in ("on", "off") if r % 2 == 0 else ("off", "on"):
                got = one_run(args.config, args.overrides, kind == "on", Path(tmp) / f"{kind}{r}")
                seen[kind].append(got)
                print(f"round {r + 1} recording {kind:3}  {got['steps']} steps, train "
                      f"{got['train_s']:.1f} s, cpu {got['cpu_s']:.1f} s", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("train_s", "cpu_s")} for k,
           v in seen.items()}
    ratio = {m: med["on"][m] / med["off"][m] for m in ("train_s", "cpu_s")}
    print(f"median train time: on {med['on']['train_s']:.1f} s, off {med['off']['train_s']:.1f} s "
          f"({ratio['train_s']:.4f}x); cpu time: on {med['on']['cpu_s']:.1f} s, off "
          f"{med['off']['cpu_s']:.1f} s ({ratio['cpu_s']:.4f}x)")
    if args.json:
        args.json.write_text(json.dumps({"runs": seen, "median": med,
                                         "ratio": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
