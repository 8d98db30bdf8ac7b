"""Bad input gets a clear error: one line on stderr naming the file, key or line, a non-zero exit
status and no traceback (unless --debug); checkpoints are plain data; `translate` takes any text."""

from __future__ import annotations

import logging
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import TINY
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.cli import app
from attn_mt.config import load_config
from attn_mt.data.toy import make_toy_corpus
from attn_mt.decoding.search import translate
from attn_mt.training import rundir

ATTN_MT = str(Path(sys.executable).parent / "attn-mt")  # the installed command


def cli(*args: str, input: str | None = None):
    """Run the CLI in this process (no 2-second start); returns click's Result."""
    handlers = logging.getLogger().handlers[:]
    try:
        return CliRunner().invoke(app, ["--quiet", *map(str, args)], input=input)
    finally:
        logging.getLogger().handlers[:] = handlers  # the CLI pointed logging at the runner's stream


def write_config(path: Path, *overrides: str) -> Path:
    """The tiny config as a YAML file, with extra `section.key=value` overrides."""
    raw: dict = {}
    for item in [*TINY, *overrides]:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(raw))
    return path


def write_corpus(d: Path) -> list[str]:
    """Toy pairs as {split}.en / {split}.de files in `d`; returns the overrides that read them."""
    d.mkdir()
    for split, pairs in make_toy_corpus(20, 0).items():
        for i, lang in enumerate(("en", "de")):
            (d / f"{split}.{lang}").write_text("".join(pair[i] + "\n" for pair in pairs))
    return ["data.source=files", f"data.dir={d}"]


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("checkpoint_last.pt", "spm.model", "tokenizer.json"):
        shutil.copy(src / name, dst / name)
    return dst / "checkpoint_last.pt"


