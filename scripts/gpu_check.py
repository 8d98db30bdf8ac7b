"""The whole pipeline on one CUDA GPU, within about 8 minutes, writing JSON files into an output folder.

    python scripts/gpu_check.py --data /path/to/multi30k --out /path/to/out

Steps (each a subprocess of this interpreter running `python -m attn_mt`, so the checkout needs no
install; each has its own time limit, and a failed step does not stop the others):
    gpu_env.json      device, torch, CUDA, bf16 support, nvidia-smi
    gpu_tests.json    `pytest -m gpu` (tests/test_gpu.py): bf16/fp16 steps, CPU = GPU loss, caches, checkpoints
    gpu_bench.json    `attn-mt bench` on Multi30k with 16k-token batches: ours vs torch.nn.Transformer, MFU
    gpu_compare.json  `attn-mt compare-rnn`: a minute or two per model, cost against length to 1024 tokens
    gpu_train.json    a de->en Multi30k training run of a few minutes: its results.json and metrics
and prints a summary. Nothing is downloaded: the data comes from --data ({split}.{de,en} files).

`--dry-run` runs every step on the CPU with tiny settings on the built-in toy corpus (the GPU tests
then skip), so everything but CUDA itself is exercised before device time is spent; the test suite
runs it that way (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def steps(data: Path, out: Path, dry: bool) -> dict[str, tuple[list[str], int]]:
    """name -> (command after `python`, time limit in seconds)."""
    cli = ["-m", "attn_mt", "--quiet"]
    if dry:  # tiny models on the toy corpus, on the CPU
        tiny = ["data.source=toy", "data.src_lang=en", "data.tgt_lang=de", "data.toy_size=300",
                "tokenizer.vocab_size=120", "train.device=cpu", "train.precision=fp32", "train.bleu_sentences=20",
                "decode.max_len_b=5"]
        model = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]
        sets = lambda keys: [x for k in keys for x in ("--set", k)]  # noqa: E731
        return {
            "tests": (["-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests" / "test_gpu.py")], 120),
            "bench": ([*cli, "bench", "--config", "configs/toy.yaml", *sets([*tiny, *model, "train.batch_tokens=600"]),
                       "--repeats", "1", "--steps", "1", "--sentences", "5", "--json", str(out / "bench.json")],
                      300),
            "compare": ([*cli, "compare-rnn", "--config", "configs/compare.yaml", "--quick", "--out",
                         str(out / "compare"), *sets(["compare.budget_minutes=0.02", "compare.eval_every_minutes=0.02",
                                                     "compare.lengths=[8]", "compare.length_batch_tokens=256",
                                                     "compare.repeats=1", "compare.decode_sentences=8",
                                                     "compare.decode_repeats=1", "compare.beam_size=2",
                                                     "decode.beam_size=2", "decode.max_len_b=4",
                                                     "train.device=cpu", "train.precision=fp32",
                                                     "data.toy_size=300", "tokenizer.vocab_size=120",
                                                     "train.bleu_sentences=5", "train.batch_tokens=500",
                                                     "transformer.model.d_model=32", "transformer.model.n_heads=2",
                                                     "transformer.model.n_layers=1", "transformer.model.d_ff=64",
                                                     "rnn.model.d_embed=32", "rnn.model.d_hidden=24",
                                                     "rnn.model.d_attn=32"])], 300),
            "train": ([*cli, "train", "--config", "configs/toy.yaml", "--out", str(out / "run"),
                       *sets([*tiny, *model, "train.max_steps=4", "train.batch_tokens=600"])], 300),
        }
    m30k = [f"data.dir={data}"]
    gpu = ["train.device=cuda", "train.batch_tokens=16384"]
    sets = lambda keys: [x for k in keys for x in ("--set", k)]  # noqa: E731
    return {
        "tests": (["-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests" / "test_gpu.py")], 90),
        "bench": ([*cli, "bench", "--config", "configs/multi30k.yaml", *sets([*m30k, *gpu]), "--repeats", "5",
                   "--steps", "4", "--sentences", "500", "--json", str(out / "bench.json")], 120),
        "compare": ([*cli, "compare-rnn", "--config", "configs/compare.yaml", "--out", str(out / "compare"),
                     *sets([*m30k, *gpu, "compare.budget_minutes=1", "compare.eval_every_minutes=0.25",
                            "compare.lengths=[8,16,32,64,128,256,512,1024]", "compare.length_batch_tokens=16384",
                            "transformer.model.max_positions=1040", "rnn.model.max_positions=1040",
                            "compare.decode_sentences=1000"])], 240),
        "train": ([*cli, "train", "--config", "configs/multi30k.yaml", "--out", str(out / "run"),
                   *sets([*m30k, *gpu, "train.max_minutes=2.5", "train.warmup_steps=200", "train.keep_last=0",
                          "train.eval_every=100"])], 240),
    }


def run_step(name: str, cmd: list[str], limit: int, out: Path) -> dict:
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=limit)
        status, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        status, log = "timeout", f"{e.stdout or ''}{e.stderr or ''}"
        log = log.decode(errors="replace") if isinstance(log, bytes) else log
    (out / f"{name}.log").write_text(log)
    result = {"step": name, "status": status, "seconds": round(time.perf_counter() - t0, 1),
              "command": " ".join(["python", *cmd]), "tail": log.splitlines()[-15:]}
    print(f"{name}: {'ok' if status == 0 else status} in {result['seconds']} s", flush=True)
    return result


def environment() -> dict:
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        env.update(device=torch.cuda.get_device_name(), bf16=torch.cuda.is_bf16_supported(),
                   memory_gb=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    if shutil.which("nvidia-smi"):
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    return env


def collect(out: Path, results: dict[str, dict]) -> None:
    """The reports each step wrote, folded into gpu_*.json next to the step's status."""
    report = out / "compare" / "report.json"
    if report.exists():
        results["compare"]["report"] = json.loads(report.read_text())
    from attn_mt.rundir import RunDir

    run = RunDir(out / "run")
    if run.results.exists():
        results["train"]["results"], results["train"]["metrics"] = run.read_results(), run.read_metrics()
    bench = out / "bench.json"
    if bench.exists():
        results["bench"]["report"] = json.loads(bench.read_text())
    for name, result in results.items():
        (out / f"gpu_{name}.json").write_text(json.dumps(result, indent=2) + "\n")


