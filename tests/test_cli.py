"""The installed `attn-mt` command end to end: train, translate, evaluate on a tiny config."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY

# the venv's command (pytest may run as .venv/bin/python without the venv on PATH), else PATH's
_VENV_CMD = Path(sys.executable).parent / "attn-mt"
ATTN_MT = (str(_VENV_CMD) if _VENV_CMD.exists() else shutil.which("attn-mt")) or pytest.skip(
    "attn-mt is not installed", allow_module_level=True)


def run(*args, stdin=None):
    return subprocess.run([ATTN_MT, *args], input=stdin, capture_output=True, text=True, timeout=600)


def tiny_yaml(tmp_path):
    raw: dict = {}
    for item in TINY:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in ("train", "translate", "evaluate", "download"):
        assert command in out.stdout
    module = subprocess.run([sys.executable, "-m", "attn_mt", "--help"], capture_output=True, text=True)
    assert module.returncode == 0 and "translate" in module.stdout


def test_train_translate_evaluate(tmp_path):
    cfg = tiny_yaml(tmp_path)
    out = tmp_path / "run"
    result = run("train", "--config", str(cfg), "--out", str(out), "--set", "train.max_epochs=1")
    assert result.returncode == 0, result.stderr
    assert "test BLEU" in result.stdout
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["max_epochs"] == 1 and saved["model"]["d_model"] == 32
    ckpt = str(out / "checkpoint_best.pt")

    lines = ["the dog sees a cat.", "", "a woman says that the men find a book."]
    result = run("translate", "--checkpoint", ckpt, stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == 3 and outputs[1] == ""

    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the dog sees a cat.\nthe men like the horse.\n")
    ref.write_text("der Hund sieht eine Katze.\ndie Männer mögen das Pferd.\n")
    assert run("translate", "--checkpoint", ckpt, "--input", str(src)).stdout.count("\n") == 2
    assert run("translate", "--checkpoint", ckpt, "the dog sees a cat.").stdout.count("\n") == 1
    result = run("evaluate", "--checkpoint", ckpt, "--src", str(src), "--ref", str(ref), "--json")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert 0 <= scores["bleu"] <= 100 and scores["bleu_signature"].startswith("nrefs:1")


def test_config_error_exit_code_and_one_line(tmp_path):
    cfg = tiny_yaml(tmp_path)
    result = run("train", "--config", str(cfg), "--set", "model.n_heads=3")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "n_heads=3" in result.stderr
    assert "Traceback" not in result.stderr


def test_download_offline_fails_with_one_line(tmp_path):
    env_cmd = ["env", "HF_HUB_OFFLINE=1", "HF_DATASETS_OFFLINE=1", "https_proxy=http://127.0.0.1:9",
               "HTTPS_PROXY=http://127.0.0.1:9", ATTN_MT, "--quiet", "download", "multi30k", "--out",
               str(tmp_path / "m30k")]
    result = subprocess.run(env_cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: cannot download multi30k")
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
