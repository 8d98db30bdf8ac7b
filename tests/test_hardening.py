"""Reliability, second pass: no run overwritten, no drift on resume, no traceback on hostile input."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY
from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.device import rng_state, set_rng_state
from attn_mt.training import rundir
from attn_mt.training.distributed import World
from attn_mt.training.run import checkpoint_state, restore, setup, train
from attn_mt.training.rundir import RunDir

ATTN_MT = str(Path(sys.executable).parent / "attn-mt")
SHORT = ("train.max_epochs=1", "train.bleu_sentences=5")


def cli(*args):
    """The CLI in this process, --quiet: only the error line on stderr."""
    handlers = logging.getLogger().handlers[:]
    try:
        return CliRunner().invoke(app, ["--quiet", *map(str, args)])
    finally:
        logging.getLogger().handlers[:] = handlers


def tiny_yaml(path: Path, *extra: str) -> Path:
    lines: dict[str, list[str]] = {}
    for item in [*TINY, *extra]:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        lines.setdefault(section, []).append(f"  {name}: {value}")
    path.write_text("".join(f"{s}:\n" + "\n".join(v) + "\n" for s, v in lines.items()))
    return path


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


def one_line_error(result, status: int, *texts: str) -> None:
    assert result.exit_code == status, result.output
    assert isinstance(result.exception, SystemExit)
    assert len(result.stderr.splitlines()) == 1, result.stderr
    for text in texts:
        assert text in result.stderr, result.stderr


# 1. validation pairs longer than the model allows
def test_validation_longer_than_the_position_table_is_cut_not_a_crash(tiny_cfg, tmp_path):
    cfg = tiny_cfg("model.max_positions=12", *SHORT)
    train(cfg, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["steps"] > 0


# 2. a fresh run into an earlier run's directory
def test_fresh_run_into_an_earlier_run_is_refused_and_overwrite_clears_it(tmp_path):
    config = tiny_yaml(tmp_path / "c.yaml", "train.max_epochs=2", "train.keep_last=2", "train.bleu_sentences=5")
    run = tmp_path / "run"
    assert cli("train", "-c", config, "--out", run).exit_code == 0
    before = snapshot(run)
    again = cli("train", "-c", config, "--out", run, "--set", "train.max_epochs=1")
    one_line_error(again, 1, "holds an earlier run", "--resume", "--overwrite")
    assert snapshot(run) == before  # nothing touched
    assert cli("train", "-c", config, "--out", run, "--set", "train.max_epochs=1", "--overwrite").exit_code == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    snaps = sorted(p.name for p in run.glob("checkpoint_step*.pt"))
    assert len(steps) == 1 and snaps == [f"checkpoint_step{steps[0]:07d}.pt"]  # none of the old run's left
    assert json.loads((run / "results.json").read_text())["steps"] == steps[0]
    both = cli("train", "-c", config, "--out", run, "--resume", "--overwrite")
    assert both.exit_code == 2 and "one of --resume and --overwrite" in both.output


# 3. --resume with settings that change the data order or the optimisation
@pytest.mark.parametrize("change", ["train.batch_tokens=500", "train.seed=7", "train.accum_steps=2",
                                    "data.max_len=30", "train.lr=1e-3", "tokenizer.vocab_size=100"])
def test_resume_refuses_changes_that_alter_the_run(change, tmp_path):
    config = tiny_yaml(tmp_path / "c.yaml", "train.max_steps=3", "train.bleu_sentences=5")
    run = tmp_path / "run"
    assert cli("train", "-c", config, "--out", run).exit_code == 0
    before = snapshot(run)
    result = cli("train", "-c", config, "--out", run, "--resume", "--set", "train.max_steps=6", "--set", change)
    one_line_error(result, 1, f"--resume: {change.split('=')[0]} is")
    assert snapshot(run) == before


# 4. resuming a finished run; budget keys may grow
def test_resuming_a_finished_run_trains_nothing_and_a_larger_budget_goes_on(tmp_path):
    config = tiny_yaml(tmp_path / "c.yaml", "train.max_steps=3", "train.bleu_sentences=5")
    run = tmp_path / "run"
    assert cli("train", "-c", config, "--out", run).exit_code == 0
    before = snapshot(run)
    again = cli("train", "-c", config, "--out", run, "--resume")
    assert again.exit_code == 0 and "test BLEU" in again.stdout
    assert {k: v for k, v in snapshot(run).items() if k != "config.yaml"} == \
        {k: v for k, v in before.items() if k != "config.yaml"}
    more = cli("train", "-c", config, "--out", run, "--resume", "--set", "train.max_steps=5")
    assert more.exit_code == 0, more.output
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [3, 5]


def test_resuming_after_early_stopping_does_not_train_again(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.max_epochs=50", "train.eval_every=2", "train.patience=1", "train.bleu_sentences=5")
    train(cfg, tmp_path)
    records = (tmp_path / "metrics.jsonl").read_text()
    assert len(records.splitlines()) < 25  # it stopped early
    train(cfg, tmp_path, resume=True)
    assert (tmp_path / "metrics.jsonl").read_text() == records


# 3. the gradient scaler's state travels in the checkpoint
def test_gradient_scaler_state_is_saved_and_restored(tiny_cfg, tmp_path):
    cfg = tiny_cfg(*SHORT)
    run = setup(cfg, RunDir(tmp_path), resume=False)
    run.trainer.scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=1234.0)
    state = checkpoint_state(run, [rng_state(torch.device("cpu"))])
    other = setup(cfg, RunDir(tmp_path), resume=False)
    other.trainer.scaler = torch.amp.GradScaler("cpu", enabled=True)
    restore(state, other.trainer, other.corpus.tok, cfg, World())
    assert other.trainer.scaler.get_scale() == 1234.0


# 5. resume on another machine: fewer GPUs, another torchrun world size
def test_cuda_rng_states_of_missing_gpus_are_skipped(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, i: calls.append(i))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: calls.extend(range(len(states))))
    saved = {"torch": torch.get_rng_state(), "cuda": [torch.ByteTensor(8), torch.ByteTensor(8)]}
    set_rng_state(saved, torch.device("cuda"))
    assert calls == [0]


def test_another_world_size_gives_every_rank_its_own_random_stream(tiny_cfg, tmp_path):
    cfg = tiny_cfg(*SHORT)
    run = setup(cfg, RunDir(tmp_path), resume=False)
    state = checkpoint_state(run, [rng_state(torch.device("cpu"))])  # written by one process
    draws = []
    for rank in (0, 1):
        restore(state, run.trainer, run.corpus.tok, cfg, World(rank=rank, size=2))
        draws.append(torch.rand(4))
    assert not torch.equal(draws[0], draws[1])


# 6. hostile numbers, YAML and JSONL
@pytest.mark.parametrize("override,text", [
    ("train.lr=nan", "train.lr=nan: must be a finite number"),
    ("decode.max_len_a=nan", "decode.max_len_a=nan: must be a finite number"),
    ("train.lr=inf", "must be a finite number"),
    ("model.d_model=1000000000", "model.d_model=1000000000: must be at most"),
    ("train.batch_tokens=1000000000000", "train.batch_tokens=1000000000000: must be at most"),
    ("train.seed=-3", "train.seed=-3: must be >= 0"),
])
def test_impossible_numbers_fail_before_any_data_is_read(override, text, tmp_path):
    result = cli("train", "-c", tiny_yaml(tmp_path / "c.yaml"), "--out", tmp_path / "run", "--set", override)
    one_line_error(result, 2, text)
    assert not (tmp_path / "run").exists()


def test_yaml_alias_bomb_gives_a_short_message(tmp_path):
    """9 levels of 9 aliases: 9^9 elements if an error message printed the value."""
    levels = ["&l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    for key in ("model:\n  d_model", "train:\n  betas", "compare_me"):
        bomb = tmp_path / "bomb.yaml"
        bomb.write_text(f"{key}: [{', '.join(levels)}]\n")
        result = cli("train", "-c", bomb, "--out", tmp_path / "run")
        assert result.exit_code == 2 and len(result.stderr) < 400, result.stderr[:400]


@pytest.mark.parametrize("line,text", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                       ('{"translation": {"en": 1' + "0" * 5000 + ', "de": "x"}}', ":1: expected")])
def test_hostile_jsonl_lines_are_one_line_errors(line, text, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid", "test"):
        (data / f"{split}.jsonl").write_text(line + "\n")
    config = tiny_yaml(tmp_path / "c.yaml", "data.source=jsonl", f"data.dir={data}")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 1, ".jsonl:1", text)


# 7. errors that used to escape as tracebacks
def test_a_vocabulary_too_small_for_the_characters_is_a_config_error(tmp_path):
    config = tiny_yaml(tmp_path / "c.yaml", "tokenizer.vocab_size=16")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 2, "tokenizer.vocab_size=16")


@pytest.mark.parametrize("rows,text", [
    ({"translation": [{"en": "a b", "fr": "x"}]}, "'de' is missing"),
    ({"en": ["a b"], "de": [None]}, "'de' is NoneType"),
])
def test_hf_rows_without_a_language_are_one_line_errors(rows, text, tmp_path):
    import datasets

    for split in ("train", "valid", "test"):
        datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds" / split))
    datasets.DatasetDict({s: datasets.load_from_disk(str(tmp_path / "ds" / s)) for s in ("train", "valid", "test")}
                         ).save_to_disk(str(tmp_path / "hf"))
    config = tiny_yaml(tmp_path / "c.yaml", "data.source=hf", f"data.dir={tmp_path / 'hf'}")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 1, "row 0", text)


def test_unknown_device_is_one_line(tiny_run):
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--device", "gpu", "a dog.")
    one_line_error(result, 1, "device 'gpu' is not one of")


@pytest.mark.parametrize("name", ["metrics.jsonl", "results.json", "test_hyps.txt", "spm.model"])
def test_a_full_disk_while_writing_is_one_line(name, tmp_path, monkeypatch):
    real_open, real_write = open, Path.write_bytes

    def full(path):
        if Path(path).name in (name, f".{name}.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("builtins.open", lambda p, *a, **k: full(p) or real_open(p, *a, **k))
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: full(self) or real_write(self, data))
    monkeypatch.setattr(Path, "write_text", lambda self, text, **k: full(self) or real_open(
        self, "w", **k).write(text))
    result = cli("train", "-c", tiny_yaml(tmp_path / "c.yaml", *SHORT), "--out", tmp_path / "run")
    one_line_error(result, 1, name, "No space left on device")


# 8. the free-space check counts the snapshots and their average
def test_free_space_check_counts_kept_snapshots(tmp_path, monkeypatch):
    config = tiny_yaml(tmp_path / "c.yaml", *SHORT)
    size = 50_000 * 4  # about the tiny model's weights in bytes, well above
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: SimpleNamespace(free=12 * size))
    refused = cli("train", "-c", config, "--out", tmp_path / "a", "--set", "train.keep_last=20")
    one_line_error(refused, 1, "free on disk")
    assert cli("train", "-c", config, "--out", tmp_path / "b", "--set", "train.keep_last=0").exit_code == 0


# 9. a lone carriage return inside a line of stdin
def test_stdin_lines_end_at_newline_only(tiny_run):
    out = subprocess.run([ATTN_MT, "--quiet", "translate", "--checkpoint", str(tiny_run / "checkpoint_best.pt"),
                          "--device", "cpu"], input=b"the dog\rsees a cat.\r\nthe old man.\n", capture_output=True)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.decode().splitlines()) == 2
