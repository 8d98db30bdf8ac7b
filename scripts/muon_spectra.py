"""Singular values of what Muon orthogonalises, during a real training run (docs/speedrun.md).

Trains the config with Muon and, at the chosen steps, takes the singular values of each weight
matrix's Nesterov momentum divided by its Frobenius norm: the input of the Newton-Schulz iterations,
whose coefficients are designed for the interval these fall in. Per step: each quantile's median
over the matrices, and its range.

    python scripts/muon_spectra.py --config configs/speedrun.yaml \\
        --set data.dir=/path/to/multi30k \\
        --steps 5,150,600 --json spectra.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

import attn_mt
from attn_mt.files import write_atomic
from attn_mt.training import muon

QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.9, 1.0)


def record(config: str, sets: list[str], steps: list[int]) -> dict[int, list[list[float]]]:
    """{step: [quantiles of one matrix's normalised singular values, ...]} from a run stopped at the
    last step."""
    seen: dict[int, list[list[float]]] = {s: [] for s in steps}
    count = {"step": 0}
    plain_step, plain_orthogonalise = muon.MuonAdamW.step, muon.orthogonalise

    def counting_step(self, closure=None):  # noqa: ANN001 (torch's signature)
        count["step"] += 1
        return plain_step(self, closure)

    def recording_orthogonalise(g, coefficients, dtype=torch.float32):  # noqa: ANN001
        if count["step"] in seen:
            s = torch.linalg.svdvals(g.float() / g.float().norm().clamp(min=1e-12))
            seen[count["step"]].append(torch.quantile(s, torch.tensor(QUANTILES)).tolist())
        return plain_orthogonalise(g, coefficients, dtype)

    muon.MuonAdamW.step, muon.orthogonalise = counting_step, recording_orthogonalise
    try:
        with tempfile.TemporaryDirectory() as out:
            attn_mt.train(config, out, overrides=[*sets, "train.optimizer=muon",
                                                  f"train.max_steps={max(steps)}"],
                          quiet=True)
    finally:
        muon.MuonAdamW.step, muon.orthogonalise = plain_step, plain_orthogonalise
    return seen


def summary(seen: dict[int, list[list[float]]]) -> list[dict]:
    """Per step and quantile: the median over the matrices, and the smallest and largest."""
    rows = []
    for step, per_matrix in seen.items():
        for i, q in enumerate(QUANTILES):
            values = [m[i] for m in per_matrix]
            rows.append({"step": step, "quantile": q, "matrices": len(values),
                         "median": statistics.median(values), "min": min(values),
                         "max": max(values)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", default="5,150,600",
                    help="optimizer steps to look at, comma-separated")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    steps = sorted({int(s) for s in args.steps.split(",")})
    rows = summary(record(args.config, args.sets, steps))
    for r in rows:
        print(f"step {r['step']:5d}  quantile {r['quantile']:4.2f}: median {r['median']:.4f} over "
              f"{r['matrices']} matrices ({r['min']:.4f}-{r['max']:.4f})")
    if args.json:
        write_atomic(Path(args.json), json.dumps({"config": args.config, "sets": args.sets,
                                                  "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