class Evil:
    """Unpickling this creates a file: what a crafted checkpoint would do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


# Each case: (setup(tmp_path, tiny_run) -> CLI arguments, exit status, texts the one stderr line holds)
def _yaml(text: str | bytes, name: str = "bad.yaml"):
    def setup(tmp, run):
        path = tmp / name
        path.write_bytes(text if isinstance(text, bytes) else text.format(tmp=tmp).encode())
        return ["train", "-c", path, "--out", tmp / "run"]
    return setup


def _data(edit, *overrides: str):
    def setup(tmp, run):
        sets = write_corpus(tmp / "data")
        edit(tmp / "data")
        return ["train", "-c", write_config(tmp / "c.yaml", *sets, *overrides), "--out", tmp / "run"]
    return setup


def _resume(edit, *overrides: str):
    def setup(tmp, run):
        out = tmp / "run"
        if edit is not None:
            edit(copy_run(run, out))
        return ["train", "-c", write_config(tmp / "c.yaml", *overrides), "--out", out, "--resume"]
    return setup


def _with_version(path: Path, version: int) -> None:
    state = torch.load(path, weights_only=True)
    state["format_version"] = version
    torch.save(state, path)


def _unwritable_out(tmp, run):
    (tmp / "file").write_text("a file, not a directory")
    return ["train", "-c", write_config(tmp / "c.yaml"), "--out", tmp / "file" / "run"]


def _evil_checkpoint(tmp, run):
    torch.save({"model": Evil(tmp / "PWNED"), "config": {}, "format_version": 1}, tmp / "evil.pt")
    return ["translate", "--checkpoint", tmp / "evil.pt", "hello"]


CASES = {
    "missing config": (lambda tmp, run: ["train", "-c", tmp / "nope.yaml"], 2,
                       ["nope.yaml: config file not found"]),
    "config is a directory": (lambda tmp, run: ["train", "-c", tmp], 2, ["cannot read config"]),
    "yaml syntax": (_yaml("train:\n  lr: 0.1\n  betas: [0.9, 0.98\n  seed: 2\n"), 2,
                    ["bad.yaml: line 4, column 7: YAML syntax error"]),
    "yaml tab": (_yaml("train:\n\tlr: 0.1\n"), 2,
                 ["bad.yaml: line 2, column 1: YAML syntax error"]),
    "config not utf-8": (_yaml(b"train:\n  device: cpu\n  # caf\xe9\n"), 2,
                         ["bad.yaml: line 3: invalid UTF-8"]),
    "unknown key": (_yaml("train:\n  lrr: 0.1\n"), 2,
                    ["bad.yaml: unknown key 'train.lrr'; allowed in train: lr,"]),
    "unknown section": (_yaml("trian:\n  lr: 0.1\n"), 2, ["unknown key 'trian'"]),
    "wrong type": (_yaml("train:\n  max_epochs: two\n"), 2,
                   ["train.max_epochs='two': expected int, got str"]),
    "section not a mapping": (_yaml("train: 5\n"), 2, ["bad.yaml: train: expected a mapping"]),
    "bad override": (lambda tmp, run: ["train", "-c", write_config(tmp / "c.yaml"), "--set", "train.lr=-1"],
                     2, ["train.lr=-1.0: must be > 0"]),
    "python tag": (_yaml("train: !!python/object/apply:os.system ['touch {tmp}/PWNED']\n"), 2,
                   ["bad.yaml: line 1, column 8: YAML syntax error", "python/object/apply:os.system"]),
    "missing data file": (_data(lambda d: (d / "valid.de").unlink()), 1, ["valid.de: data file not found"]),
    "line counts differ": (_data(lambda d: (d / "train.de").open("a").write("one more\n")), 1,
                           ["line counts differ", "train.en has 20 lines", "train.de has 21"]),
    "empty corpus": (_data(lambda d: [(d / f"train.{lang}").write_text("") for lang in ("en", "de")]), 1,
                     ["split 'train'", "has no non-empty pairs"]),
    "blank valid split": (_data(lambda d: [(d / f"valid.{la}").write_text("\n \n\n") for la in ("en", "de")]),
                          1, ["split 'valid'", "has no non-empty pairs"]),
    "filtering empties the split": (_data(lambda d: None, "data.max_len=1"), 1,
                                    ["split 'train': no pair has at most 1 tokens"]),
    "data not utf-8": (_data(lambda d: (d / "train.en").write_bytes(b"ok\nok\nbad \xff\n" + b"ok\n" * 17)),
                       1, ["train.en:3: invalid UTF-8 (byte 0xff)"]),
    "resume without checkpoint": (_resume(None), 1, ["checkpoint_last.pt: checkpoint not found"]),
    "truncated checkpoint": (_resume(lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])), 1,
                             ["checkpoint_last.pt: not a readable checkpoint (truncated or corrupt"]),
    "checkpoint of another version": (_resume(lambda p: _with_version(p, 99)), 1,
                                      ["checkpoint_last.pt: written by checkpoint format 99"]),
    "resume another model": (_resume(lambda p: None, "model.d_model=64"), 1,
                             ["--resume: model.d_model is 64, the checkpoint was trained with 32"]),
    "translate without checkpoint": (lambda tmp, run: ["translate", "--checkpoint", tmp / "nope.pt", "hi"], 1,
                                     ["nope.pt: checkpoint not found"]),
    "crafted checkpoint": (_evil_checkpoint, 1,
                           ["evil.pt: refused: holds objects other than tensors"]),
    "unwritable run directory": (_unwritable_out, 1,
                                 ["run: run directory is not writable (Not a directory)"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_clear_line(case, tmp_path, tiny_run):
    setup, status, texts = CASES[case]
    result = cli(*setup(tmp_path, tiny_run))
    assert result.exit_code == status, result.output
    assert isinstance(result.exception, SystemExit)  # ended by the error handler, not an exception
    assert len(result.stderr.splitlines()) == 1, result.stderr
    for text in texts:
        assert text in result.stderr
    assert not (tmp_path / "PWNED").exists()


def test_debug_shows_the_exception(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lrr: 1\n")
    result = cli("--debug", "train", "-c", path)
    assert type(result.exception).__name__ == "ConfigError" and "train.lrr" in str(result.exception)


def test_nearly_full_disk_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: SimpleNamespace(free=100 << 10))
    result = cli("train", "-c", write_config(tmp_path / "c.yaml"), "--out", tmp_path / "run")
    assert result.exit_code == 1 and "run: 0.1 MiB free on disk, checkpoints need about" in result.stderr
    assert not list((tmp_path / "run").glob("*.pt")) and not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("case", ["yaml syntax", "data not utf-8", "truncated checkpoint"])
def test_installed_command_prints_no_traceback(case, tmp_path, tiny_run):
    setup, status, texts = CASES[case]
    out = subprocess.run([ATTN_MT, "--quiet", *map(str, setup(tmp_path, tiny_run))], capture_output=True,
                         text=True)
    assert out.returncode == status and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) == 1 and all(t in out.stderr for t in texts)
    assert out.stderr.startswith(("error: ", "config error: "))


def test_full_disk_is_detected_before_training(tmp_path):
    """A run directory that takes no more than 256 KiB a file (RLIMIT_FSIZE) fails before any training."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.RLIM_INFINITY))

    cfg = write_config(tmp_path / "c.yaml")
    out = subprocess.run([ATTN_MT, "--quiet", "train", "-c", str(cfg), "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, preexec_fn=limit)
    assert out.returncode == 1 and out.stderr.startswith("error: ") and len(out.stderr.splitlines()) == 1
    assert "run: run directory is not writable (File too large)" in out.stderr
    assert [p.name for p in (tmp_path / "run").iterdir()] == []


def test_checkpoints_are_plain_data_and_crafted_ones_are_refused(tiny_run, tmp_path):
    def walk(x):
        if isinstance(x, dict):
            assert all(isinstance(k, (str, int)) for k in x)
            x = list(x.values())
        if isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            assert x is None or isinstance(x, (torch.Tensor, str, bytes, int, float, bool)), type(x)

    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        walk(torch.load(tiny_run / name, weights_only=True))
    torch.save({"model": Evil(tmp_path / "PWNED"), "config": {}, "format_version": 1}, tmp_path / "evil.pt")
    with pytest.raises(checkpoint.CheckpointError, match="refused"):
        checkpoint.load(tmp_path / "evil.pt")
    assert not (tmp_path / "PWNED").exists()


def test_config_reader_is_safe(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {tmp_path}/PWNED']\n")
    with pytest.raises(ValueError, match="line 1"):
        load_config(path)
    assert not (tmp_path / "PWNED").exists()


WEIRD = [
    "", "   ", "\t", "a", ".", "hello world",
    "the cat " * 3000,  # far past the model's position limit
    "\x00\x01\x02 control \x1b[31m red \x7f", "zero\u200bwidth\u200djoiner\ufeff", "emoji 😀🎉👩‍👩‍👧",
    "日本語のテキスト", "Ελληνικά και русский", "עברית والعربية", "देवनागरी ไทย", "\u0301\u0301 combining",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "\u2028line\u2029separators\x85", "\ufffd replacement", "a" * 20000,
]


def test_translate_takes_any_line(tiny_run, tmp_path):
    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")
    out = translate(model, tok, WEIRD, cfg.decode)
    assert len(out) == len(WEIRD) and all(isinstance(t, str) for t in out) and out[0] == ""
    assert translate(model, tok, [], cfg.decode) == []
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", input="\n".join(WEIRD) + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == len(WEIRD)
    (tmp_path / "in.txt").write_text("\n".join(WEIRD) + "\n", encoding="utf-8")
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "-i", tmp_path / "in.txt")
    assert result.exit_code == 0, result.output
