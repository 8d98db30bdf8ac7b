"""scripts/gpu_check.py: every step of the GPU check in its dry run (on the CPU with tiny settings),
the line naming missing packages, a step cut at its time limit, and the docs and results rows made
from the reports. The profile step runs scripts/profile_step.py, the serve step
scripts/serve_load.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from in_process import run_script

from attn_mt.device import precisions_for

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("prepare", "tests", "bench", "profile", "train", "compare", "serve")


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, prestarted_bin):
    """The dry run's folder and result. Each step is a process of its own, started, limited and
    read as on a GPU, but a fork of one that imported torch and attn-mt once (prestarted_bin's
    python), not seven fresh imports of torch (about 2.5 s each)."""
    out = tmp_path_factory.mktemp("gpu_check")
    done = run_script("gpu_check", "--dry-run", "--out", out,
                      python=prestarted_bin / "python" / "python")
    return out, done


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_report(dry_run):
    pytest.importorskip("fastapi")  # the serve step
    out, done = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("env", *STEPS):
        assert (out / f"gpu_{name}.json").exists(), name
    steps = {n: json.loads((out / f"gpu_{n}.json").read_text()) for n in STEPS}
    assert all(s["status"] == 0 and s["seconds"] <= s["limit_s"] for s in steps.values())
    bench = steps["bench"]["report"]
    ours = {row["precision"]: row["tokens_per_s"] for row in bench["train"]
            if row["model"] == "ours"}
    assert bench["ours_tokens_per_s"] == ours and list(ours) == precisions_for(torch.device("cpu"))
    assert set(steps["compare"]["report"]["models"]) == {"transformer", "rnn"}
    train = steps["train"]
    assert train["results"]["steps"] == 4 and max(r["step"] for r in train["metrics"]
                                                  if "step" in r) == 4
    eager = steps["profile"]["report"]["variants"]["eager"]  # a CPU has no device kernels
    assert eager["kernels_per_step"] is None and eager["top_level_cpu_ops_per_step"] > 10
    serve = steps["serve"]["report"]
    assert serve["all_answered"] and serve["clients_8"]["server_sentences_per_s"] > 0
    assert "train: 4 steps" in done.stdout


@pytest.mark.slow
def test_docs_and_results_rows_come_from_the_reports(dry_run, tmp_path):
    """--docs on a copy of the docs: docs/gpu/<step>.json with machine, commit and command, no
    machine path in them, and the rows of results.md rendered from those files."""
    out, done = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("README.md", "docs"):
        (shutil.copytree if name == "docs" else shutil.copy)(ROOT / name, tmp_path / name)
    shutil.rmtree(tmp_path / "docs" / "gpu", ignore_errors=True)
    module = gpu_check()
    env = {**json.loads((out / "gpu_env.json").read_text()), "cuda_available": True,
           "device": "a stand-in GPU"}
    results = {"env": env, **{n: json.loads((out / f"gpu_{n}.json").read_text()) for n in STEPS}}
    written = module.write_docs(results, None, out, root=tmp_path)
    # the bench row's number; a CPU has no kernels (profile)
    bf16 = "bf16" in precisions_for(torch.device("cpu"))
    assert sorted(written) == sorted(f"docs/gpu/{n}.json"
                                     for n in ("train", "compare", "serve", *["bench"] * bf16))
    train = json.loads((tmp_path / "docs" / "gpu" / "train.json").read_text())
    assert ({"machine", "commit", "command", "results"} <= set(train)
            and "OUT/run" in train["command"])
    assert str(out) not in (tmp_path / "docs" / "gpu" / "train.json").read_text()
    results_md = (tmp_path / "docs" / "results.md").read_text()
    test_bleu = results["train"]["results"]["test_bleu"]
    assert f"test2016 BLEU {test_bleu:.2f}" in results_md
    assert ("target tokens/s (ours, bf16)" in results_md) == bf16
    assert "kernels per step" not in results_md  # a CPU has no device kernels: no row
    # again: the rows are replaced, not added twice
    module.write_docs(results, None, out, root=tmp_path)
    assert ((tmp_path / "docs" / "results.md").read_text().count(f"test2016 BLEU {test_bleu:.2f}")
            == 1)


def a_checkout(tmp_path) -> Path:
    """A copy of what gpu_check.py writes to and reads (docs, README.md) and runs (scripts,
    configs): a test that fails never writes the real docs."""
    copy = tmp_path / "checkout"
    for name in ("scripts", "docs", "configs"):
        shutil.copytree(ROOT / name, copy / name)
    shutil.copy(ROOT / "README.md", copy / "README.md")
    return copy


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_a_dry_run_or_a_machine_without_a_gpu_never_writes_the_docs(tmp_path):
    """`--dry-run --only prepare bench --docs` wrote the CPU's toy figure into results.md as
    "Training speed on one GPU" and exited 0; now it is refused before any step runs, as --docs
    without a CUDA GPU is."""
    copy = a_checkout(tmp_path)
    before = snapshot(copy)
    script = copy / "scripts" / "gpu_check.py"
    done = run_script(script, "--dry-run", "--only", "prepare", "bench", "--docs", "--out",
                      tmp_path / "out")
    assert (done.returncode == 2 and "--docs: a dry run measures the CPU"
            in done.stderr), (done.stdout + done.stderr)
    assert not (tmp_path / "out").exists()
    if not torch.cuda.is_available():
        (tmp_path / "multi30k").mkdir()
        (tmp_path / "multi30k" / "train.de").write_text("ein Hund.\n")
        done = run_script(script, "--data", tmp_path / "multi30k", "--only", "prepare", "--docs",
                          "--out", tmp_path / "out")
        assert (done.returncode == 2 and done.stderr == "error: --docs: no CUDA GPU here; the docs "
                "hold GPU measurements\n"), done.stdout + done.stderr
        assert not (tmp_path / "out" / "gpu_prepare.json").exists()
    assert snapshot(copy) == before


def test_docs_keep_the_rows_this_run_did_not_measure(tmp_path):
    """A run of some steps replaces their rows and files; the other GPU rows, and those of failed
    steps, stay."""
    copy, module = a_checkout(tmp_path), gpu_check()
    env = {"torch": "2.x", "cuda": "12.x", "cuda_available": True, "device": "a stand-in GPU",
           "commit": "abc1234"}
    step = {"status": 0, "seconds": 1.0, "command": "python -m attn_mt"}
    bench = {**step, "report": {"ours_tokens_per_s": {"bf16": 123456.0}}}
    assert module.write_docs({"env": env,
                              "bench": bench}, None, tmp_path, root=copy) == ["docs/gpu/bench.json"]
    train = {**step, "results": {"test_bleu": 41.234}}
    failed = {**step, "status": "timeout", "report": {"ours_tokens_per_s": {"bf16": 9.0}}}
    assert module.write_docs({"env": env, "train": train, "bench": failed}, None, tmp_path,
                             root=copy) == \
        ["docs/gpu/train.json"]
    results_md = (copy / "docs" / "results.md").read_text()
    assert "123,456 target tokens/s" in results_md and "test2016 BLEU 41.23" in results_md
    assert "9 target tokens/s" not in results_md
    rows = json.loads((copy / "docs" / "readme_results.json").read_text())["rows"]
    assert sum(r.get("gpu", False) for r in rows) == 2
    before = snapshot(copy)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        module.write_docs({"env": {**env, "cuda_available": False}, "train": train}, None, tmp_path,
                          root=copy)
    assert snapshot(copy) == before


def test_a_bare_python_is_told_what_to_bring_before_any_work(tmp_path):
    """`python -S` (no site packages: no torch) stands for a bare image: one line, exit 2, nothing
    run."""
    done = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / "gpu_check.py"),
                           "--dry-run", "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert (line.startswith("missing packages:") and " torch" in line and "--target" in line
            and "PYTHONPATH" in line)
    assert not (tmp_path / "out").exists()


def test_a_step_cut_at_its_limit_still_writes_its_json(tmp_path):
    done = run_script("gpu_check", "--dry-run", "--only", "compare", "--budget-s", "2", "--out",
                      tmp_path)
    assert done.returncode == 1 and "compare: timeout" in done.stdout
    step = json.loads((tmp_path / "gpu_compare.json").read_text())
    assert step["status"] == "timeout" and step["seconds"] < 30 and "compare-rnn" in step["command"]


def test_the_gpu_steps_configs_and_overrides_load(tmp_path):
    """The real (CUDA) steps cannot run here, but their configs and every `--set` can be checked: a
    typo in a key would cost a GPU lease."""
    from attn_mt.config import load_config
    from attn_mt.config.compare_rnn import load_compare_config

    module = gpu_check()
    limits = {n: float(s) for n, s in module.SHARES.items()}
    cmds = module.steps(tmp_path / "multi30k", tmp_path / "out", False, limits)
    assert list(cmds) == list(STEPS)
    for name, cmd in cmds.items():
        if "--config" not in cmd:
            continue
        config = ROOT / cmd[cmd.index("--config") + 1]
        overrides = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
        assert (f"data.dir={tmp_path / 'multi30k'}" in overrides
                and "train.device=cuda" in overrides), name
        if name == "compare":
            setup = load_compare_config(config, overrides)
            assert (max(setup.compare.lengths) == 1024 and setup.configs["rnn"].train.batch_tokens
                    == 16384)
        else:
            cfg = load_config(config, overrides)
            assert cfg.train.device == "cuda"
            if name == "train":
                assert cfg.train.max_minutes * 60 < limits["train"] and cfg.train.compile == bool(
                    importlib.util.find_spec("triton"))
