"""The GPU check: the measurements of one CUDA GPU within a short lease (at most 8 minutes), as JSON
files.

    python3 scripts/gpu_check.py --data /path/to/multi30k --out /path/to/out [--budget-s 470]
    [--docs]

It runs from a checkout with the image's python and no install: this process puts the checkout on
its own path and on every step's PYTHONPATH. Before any work it prints one line naming each missing
package and how to bring it (wheels, installed with `pip install --target DIR`, DIR on PYTHONPATH);
without a package every step needs it stops there, a step whose own extra is missing is skipped
(pytest: tests; fastapi, uvicorn, httpx: serve), and without triton the GPU config and the profile
run eager. Nothing is downloaded: the data comes from --data ({split}.{de,en} files), the data cache
goes into OUT/cache.

Steps, in order, each a subprocess with its own time limit (its share of what is left of --budget-s,
so all of them fit and a step that ends early leaves its time to the ones after it). Each writes
OUT/gpu_<step>.json the moment it ends: its status (the exit code, "timeout" when cut at its limit,
"skipped: ..."), seconds, limit, command, the tail of its log, and the report it produced:
    prepare   `attn-mt prepare`: the tokenizer and token ids of Multi30k, once, for every step after
              it
    tests     `pytest -m gpu` (tests/test_gpu.py)
    bench     `attn-mt bench` on configs/multi30k.yaml with 16k-token batches: ours against
              torch.nn.Transformer, MFU, data_s_per_batch
    profile   `scripts/profile_step.py` on configs/multi30k_gpu.yaml: kernels per step and
              the GPU's busy share, eager and compiled
    train     `attn-mt train --config configs/multi30k_gpu.yaml` (its token budget, or
              train.max_minutes from the step's limit, whichever ends first): results.json and
              metrics
    compare   `attn-mt compare-rnn` with 16k-token batches, cost against length from 8 to 1024
              tokens
    serve     scripts/serve_load.py on the train step's checkpoint on the GPU: 8 and 32 clients
--docs then copies the report of each step that ended well to docs/gpu/<step>.json (with machine,
commit and command), puts its GPU row in docs/readme_results.json in place of the row it had (the
rows of steps not run or failed stay as they were) and rebuilds the results tables
(scripts/results_table.py). Only measurements on a CUDA GPU go into the docs: --docs with --dry-run,
or on a machine without one, is refused before any step runs.

`--dry-run` runs every step on the CPU with tiny settings on the built-in toy corpus (the GPU tests
then skip), so everything but CUDA itself is exercised before device time is spent; the test suite
runs it that way (tests/scripts/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the checkout, not an installed copy: what the summary and --docs import
sys.path.insert(0, str(ROOT))

CORE = {"torch": "torch", "numpy": "numpy", "sentencepiece": "sentencepiece",
        "sacrebleu": "sacrebleu", "yaml": "PyYAML", "typer": "typer", "tqdm": "tqdm",
        "datasets": "datasets", "matplotlib": "matplotlib"}
EXTRA = {"tests": {"pytest": "pytest"}, "serve": {"fastapi": "fastapi", "uvicorn": "uvicorn",
                                                  "httpx": "httpx"},
         # triton: torch.compile on CUDA (train.compile)
         "profile": {}, "train": {"triton": "triton"}}
SHARES = {"prepare": 25, "tests": 80, "bench": 45, "profile": 55, "train": 135, "compare": 95,
          "serve": 35}
TINY = ["data.source=toy", "data.src_lang=en", "data.tgt_lang=de", "data.toy_size=300",
        "data.splits.test=test", "tokenizer.vocab_size=120", "train.device=cpu",
        "train.precision=fp32", "train.bleu_sentences=20", "decode.max_len_b=5",
        "decode.beam_size=2", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
        "model.d_ff=64", "train.batch_tokens=600", "train.compile=false"]


def run_dir(out: Path):
    """The train step's run directory (imported here, once the packages are known to be there)."""
    from attn_mt.rundir import RunDir

    return RunDir(out / "run")