def summary(results: dict[str, dict]) -> str:
    lines = [f"{name}: {r['status']} ({r['seconds']} s)" for name, r in results.items() if "status" in r]
    bench = results.get("bench", {}).get("report")
    if bench:
        lines.append(f"bench: ours {bench['ours_tokens_per_s']} tokens/s, ratio to torch.nn.Transformer "
                     f"{bench['ratio']}, MFU {bench['mfu'].get('ours')}")
    cmp = results.get("compare", {}).get("report")
    if cmp:
        for kind, m in cmp["models"].items():
            lines.append(f"compare {kind}: {m['train_tokens_per_s']} tokens/s, test BLEU {m.get('test_bleu')}")
    train = results.get("train", {}).get("results")
    if train:
        lines.append(f"train: {train['steps']} steps, test BLEU {train['test_bleu']} ({train['precision']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="Multi30k folder ({split}.{de,en})")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny settings on the CPU, toy corpus")
    parser.add_argument("--only", nargs="*", help="run only these steps")
    args = parser.parse_args()
    if not args.dry_run and not (args.data and (args.data / "train.de").exists()):
        parser.error(f"--data {args.data}: no train.de there (Multi30k {{split}}.{{de,en}} files)")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {"env": environment()}
    (args.out / "gpu_env.json").write_text(json.dumps(results["env"], indent=2) + "\n")
    for name, (cmd, limit) in steps(args.data and args.data.resolve(), args.out.resolve(), args.dry_run).items():
        if not args.only or name in args.only:
            results[name] = run_step(name, cmd, limit, args.out)
    collect(args.out, results)
    print(summary(results))
    if any(r.get("status") not in (0, None) for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
