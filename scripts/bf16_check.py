"""Does bf16 autocast train as well as fp32? Train one config both ways from the same seed.

Both runs see the same batches in the same order and the same dropout masks (same seed, same
shapes), take the trainer's own steps (training/trainer.py), and evaluate the validation loss every
--eval-every steps, each in its own precision, as `attn-mt train` would. Prints both curves, the
largest relative difference, and the training seconds of each run.

    python scripts/bf16_check.py --config configs/multi30k.yaml \\
        --set data.dir=/path/to/multi30k --steps 300 --eval-every 25 --json runs/bf16_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from attn_mt.config import load_config
from attn_mt.data.corpus import load_corpus
from attn_mt.device import pick_device
from attn_mt.models import build_model
from attn_mt.training.trainer import Trainer
from attn_mt.training.validation import validation_loss


def curve(cfg, corpus, device: torch.device, precision: str, steps: int, every: int) -> dict:
    """Validation loss every `every` steps of training in `precision`, and the training seconds."""
    torch.manual_seed(cfg.train.seed)
    trainer = Trainer(build_model(cfg.model, **corpus.tok.sizes()).to(device).train(), cfg, corpus,
                      device, precision)
    points, seconds = [], 0.0
    while trainer.state.step < steps:
        if trainer.epoch_done:
            trainer.next_epoch()
        t0 = time.perf_counter()
        trainer.step(lambda: 0.0, spent=0.0)  # the learning rate by step alone, as before
        seconds += time.perf_counter() - t0
        step = trainer.state.step
        if step % every == 0 or step == steps:
            loss = validation_loss(trainer.model, corpus, cfg.data.splits.valid,
                                   cfg.train.batch_tokens, device, precision)
            points.append((step, loss))
            trainer.model.train()
            print(f"{precision} step {step}: valid loss {loss:.4f}", flush=True)
    return {"valid_loss": points, "train_seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cfg = load_config(args.config, args.overrides)
    device = pick_device(cfg.train.device)
    load_before = os.getloadavg()
    corpus = load_corpus(cfg, cfg.model.max_positions)
    runs = {p: curve(cfg, corpus, device, p, args.steps, args.eval_every) for p in ("fp32", "bf16")}
    rel = [abs(b - a) / a for (_, a), (_, b) in zip(runs["fp32"]["valid_loss"],
                                                    runs["bf16"]["valid_loss"], strict=True)]
    print(f"{'step':>6}{'fp32':>9}{'bf16':>9}{'rel diff':>10}")
    for (step, a), (_, b), r in zip(runs["fp32"]["valid_loss"], runs["bf16"]["valid_loss"], rel,
                                    strict=True):
        print(f"{step:>6}{a:>9.4f}{b:>9.4f}{r:>10.2%}")
    result = {"config": cfg.name, "device": str(device), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "steps": args.steps, **runs, "max_rel_diff": max(rel),
              "final_rel_diff": rel[-1], "load_before": load_before, "load_after": os.getloadavg()}
    print(f"max relative difference {max(rel):.2%} (final {rel[-1]:.2%}); training seconds fp32 "
          f"{runs['fp32']['train_seconds']:.0f}, bf16 {runs['bf16']['train_seconds']:.0f}; "
          f"load {load_before[0]:.2f} -> {result['load_after'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
