"""How the data path scales: Multi30k's training split repeated 1, 10, 40 and 138 times (29k to 4M pairs,
each copy with one word per sentence replaced, so the tokenizer sees new text), 20-line valid/test, and
`attn-mt train` for 10 steps of configs/multi30k.yaml on each, in fresh processes:

  cold / warm    seconds from process start to the end of the first training step, without / with the
                 data cache (for --baseline, the code given: without / with its tokenizer in the run dir)
  run            seconds for the whole 10-step run (warm), evaluation and test of 20 sentences included
  encode         training sentences tokenized per second (both sides), in the cold run
  peak RSS       of the training process (ru_maxrss, warm)
  2 ranks        the same warm run under `torchrun --nproc-per-node 2`: the larger rank's peak RSS, and
                 the node's peak proportional set size (PSS: shared pages, such as the memory-mapped
                 cache, counted once) against one process's, sampled every 0.2 s

    MULTI30K_DIR=/path/to/multi30k python scripts/bench_data.py --out docs/data_scale.json \
        [--baseline /path/to/old/checkout --baseline-repeats 1,10,40]
    python scripts/bench_data.py --plot docs/data_scale.json   # docs/data_scale.png and the table
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"

# Runs inside each training process: times the first step, the data preparation and the encoding.
DRIVER = r"""
import json, os, resource, sys, time
sys.path.insert(0, os.environ["BENCH_CODE"])
import datasets
import attn_mt.data.sources, attn_mt.data.tokenizer, attn_mt.training.trainer
from attn_mt.cli import app
t0, clock = float(os.environ["BENCH_T0"]), {"encode_s": 0.0, "prepare_s": 0.0}
def timed(key, fn, train_only=False):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        if not train_only or len(args[-1]) > 1000:  # the old code: encoding the training split, not valid/test
            clock[key] += time.perf_counter() - t
        return out
    return wrapper
if os.path.exists(os.path.join(os.environ["BENCH_CODE"], "attn_mt", "corpus.py")):  # after: the data cache
    import attn_mt.data.corpus as mod
    datasets.Dataset.map = timed("encode_s", datasets.Dataset.map)
else:  # before: lists, encoded in this process
    mod = attn_mt.data.sources
    for name in ("encode_src", "encode_tgt"):
        setattr(attn_mt.data.tokenizer.Tokenizer, name, timed("encode_s", getattr(attn_mt.data.tokenizer.Tokenizer, name), True))
mod.load_corpus = timed("prepare_s", mod.load_corpus)
step = attn_mt.training.trainer.Trainer.step
def first_step(self, *args, **kwargs):
    out = step(self, *args, **kwargs)
    clock.setdefault("first_step_s", time.time() - t0)
    return out
attn_mt.training.trainer.Trainer.step = first_step
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    clock.update(run_s=time.time() - t0, rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 rank=int(os.environ.get("RANK", "0")))
    print("BENCH " + json.dumps(clock), flush=True)
"""

# Data memory alone, no model: load the corpus (warm), plan epoch 0, collate 10 batches. Under torchrun,
# rank 0 loads first and the others after a barrier, as `train` does.
PROBE = r"""
import json, os, resource, sys
sys.path.insert(0, os.environ["BENCH_CODE"])
import torch.distributed as dist
from pathlib import Path
from attn_mt.config import load_config
try:
    from attn_mt.data.corpus import load_corpus
except ImportError:  # the baseline's code: load_corpus in data.py
    from attn_mt.data.sources import load_corpus
from attn_mt.data.batching import token_batches
def pss_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("Pss:"))
def rss_kb(key="VmRSS:"):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))
rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
if size > 1:
    dist.init_process_group("gloo")
from attn_mt.data.batching import collate
cfg = load_config(sys.argv[1], sys.argv[3:])
collate([[4]], [[4]], 0, 2, 3), token_batches([1, 2], [1, 2], 10, 0, 0)  # torch's first use is not data
pss0, rss0, anon0 = pss_kb(), rss_kb(), rss_kb("RssAnon:")
for turn in (0, 1):
    if (rank == 0) == (turn == 0):
        corpus = load_corpus(cfg, cfg.model.max_positions)
    if size > 1:
        dist.barrier()