def sets(keys: list[str]) -> list[str]:
    return [x for k in keys for x in ("--set", k)]


def missing(modules: dict[str, str]) -> list[str]:
    """The pip names of the modules that cannot be imported here."""
    return [pip for mod, pip in modules.items() if importlib.util.find_spec(mod) is None]


def bring(names: list[str]) -> str:
    """The one line that says what is missing and how to bring it to a machine without an index."""
    return (f"missing packages: {' '.join(names)}. Bring them as wheels: where there is an index, "
            f"`pip download {' '.join(names)} -d wheels` (this python's version and platform); "
            "here `pip install --no-index --target /path/site wheels/*.whl`, then run again with "
            "PYTHONPATH=/path/site")


def steps(data: Path | None, out: Path, dry: bool,
          limits: dict[str, float]) -> dict[str, list[str]]:
    """name -> the command after `python` (the train and compare budgets follow their limits)."""
    cli = ["-m", "attn_mt", "--quiet"]
    # startup, evaluations and the test split beside training
    train_min = max(limits["train"] - 45, 10) / 60
    # two models; lengths, decoding and tests beside them
    compare_min = max(limits["compare"] - 60, 10) / 120
    if dry:
        base, gpu_cfg, cuda = ["--config",
                               "configs/toy.yaml"], ["--config", "configs/multi30k_gpu.yaml"], TINY
        bench = ["--repeats", "1", "--steps", "1", "--sentences", "5"]
        train = ["train.max_steps=4", "train.eval_every=2", "train.keep_last=2"]
        compare = ["--quick", *sets(["compare.lengths=[8]", "compare.length_batch_tokens=256",
                                     "compare.repeats=1", "compare.decode_sentences=8",
                                     "compare.decode_repeats=1", "compare.beam_size=2",
                                     "compare.eval_every_minutes=0.005",
                                     "compare.budget_minutes=0.005", "data.toy_size=300",
                                     "tokenizer.vocab_size=120", "train.bleu_sentences=5",
                                     "train.batch_tokens=500", "train.device=cpu",
                                     "train.precision=fp32", "decode.beam_size=2",
                                     "decode.max_len_b=4", "transformer.model.d_model=32",
                                     "transformer.model.n_heads=2", "transformer.model.n_layers=1",
                                     "transformer.model.d_ff=64", "rnn.model.d_embed=32",
                                     "rnn.model.d_hidden=24", "rnn.model.d_attn=32"])]
        # inductor on a CPU takes minutes
        profile, variants = ["--steps", "2", "--warmup", "1"], ["eager"]
        serve = ["--sentences", "12", "--single", "3", "--big", "4", "--clients", "8", "--rounds",
                 "1", "--device", "cpu", "--threads", "1"]
        src = run_dir(out).test_text("test", "en")  # written by the train step
    else:
        base, gpu_cfg = ["--config",
                         "configs/multi30k.yaml"], ["--config", "configs/multi30k_gpu.yaml"]
        cuda = [f"data.dir={data}", "train.device=cuda"]
        bench = [*sets(["train.batch_tokens=16384"]), "--repeats", "5", "--steps", "4",
                 "--sentences", "500"]
        train = [f"train.max_minutes={train_min:.2f}"]
        compare = sets([f"compare.budget_minutes={compare_min:.2f}",
                        "compare.eval_every_minutes=0.1", "compare.lengths=[8,32,128,512,1024]",
                        "compare.length_batch_tokens=16384", "compare.repeats=3",
                        "train.batch_tokens=16384", "transformer.model.max_positions=1040",
                        "rnn.model.max_positions=1040", "compare.decode_sentences=500",
                        f"data.dir={data}", "train.device=cuda"])
        profile, variants = ["--steps", "10", "--warmup", "3"], ["eager", "compiled"]
        serve = ["--sentences", "400", "--single", "20", "--big", "32", "--clients", "8", "32",
                 "--rounds", "1", "--device", "cuda"]
        src = data / "test2016.de"
    if dry or missing(EXTRA["train"]):  # no triton: the GPU config runs eager
        train = [*train, "train.compile=false"]
        variants = ["eager"]
    return {
        "prepare": [*cli, "prepare", *base, *sets(cuda)],
        "tests": ["-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                  str(ROOT / "tests" / "test_gpu.py")],
        "bench": [*cli, "bench", *base, *sets(cuda), *bench, "--json", str(out / "bench.json")],
        "profile": [str(ROOT / "scripts" / "profile_step.py"), *gpu_cfg, *sets(cuda), *profile,
                    "--variants", *variants, "--json", str(out / "profile.json")],
        "train": [*cli, "train", *gpu_cfg, "--out", str(out / "run"), *sets([*cuda, *train])],
        "compare": [*cli, "compare-rnn", "--config", "configs/compare.yaml", "--out",
                    str(out / "compare"), *compare],
        "serve": [str(ROOT / "scripts" / "serve_load.py"), "--checkpoint", str(run_dir(out).best),
                  "--src", str(src), *serve, "--out-json", str(out / "serve.json")],
    }


def reports(name: str, out: Path) -> dict:
    """What the step produced, read back (partial where it was cut: a run's metrics so far)."""
    files = {"bench": out / "bench.json", "profile": out / "profile.json",
             "serve": out / "serve.json", "compare": out / "compare" / "report.json"}
    if name == "train":  # the run's results (none when it was cut) and its metrics so far
        run = run_dir(out)
        return {k: v for k, v in (("results", run.read_results()), ("metrics", run.read_metrics()))
                if v}
    return ({"report": json.loads(files[name].read_text())} if name in files
            and files[name].exists() else {})


def run_step(name: str, cmd: list[str], limit: float, out: Path, env: dict, skip: str = "") -> dict:
    """Run one step within `limit` seconds (its whole process group is killed there) and write its
    JSON."""
    t0, log = time.perf_counter(), out / f"{name}.log"
    if skip:
        status = f"skipped: {skip}"
        log.write_text(status + "\n")
    else:
        with log.open("w") as f:
            proc = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, env=env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                status = proc.wait(timeout=max(limit, 1))
            except subprocess.TimeoutExpired:
                status = "timeout"
                for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
                    try:
                        os.killpg(proc.pid, sig)
                        proc.wait(timeout=wait)
                        break
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        continue
    result = {"step": name, "status": status, "seconds": round(time.perf_counter() - t0, 1),
              "limit_s": round(limit, 1), "command": " ".join(["python", *cmd]),
              "tail": log.read_text(errors="replace").splitlines()[-15:], **reports(name, out)}
    (out / f"gpu_{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{name}: {'ok' if status == 0 else status} in {result['seconds']} s (limit "
          f"{result['limit_s']} s)", flush=True)
    return result


def environment() -> dict:
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "python": sys.version.split()[0],
           "commit": commit()}
    if torch.cuda.is_available():
        env.update(device=torch.cuda.get_device_name(), bf16=torch.cuda.is_bf16_supported(),
                   memory_gb=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    if shutil.which("nvidia-smi"):
        env["nvidia_smi"] = subprocess.run(["nvidia-smi",
                                            "-L"], capture_output=True, text=True).stdout.strip()
    return env


def commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def summary(results: dict[str, dict]) -> str:
    lines = [f"{name}: {r['status']} ({r['seconds']} s)" for name, r in results.items()
             if "status" in r]
    if bench := results.get("bench", {}).get("report"):
        lines.append(f"bench: ours {bench['ours_tokens_per_s']} tokens/s, ratio to "
                     f"torch.nn.Transformer {bench['ratio']}, MFU {bench['mfu'].get('ours')}, data "
                     f"{bench['data_s_per_batch'] * 1e3:.2f} ms per batch")
    if prof := results.get("profile", {}).get("report"):
        for name, v in prof["variants"].items():
            lines.append(f"profile {name}: {v['step_s'] * 1e3:.1f} ms per step, kernels per step "
                         f"{v['kernels_per_step']}, GPU busy {v['device_busy_share']}")
    if cmp := results.get("compare", {}).get("report"):
        for kind, m in cmp["models"].items():
            lines.append(f"compare {kind}: {m['train_tokens_per_s']} tokens/s, test BLEU "
                         f"{m.get('test_bleu')}")
    if train := results.get("train", {}).get("results"):
        lines.append(f"train: {train['steps']} steps, {train['tokens']} tokens in "
                     f"{train['train_seconds']} s, test BLEU {train['test_bleu']} "
                     f"({train['precision']})")
    if serve := results.get("serve", {}).get("report"):
        lines.append("serve: " + ", ".join(f"{k}: {v['server_sentences_per_s']} sentences/s"
                                           for k, v in serve.items() if k.startswith("clients_")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="Multi30k folder ({split}.{de,en})")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=470.0,
                        help="all steps within this many seconds")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny settings on the CPU, toy corpus")
    parser.add_argument("--only", nargs="*", help="run only these steps")
    parser.add_argument("--docs", action="store_true",
                        help="also write docs/gpu/*.json and the results rows")
    args = parser.parse_args(argv)
    if args.docs and args.dry_run:
        parser.error("--docs: a dry run measures the CPU with tiny settings; the docs hold GPU "
                     "measurements")
    if not args.dry_run and not (args.data and (args.data / "train.de").exists()):
        parser.error(f"--data {args.data}: no train.de there (Multi30k {{split}}.{{de,en}} files)")
    t0 = time.perf_counter()
    absent = missing(CORE) + [p for n in EXTRA for p in missing(EXTRA[n])
                              if not (args.dry_run and n == "train")]
    if absent:
        print(bring(sorted(set(absent))), flush=True)
    if missing(CORE):
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {"env": environment()}
    if args.docs and not on_gpu(results["env"]):
        print("error: --docs: no CUDA GPU here; the docs hold GPU measurements", file=sys.stderr)
        return 2
    (out / "gpu_env.json").write_text(json.dumps(results["env"], indent=2) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                        *filter(
                                                            None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "ATTN_MT_CACHE": str(out / "cache"), "MPLBACKEND": "Agg"}
    chosen = [n for n in SHARES if not args.only or n in args.only]

    def one(name: str, limit: float) -> None:
        limits = {n: limit if n == name else SHARES[n] for n in SHARES}
        cmd = steps(args.data and args.data.resolve(), out, args.dry_run, limits)[name]
        absent_here = missing(EXTRA[name]) if name in ("tests", "serve") else []
        skip = f"missing {' '.join(absent_here)}" if absent_here else ""
        if name == "serve" and not skip and not run_dir(out).best.exists():
            skip = "no checkpoint from the train step"
        results[name] = run_step(name, cmd, limit, out, env, skip)

    # on the CPU the steps after prepare go in three lanes at once (serve needs train's model)
    if args.dry_run:
        scale = args.budget_s / sum(SHARES.values())
        lanes = [[n for n in chosen if n in lane]
                 for lane in (("train", "serve"), ("tests", "bench"),
                              ("profile", "compare"))]
        if "prepare" in chosen:
            one("prepare", SHARES["prepare"] * scale)
        with ThreadPoolExecutor(len(lanes)) as pool:
            list(pool.map(lambda lane: [one(n, SHARES[n] * scale) for n in lane], lanes))
        results = {"env": results["env"], **{n: results[n] for n in chosen}}
    else:  # each step's limit: its share of what is left
        for i, name in enumerate(chosen):
            left = args.budget_s - (time.perf_counter() - t0)
            one(name, left * SHARES[name] / sum(SHARES[n] for n in chosen[i:]))
    print(summary(results))
    if args.docs:
        print(f"docs: {', '.join(write_docs(results, args.data, out))}")
    return 1 if any(r["status"] != 0 and not str(r["status"]).startswith("skipped")
                    for r in results.values() if "status" in r) else 0


ROWS = {  # step -> (measurement, result with {value}, file key, format, setup)
    "bench": ("Training speed on one GPU, Multi30k batches of 16k tokens (`attn-mt bench`)",
              "{value} target tokens/s (ours, bf16)", "report.ours_tokens_per_s.bf16", ",.0f",
              "the hour config's model; eager"),
    "train": ("Multi30k de -> en on one GPU (`multi30k_gpu.yaml`)", "test2016 BLEU {value}",
              "results.test_bleu", ".2f", "the GPU config's token budget or the check's time "
              "limit"),
    "profile": ("Kernels per training step on one GPU (`attn_mt.measure.profile`)",
                "{value} kernels per step (eager)", "report.variants.eager.kernels_per_step", ".0f",
                "one 8k-token bucketed batch of multi30k_gpu.yaml"),
}


def on_gpu(env: dict) -> bool:
    """Whether `environment()` saw a CUDA GPU: the only machine whose reports go into the docs."""
    return bool(env.get("cuda_available") and env.get("device"))


def lookup(data: dict, key: str):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def write_docs(results: dict[str, dict], data: Path | None, out: Path,
               root: Path = ROOT) -> list[str]:
    """docs/gpu/<step>.json for each step that ended well with a report (machine, commit, command
    with placeholders for the machine's paths), its GPU row of docs/readme_results.json in place of
    the one it had, and the results tables rebuilt from them. Files and rows of steps not run,
    failed or without their number stay as they were; a run without a CUDA GPU (a dry run) writes
    nothing (ValueError)."""
    env = results["env"]
    if not on_gpu(env):
        raise ValueError("no CUDA GPU measured these reports: the docs hold GPU measurements")
    machine = f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}"
    written, rows = [], []
    (root / "docs" / "gpu").mkdir(parents=True, exist_ok=True)
    for name, r in results.items():
        if name == "env" or r.get("status") != 0 or not ({"report", "results"} & set(r)):
            continue
        command = r["command"].replace(str(out), "OUT").replace(str(ROOT), "CHECKOUT")
        if data is not None:
            command = command.replace(str(data.resolve()), "/path/to/multi30k")
        doc = {"machine": machine, "commit": env["commit"], "command": command,
               "status": r["status"], "seconds": r["seconds"],
               **{k: r[k] for k in ("report", "results", "metrics") if k in r}}
        # its row's number is not there: keep the old
        if name in ROWS and lookup(doc, ROWS[name][2]) is None:
            continue
        (root / "docs" / "gpu" / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        written.append(f"docs/gpu/{name}.json")
        if name in ROWS:
            measurement, result, key, fmt, setup = ROWS[name]
            rows.append({"measurement": measurement, "summary": False, "result": result,
                         "values": {"value": {"file": f"docs/gpu/{name}.json", "key": key,
                                              "format": fmt}}, "setup": setup, "machine": machine,
                         "at": env["commit"], "command": command,
                         "details": "docs/performance.md", "gpu": True})
    table_path = root / "docs" / "readme_results.json"
    table = json.loads(table_path.read_text())
    # each replaces the GPU row of its measurement, where it was
    new = {row["measurement"]: row for row in rows}
    table["rows"] = ([new.pop(r["measurement"], r) if r.get("gpu") else r for r in table["rows"]]
                     + list(new.values()))
    table_path.write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n")
    sys.path.insert(0, str(ROOT / "scripts"))
    import results_table

    for name, short in results_table.TABLES.items():  # README.md and docs/results.md, from the rows
        text = (root / name).read_text(encoding="utf-8")
        rendered = results_table.render(table, root, short, name)
        (root / name).write_text(results_table.replace_table(text, rendered, name),
                                 encoding="utf-8")
    return written


if __name__ == "__main__":
    sys.exit(main())
