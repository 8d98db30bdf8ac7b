"""Guided alignment measured (docs/alignment.md): one config trained unguided and guided at equal
steps; test BLEU, training tokens/s (the median of steps the two take in turns, after the runs), and
AER against reference links of the test split, of the guided head and of the unguided run's best
method (`by_head`), written as JSON.

    python scripts/guided_alignment.py --config configs/multi30k_quick.yaml --steps 600 \
        --out runs/guided --json guided_alignment.json

The reference: eflomal (`pip install "attn-mt[align]"`) on the training and test texts together,
lowercased, both directions joined by grow-diag-final, as docs/alignment.md made it; its training
lines guide the guided run. Or, from elsewhere, `--links` (the training split's, line-aligned with
its text as stored) and `--test-links` (the test split's).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import attn_mt
from attn_mt.config import ExperimentConfig, load_config
from attn_mt.data.sources import read_pairs, source
from attn_mt.decoding.alignment import grow_diag_final
from attn_mt.decoding.pharaoh import format_links, parse_line
from attn_mt.measure.prelude import prelude
from attn_mt.models import build_model
from attn_mt.rundir import RunDir
from attn_mt.training.run import train
from attn_mt.training.trainer import Trainer

log = logging.getLogger("guided_alignment")


def stored_pairs(cfg: ExperimentConfig, split: str) -> tuple[list[str], list[str]]:
    """A split's texts as stored (empty pairs kept: the lines a link file is aligned with)."""
    src, tgt = [], []
    for s, t in source(cfg.data).chunks(split):
        src += s
        tgt += t
    return src, tgt


def eflomal_links(cfg: ExperimentConfig, work: Path) -> tuple[Path, Path]:
    """(training links, test links) by eflomal on both splits together, lowercased, its two
    directions joined by grow-diag-final."""
    tool = shutil.which("eflomal-align") or str(Path(sys.executable).parent / "eflomal-align")
    if not Path(tool).exists():
        raise SystemExit('eflomal-align not found: pip install "attn-mt[align]", or give --links '
                         "and --test-links")
    train_src, train_tgt = stored_pairs(cfg, cfg.data.splits.train)
    test_src, test_tgt = read_pairs(cfg.data, cfg.data.splits.test)  # as the run's test files
    work.mkdir(parents=True, exist_ok=True)
    for name, lines in (("ef.src", train_src + test_src), ("ef.tgt", train_tgt + test_tgt)):
        (work / name).write_text("".join(f"{x.lower()}\n" for x in lines), encoding="utf-8")
    t0 = time.perf_counter()
    subprocess.run([tool, "--overwrite", "-s", work / "ef.src", "-t", work / "ef.tgt", "-f",
                    work / "ef.fwd", "-r", work / "ef.rev"], check=True, capture_output=True)
    log.info("eflomal: %d pairs in %.1f s", len(train_src) + len(test_src),
             time.perf_counter() - t0)
    fwd, rev = ([parse_line(x, name).sure for x in (work / name).read_text().splitlines()]
                for name in ("ef.fwd", "ef.rev"))
    joined = [format_links(grow_diag_final(set(f), set(r))) for f, r in zip(fwd, rev, strict=True)]
    paths = work / "train.pharaoh", work / "test.pharaoh"
    n = len(train_src)
    for path, lines in zip(paths, (joined[:n], joined[n:]), strict=True):
        path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return paths


def tokens_per_s(cfgs: dict[str, ExperimentConfig], steps: int) -> tuple[dict[str, float], str]:
    """Median training tokens/s of each config's step, the configs' steps taken in turns on the
    same batches, after a warm-up step each; and the device."""
    first = next(iter(cfgs.values()))
    start = prelude(first, first.model.max_positions, "attn-mt prepare")
    trainers = {}
    for name, cfg in cfgs.items():
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, **start.corpus.tok.sizes()).to(start.device).train()
        trainers[name] = Trainer(model, cfg, start.corpus, start.device, start.precision)
    rates: dict[str, list[float]] = {name: [] for name in cfgs}
    for i in range(steps + 1):
        for name, tr in trainers.items():
            if tr.epoch_done:
                tr.next_epoch()
            if start.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = tr.step(lambda: 0.0, spent=0.5)
            if start.device.type == "cuda":
                torch.cuda.synchronize()
            if i:  # the first is the warm-up
                rates[name].append(out.n_tokens / (time.perf_counter() - t0))
    return {name: statistics.median(r) for name, r in rates.items()}, str(start.device)


def scores(run: Path, cfg: ExperimentConfig, test_links: Path, head: str) -> dict:
    """A run's test BLEU, and AER against `test_links` of its best method (every layer, head and
    reading scored), of the default (the last layer's average) and of `head`."""
    files = RunDir(run)
    results, d = files.read_results(), cfg.data
    model = attn_mt.load(files.tested(results), device="cpu")
    report = model.align_report(files.test_text(d.splits.test, d.src_lang),
                                files.test_text(d.splits.test, d.tgt_lang), test_links,
                                by_head=True)

    def row(method: str) -> dict:
        r = report.rows[method]
        return {"method": method, "aer": r.aer, "precision": r.precision, "recall": r.recall}

    return {"test_bleu": results["test_bleu"], "best": row(report.best),
            "default": row(f"layer{cfg.model.n_layers}"), "head": row(head)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True, help="training steps of each run")
    p.add_argument("--out", type=Path, required=True, help="a folder for the runs and links")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--links", type=Path, help="training links (default: eflomal's)")
    p.add_argument("--test-links", type=Path, help="the test split's reference links")
    p.add_argument("--speed-steps", type=int, default=20, help="steps of each timed in turns")
    p.add_argument("--set", dest="sets", action="append", default=[], help="section.key=value")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if (args.links is None) != (args.test_links is None):
        p.error("give both --links and --test-links, or neither (eflomal makes both)")
    base = ["model.size=fixed", "train.max_minutes=0", f"train.max_steps={args.steps}",
            f"train.eval_every={args.steps}",  # one evaluation, at the end: the model tested
            "train.max_epochs=1000000", *args.sets]
    plain = load_config(args.config, base)
    links, test_links = ((args.links, args.test_links) if args.links
                         else eflomal_links(plain, args.out / "eflomal"))
    guided = load_config(args.config, [*base, f"train.guided_alignment={links.resolve()}"])
    layers = guided.model.n_layers
    head = guided.train.guided_head or f"head{layers}.1"
    found = {}
    for name, cfg in (("unguided", plain), ("guided", guided)):
        run = args.out / name
        train(cfg, run, overwrite=True)
        found[name] = scores(run, cfg, test_links, head)
    speed, device = tokens_per_s({"unguided": plain, "guided": guided}, args.speed_steps)
    result = {"config": str(args.config), "steps": args.steps, "guided_head": head,
              "guided_weight": guided.train.guided_weight, "sets": args.sets,
              "reference": "given" if args.links else "eflomal (grow-diag-final, lowercased)",
              "device": device, "threads": torch.get_num_threads(),
              "tokens_per_s": {k: round(v) for k, v in speed.items()},
              "speed_ratio": round(speed["guided"] / speed["unguided"], 3), **found}
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for name in ("unguided", "guided"):
        f = found[name]
        print(f"{name}: test BLEU {f['test_bleu']:.2f}, {speed[name]:.0f} tokens/s; AER "
              f"{head} {f['head']['aer']:.2f}, layer{layers} {f['default']['aer']:.2f}, best "
              f"{f['best']['method']} {f['best']['aer']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