index = token_batches(*corpus.lengths(cfg.data.splits.train), cfg.train.batch_tokens, cfg.train.seed, 0)
batches = list(corpus.batches(cfg.data.splits.train, index[:10]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("PROBE " + json.dumps({"rank": rank, "pss_mb": (pss_kb() - pss0) / 1024, "peak_rss_mb": (peak - rss0) / 1024,
                            "anon_mb": (rss_kb("RssAnon:") - anon0) / 1024}))
if size > 1:
    dist.barrier()
    dist.destroy_process_group()
"""


def probe(code: Path, data: Path, run_dir: Path, cache: Path, ranks: int) -> dict:
    """Data memory: summed PSS growth over ranks (steady) and the larger rank's peak RSS growth (MB)."""
    overrides = [f"data.dir={data}", "data.splits.test=test",
                 *([f"data.cache_dir={cache}"] if code == ROOT else [])]
    script = run_dir.parent / "probe.py"
    script.write_text(PROBE)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(script)] if ranks == 1 else [str(TORCHRUN), "--standalone", "--nproc-per-node",
                                                          str(ranks), str(script)]
    cmd += [str(code / "configs/multi30k.yaml"), str(run_dir), *overrides]
    env = {**os.environ, "BENCH_CODE": str(code), "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = [json.loads(line[6:]) for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    if out.returncode or len(rows) != ranks:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return {"pss_mb": sum(r["pss_mb"] for r in rows), "peak_rss_mb": max(r["peak_rss_mb"] for r in rows),
            "anon_mb": sum(r["anon_mb"] for r in rows)}


def probes(row: dict, code: Path, data: Path, work: Path, cache: Path, two_ranks: bool) -> None:
    """The data-memory figures of one corpus into `row` (the cache entry built first, outside them)."""
    if code == ROOT:
        sets = [f"data.dir={data}", "data.splits.test=test", f"data.cache_dir={cache}"]
        subprocess.run([sys.executable, "-m", "attn_mt", "--quiet", "prepare", "--config",
                        str(ROOT / "configs/multi30k.yaml"), *[a for s in sets for a in ("--set", s)]],
                       check=True, capture_output=True)
    one = probe(code, data, work / "probe1", cache, 1)
    row.update(data_pss_mb=one["pss_mb"], data_peak_rss_mb=one["peak_rss_mb"], data_anon_mb=one["anon_mb"])
    if two_ranks:
        two = probe(code, data, work / "probe2", cache, 2)
        row.update(ranks2_data_pss_mb=two["pss_mb"], ranks2_data_peak_rss_mb=two["peak_rss_mb"],
                   ranks2_data_anon_mb=two["anon_mb"])


def make_corpus(multi30k: Path, repeats: int, out: Path) -> int:
    """train = Multi30k train x `repeats`, copy r > 0 with one word per sentence replaced (seeded by r)."""
    if (out / "done").exists():
        return int((out / "done").read_text())
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for lang in ("de", "en"):
        lines = (multi30k / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        words = sorted({w for line in lines for w in line.split()})
        with (out / f"train.{lang}").open("w", encoding="utf-8") as f:
            for r in range(repeats):
                rnd = random.Random(r)
                for line in lines:
                    ws = line.split()
                    if r and ws:
                        ws[rnd.randrange(len(ws))] = words[rnd.randrange(len(words))]
                    f.write(" ".join(ws) + "\n")
        n = len(lines) * repeats
        for split, name in (("valid", "valid"), ("test", "test2016")):
            head = (multi30k / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:20]
            (out / f"{split}.{lang}").write_text("\n".join(head) + "\n", encoding="utf-8")
    (out / "done").write_text(str(n))
    return n


def tree_pss_kb(pid: int) -> int:
    """Summed Pss of a process and its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in open(f"/proc/{p}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return total


def run(code: Path, data: Path, run_dir: Path, cache: Path, ranks: int = 1) -> dict:
    """One 10-step training process (or torchrun job); its BENCH figures, per rank, and the peak tree PSS."""
    overrides = [f"data.dir={data}", "data.splits.test=test", "train.max_steps=10", "train.max_minutes=0",
                 "train.keep_last=0", *([f"data.cache_dir={cache}"] if code == ROOT else [])]
    args = ["train", "--config", str(code / "configs/multi30k.yaml"), "--out", str(run_dir),
            *[a for o in overrides for a in ("--set", o)]]
    driver = run_dir.parent / "driver.py"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    driver.write_text(DRIVER)
    cmd = [sys.executable, str(driver), *args]
    if ranks > 1:
        cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), str(driver), *args]
    env = {**os.environ, "BENCH_CODE": str(code), "BENCH_T0": repr(time.time()), "PYTHONPATH": str(code)}
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]

    def sample() -> None:
        while job.poll() is None:
            peak[0] = max(peak[0], tree_pss_kb(job.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, err = job.communicate()
    sampler.join()
    if job.returncode or "first_step_s" not in out:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    ranks_out = sorted((json.loads(line[6:]) for line in out.splitlines() if line.startswith("BENCH ")),
                       key=lambda r: r["rank"])
    return {"ranks": ranks_out, "tree_pss_mb": peak[0] / 1024}


def measure(code: Path, data: Path, work: Path, pairs: int, two_ranks: bool) -> dict:
    """Cold, warm and (optionally) 2-rank runs of one code base on one corpus."""
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    for d in ("run", "run_warm", "run2", "probe1", "probe2"):
        shutil.rmtree(work / d, ignore_errors=True)
    cold = run(code, data, work / "run", cache)["ranks"][0]
    # warm: the data cache in place (before: the tokenizer in the run directory, its only reuse)
    warm_job = run(code, data, work / ("run" if code != ROOT else "run_warm"), cache)
    warm = warm_job["ranks"][0]
    row = {"pairs": pairs, "cold_first_step_s": cold["first_step_s"], "cold_prepare_s": cold["prepare_s"],
           "encode_sentences_per_s": 2 * pairs / cold["encode_s"], "warm_prepare_s": warm["prepare_s"],
           "warm_first_step_s": warm["first_step_s"],
           "warm_run_s": warm["run_s"], "peak_rss_mb": warm["rss_mb"], "tree_pss_mb": warm_job["tree_pss_mb"]}
    probes(row, code, data, work, cache, two_ranks)
    if two_ranks:
        job = run(code, data, work / "run2", cache, ranks=2)
        row.update(ranks2_peak_rss_mb=max(r["rss_mb"] for r in job["ranks"]),
                   ranks2_first_step_s=max(r["first_step_s"] for r in job["ranks"]),
                   ranks2_tree_pss_mb=job["tree_pss_mb"])
    print(json.dumps(row), flush=True)
    return row


def table(result: dict) -> str:
    """The two markdown tables of docs/data.md: time, then memory."""
    def f(r: dict, key: str, fmt: str = ".0f") -> str:
        return format(r[key], fmt) if key in r else "-"

    rows = [(code, r) for code in ("before", "after") for r in result.get(code, [])]
    time_rows = ["| code | pairs | cold: data s | cold: first step s | encode sent/s | warm: data s "
                 "| warm: first step s | 10-step run s |", "|" + " --- |" * 8]
    time_rows += [f"| {c} | {r['pairs']:,} | {f(r, 'cold_prepare_s', '.1f')} | {f(r, 'cold_first_step_s', '.1f')} "
                  f"| {f(r, 'encode_sentences_per_s', ',.0f')} | {f(r, 'warm_prepare_s', '.1f')} "
                  f"| {f(r, 'warm_first_step_s', '.1f')} | {f(r, 'warm_run_s', '.1f')} |" for c, r in rows]
    mem_rows = ["| code | pairs | train: peak RSS MB | data, 1 process: PSS, private, peak RSS MB "
                "| data, 2 ranks: PSS, private MB | 2 ranks / 1 (PSS) | 2 ranks train: peak RSS, node PSS MB |",
                "|" + " --- |" * 7]
    for c, r in rows:
        ratio = (f"{r['ranks2_data_pss_mb'] / r['data_pss_mb']:.2f}" if "ranks2_data_pss_mb" in r else "-")
        mem_rows.append(f"| {c} | {r['pairs']:,} | {f(r, 'peak_rss_mb')} | {f(r, 'data_pss_mb')}, "
                        f"{f(r, 'data_anon_mb')}, {f(r, 'data_peak_rss_mb')} | {f(r, 'ranks2_data_pss_mb')}, "
                        f"{f(r, 'ranks2_data_anon_mb')} | {ratio} "
                        f"| {f(r, 'ranks2_peak_rss_mb')}, {f(r, 'ranks2_tree_pss_mb')} |")
    return "\n".join(time_rows) + "\n\n" + "\n".join(mem_rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for code, style in (("before", "--"), ("after", "-")):
        rows = result.get(code, [])
        x = [r["pairs"] for r in rows]
        ax_t.plot(x, [r["cold_first_step_s"] for r in rows], style + "o", label=f"{code}: cold")
        ax_t.plot(x, [r["warm_first_step_s"] for r in rows], style + "s", label=f"{code}: warm")
        ax_m.plot(x, [r["data_pss_mb"] for r in rows], style + "o", label=f"{code}: 1 process")
        two = [r for r in rows if "ranks2_data_pss_mb" in r]
        if two:
            ax_m.plot([r["pairs"] for r in two], [r["ranks2_data_pss_mb"] for r in two], style + "v",
                      label=f"{code}: 2 ranks (summed)")
    ax_t.set_ylabel("seconds from start to the first training step")
    ax_m.set_ylabel("data memory, MB (PSS growth)")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_xlabel("training pairs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(f"attn-mt data path, configs/multi30k.yaml: {m['device_name']}, {m['cpu_count']} cores, "
                 f"torch {m['torch']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs/data_scale.json")
    ap.add_argument("--repeats", default="1,10,40,138", help="copies of Multi30k's training split")
    ap.add_argument("--two-ranks", default="1,40,138", help="repeats also measured under torchrun, 2 ranks")
    ap.add_argument("--baseline", type=Path, help="a checkout (attn_mt/, configs/) of the code before, measured alike")
    ap.add_argument("--baseline-repeats", default="1,10,40")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "attn_mt_bench_data",
                    help="where the generated corpora and caches go (several GB for 4M pairs)")
    ap.add_argument("--plot", type=Path, help="only draw the plot and print the table of this JSON")
    ap.add_argument("--probes", type=Path, help="only rerun the data-memory probes of this JSON's rows")
    args = ap.parse_args()
    if args.probes:
        result = json.loads(args.probes.read_text())
        for code, path in (("after", ROOT), ("before", args.baseline)):
            for row in result.get(code, []):
                data = args.work / f"x{row['pairs'] // 29000}"
                probes(row, path, data, args.work / code, args.work / "probe_cache", "ranks2_data_pss_mb" in row)
                print(json.dumps(row), flush=True)
        args.probes.write_text(json.dumps(result, indent=1) + "\n")
        args.plot = args.probes
    if args.plot:
        result = json.loads(args.plot.read_text())
        plot(result, args.plot.with_suffix(".png"))
        print(table(result))
        return
    import torch

    from attn_mt.device import machine

    multi30k = Path(os.environ.get("MULTI30K_DIR", "data/multi30k"))
    result = {"machine": machine(torch.device("cpu")), "torch": torch.__version__, "cpus": os.cpu_count(),
              "load_before": os.getloadavg(), "before": [], "after": []}
    todo = [("after", ROOT, r) for r in map(int, args.repeats.split(","))]
    if args.baseline:
        todo += [("before", args.baseline, r) for r in map(int, args.baseline_repeats.split(","))]
    two = set(map(int, args.two_ranks.split(",")))
    for code, path, r in todo:
        data = args.work / f"x{r}"
        pairs = make_corpus(multi30k, r, data)
        result[code].append(measure(path, data, args.work / code, pairs, r in two and code == "after"))
        result["load_after"] = os.getloadavg()
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(table(result))


if __name__ == "__main__":
    main()
