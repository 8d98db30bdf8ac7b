"""Faults lose nothing: checkpoints on schedule, Ctrl-C, SIGKILL while saving, bit-exact resume,
deterministic runs, and skipped non-finite steps."""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    SHORT,
    TINY,
    cli,
    ctrl_c_able,
    one_line_error,
    snapshot,
    wait_until,
    write_config,
)
from torch import nn
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.cli import app
from attn_mt.config import TrainConfig
from attn_mt.device import rng_state
from attn_mt.errors import TrainError
from attn_mt.rundir import RunDir
from attn_mt.training import trainer as trainer_mod
from attn_mt.training.evaluation import checkpoint_state
from attn_mt.training.resume import restore
from attn_mt.training.run import train
from attn_mt.training.start import setup
from attn_mt.training.trainer import TrainStep
from attn_mt.training.variants import World

ATTN_MT = str(Path(sys.executable).parent / "attn-mt")  # the installed command
SLOW = functools.partial(pytest.param, marks=pytest.mark.slow)  # a case `make test-fast` leaves out

TIMING = ("tokens_per_s", "elapsed_s", "train_seconds", "threads")
# 18 steps per epoch, 6 of the second (its end would add nothing the kills need); dropout on, so
# resuming must restore the RNG too
RESUMABLE = ("model.dropout=0.1", "train.checkpoint_every=4", "train.max_steps=24")


class Killed(BaseException):
    """Stands in for SIGKILL: nothing in `train` catches it, nothing is saved on the way out."""


def kill_at_step(monkeypatch, n: int) -> None:
    """Make the n-th optimizer step die after its forward and backward pass."""
    real, calls = TrainStep.update, [0]

    def step(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise Killed
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "update", step)


def kill_saving(name: str):
    """A killer that dies while `name` of a given step is being saved (its metrics record is
    written)."""

    def kill(monkeypatch, step: int) -> None:
        real = checkpoint.save

        def save(state, path):
            if path.name == name and state["step"] == step:
                raise Killed
            real(state, path)

        monkeypatch.setattr(checkpoint, "save", save)

    return kill


def records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def results(run_dir) -> dict:
    return {k: v for k, v in json.loads((run_dir / "results.json").read_text()).items()
            if k not in TIMING}


def assert_same_state(a: dict, b: dict) -> None:
    """Model and optimizer state of two checkpoints are equal, bit for bit."""
    assert a["step"] == b["step"] and a["model"].keys() == b["model"].keys()
    assert a.keys() == b.keys()
    # with train.ema_decay
    for weights in ("model", "trained_model") if "trained_model" in a else ("model",):
        for name in a[weights]:
            assert torch.equal(a[weights][name], b[weights][name]), (weights, name)
    opt_a, opt_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for i in opt_a:
        for key in opt_a[i]:
            assert torch.equal(opt_a[i][key], opt_b[i][key]), (i, key)
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, one per extra-override tuple, trained once per module."""
    from attn_mt.config import load_config

    runs = {}

    def get(*overrides: str):
        if overrides not in runs:
            run_dir = tmp_path_factory.mktemp("reference")
            train(load_config(None, [*TINY, *RESUMABLE, *overrides]), run_dir)
            runs[overrides] = run_dir
        return runs[overrides]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("kill, at, saved_step, overrides", [
    # mid epoch 1: resumes from the checkpoint_every checkpoint of step 8
    (kill_at_step, 11, 8, ()),
    # early in epoch 2: resumes from the end-of-epoch evaluation's checkpoint
    (kill_at_step, 20, 18, ()),
    # the evaluation's record is written, no checkpoint
    (kill_saving("checkpoint_best.pt"), 18, 16, ()),
    # ... checkpoint_best.pt is written, but not the last
    (kill_saving("checkpoint_last.pt"), 18, 16, ()),
    (kill_at_step, 8, 4, ("train.accum_steps=2",)),  # 9 steps an epoch, 2 batches a step
    # the average and the trained weights both come back
    (kill_at_step, 11, 8, ("train.ema_decay=0.9",)),
    # Muon's momenta,
    (kill_at_step, 11, 8, ("train.optimizer=muon", "train.schedule=wsd", "model.qk_norm=true",
                           # the same subword draws
                           "train.subword_sampling=0.2", "model.positions=learned")),
], ids=["mid-epoch", "after-epoch-end", "saving-best", "saving-last", "accumulation", "ema",
        "speedrun-options"])
def test_killed_run_resumes_bit_exact(tiny_cfg, tmp_path, monkeypatch, reference, kill, at,
                                      saved_step, overrides):
    cfg = tiny_cfg(*RESUMABLE, *overrides)
    kill(monkeypatch, at)
    with pytest.raises(Killed):
        train(cfg, tmp_path)
    assert checkpoint.load(tmp_path / "checkpoint_last.pt")["step"] == saved_step
    monkeypatch.undo()

    train(cfg, tmp_path, resume=True)
    ref = reference(*overrides)
    assert_same_state(checkpoint.load(tmp_path / "checkpoint_last.pt"),
                      checkpoint.load(ref / "checkpoint_last.pt"))
    assert records(tmp_path) == records(ref)  # also no record lost or written twice
    assert results(tmp_path) == results(ref)


@pytest.mark.slow
def test_same_seed_same_metrics(tiny_cfg, tmp_path, reference):
    """Two CPU runs with one seed write identical metrics and results (timings aside)."""
    ref = reference()
    train(tiny_cfg(*RESUMABLE), tmp_path)
    assert records(tmp_path) == records(ref) and len(records(ref)) == 2
    assert results(tmp_path) == results(ref)
    assert (tmp_path / "test_hyps.txt").read_text() == (ref / "test_hyps.txt").read_text()


@pytest.mark.slow
def test_evaluation_leaves_training_unchanged(tiny_cfg, tmp_path, reference):
    """Evaluating every 5 steps instead of once per epoch changes no parameter (dropout is on)."""
    train(tiny_cfg(*RESUMABLE, "train.eval_every=5"), tmp_path)
    assert_same_state(checkpoint.load(tmp_path / "checkpoint_last.pt"),
                      checkpoint.load(reference() / "checkpoint_last.pt"))


@pytest.mark.slow
def test_checkpoint_last_at_every_evaluation_and_every_n_steps(tiny_cfg, tmp_path, monkeypatch):
    saved, real = [], checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda state,
                        path: (saved.append((path.name, state["step"])),
                               real(state, path)))
    train(tiny_cfg("train.checkpoint_every=5", "train.eval_every=0"), tmp_path)
    last = [step for name, step in saved if name == "checkpoint_last.pt"]
    # 18 steps an epoch, an evaluation after each
    assert last == [5, 10, 15, 18, 20, 25, 30, 35, 36]


@pytest.mark.slow
def test_ctrl_c_saves_and_resume_continues(tmp_path):
    """SIGINT to a real `attn-mt train`: exit 130, a loadable checkpoint, one line, then
    --resume."""
    overrides = [*TINY, "train.max_epochs=1000", "train.checkpoint_every=3", "train.threads=1"]
    sets = [arg for kv in overrides for arg in ("--set", kv)]
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("name: tiny\n")
    run = tmp_path / "run"
    proc = subprocess.Popen([ATTN_MT, "--quiet", "train", "-c", str(cfg), "--out", str(run), *sets],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_able)
    try:
        wait_until(lambda: (run / "checkpoint_last.pt").exists() or proc.poll() is not None,
                   timeout=120, what="a checkpoint")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted: stopped at step ") and "--resume" in line
    step = int(line.split("step ")[1].split(";")[0])
    assert checkpoint.load(run / "checkpoint_last.pt")["step"] == step

    handlers = logging.getLogger().handlers[:]
    result = CliRunner().invoke(app, ["--quiet", "train", "-c", str(cfg), "--out", str(run),
                                      "--resume", *sets, "--set", f"train.max_steps={step + 3}"])
    logging.getLogger().handlers[:] = handlers  # the CLI pointed logging at the runner's stream
    assert result.exit_code == 0, result.output
    assert json.loads((run / "results.json").read_text())["steps"] == step + 3


@pytest.mark.slow
def test_sigkill_while_saving_never_leaves_a_broken_checkpoint(tmp_path):
    """Kill a process that saves checkpoints back to back, 25 times at random moments: the file that
    is left always loads, and holds one whole save."""
    path = tmp_path / "checkpoint_last.pt"
    payload = torch.randn(1 << 20)  # 4 MiB: saving takes a while, so most kills land inside a save
    rng, mid_save, last_step = random.Random(0), 0, 0
    for _ in range(25):
        pid = os.fork()
        if pid == 0:  # child: save forever
            try:
                step = last_step
                while True:
                    step += 1
                    checkpoint.save({"model": {"w": payload, "step": torch.tensor(step)},
                                     "config": {}, "step": step}, path)
            finally:
                os._exit(0)
        wait_until(path.exists, timeout=60, interval=0.001, what="the first save")
        time.sleep(rng.uniform(0, 0.05))  # a random moment: what the test is about
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        mid_save += any(tmp_path.glob(".checkpoint_last.pt.*.tmp"))
        state = checkpoint.load(path)
        assert (torch.equal(state["model"]["w"], payload)
                and state["model"]["step"].item() == state["step"])
        assert state["step"] >= last_step
        last_step = state["step"]
    assert mid_save >= 10  # the kills did land while a file was being written
    checkpoint.save({"model": {}, "config": {}}, path)
    # temp files of killed savers are gone
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def poison_losses(monkeypatch, bad_calls) -> None:
    """Training losses number `bad_calls` (1-based) become NaN or inf, gradients included."""
    real, calls = trainer_mod.token_loss, [0]

    def token_loss(*args, **kwargs):
        loss = real(*args, **kwargs)
        if not torch.is_grad_enabled():  # evaluation
            return loss
        calls[0] += 1
        if calls[0] in bad_calls:
            return loss * (float("nan") if calls[0] % 2 else float("inf"))
        return loss

    monkeypatch.setattr(trainer_mod, "token_loss", token_loss)


@pytest.mark.slow
def test_non_finite_loss_skips_the_step_and_is_counted(tiny_cfg, tmp_path, monkeypatch):
    poison_losses(monkeypatch, {4, 5, 9})
    train(tiny_cfg("train.max_epochs=1"), tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["steps"] == 18 - 3 and res["skipped_steps"] == 3
    assert records(tmp_path)[-1]["skipped_steps"] == 3
    state = checkpoint.load(tmp_path / "checkpoint_last.pt")
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_too_many_non_finite_losses_stop_the_run(tiny_cfg, tmp_path, monkeypatch):
    poison_losses(monkeypatch, set(range(3, 100)))
    with pytest.raises(TrainError, match=r"at step 2: 4 non-finite losses in a row "
                       r"\(train.max_bad_steps\)"):
        train(tiny_cfg("train.max_bad_steps=4"), tmp_path)


def test_non_finite_gradient_skips_the_step():
    """A finite loss with an infinite gradient changes neither the weights nor the optimizer."""
    layer = nn.Linear(2, 2)
    step = TrainStep(layer, TrainConfig(clip_norm=1.0), torch.device("cpu"), "fp32")
    opt = step.opt
    before = [p.detach().clone() for p in layer.parameters()]
    layer.weight.grad, layer.bias.grad = torch.full((2, 2), float("inf")), torch.zeros(2)
    assert step.update(torch.tensor(1.0), lr=1e-3) is None
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))
    assert not opt.state and layer.weight.grad is None
    layer.weight.grad, layer.bias.grad = torch.ones(2, 2), torch.ones(2)
    assert step.update(torch.tensor(1.0), lr=1e-3) == 1.0
    assert not torch.equal(before[0], layer.weight)


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> tuple[Path, Path]:
    """(config, run) of a 3-step run trained by the CLI, once: each test resumes a copy."""
    folder = tmp_path_factory.mktemp("three_steps")
    config = write_config(folder / "c.yaml", "train.max_steps=3", "train.bleu_sentences=5")
    assert cli("train", "-c", config, "--out", folder / "run").exit_code == 0
    return config, folder / "run"


@pytest.mark.parametrize("change", [*map(SLOW, ["train.batch_tokens=500", "train.accum_steps=2",
                                                "data.max_len=30", "train.lr=1e-3",
                                                "tokenizer.vocab_size=100"]), "train.seed=7"])
def test_resume_refuses_changes_that_alter_the_run(change, tmp_path, three_steps):
    config, run = three_steps[0], shutil.copytree(three_steps[1], tmp_path / "run")
    before = snapshot(run)
    result = cli("train", "-c", config, "--out", run, "--resume", "--set", "train.max_steps=6",
                 "--set", change)
    one_line_error(result, 1, f"--resume: {change.split('=')[0]} is")
    assert snapshot(run) == before


@pytest.mark.slow
def test_resuming_a_finished_run_trains_nothing_and_a_larger_budget_goes_on(tmp_path,
                                                                            three_steps):
    config, run = three_steps[0], shutil.copytree(three_steps[1], tmp_path / "run")
    before = snapshot(run)
    again = cli("train", "-c", config, "--out", run, "--resume")
    assert again.exit_code == 0 and "test BLEU" in again.stdout
    assert {k: v for k, v in snapshot(run).items() if k != "config.yaml"} == \
        {k: v for k, v in before.items() if k != "config.yaml"}
    more = cli("train", "-c", config, "--out", run, "--resume", "--set", "train.max_steps=5")
    assert more.exit_code == 0, more.output
    assert ([json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
            == [3, 5])


def test_resuming_after_early_stopping_does_not_train_again(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.max_epochs=50", "train.eval_every=2", "train.patience=1",
                   "train.bleu_sentences=5")
    train(cfg, tmp_path)
    records = (tmp_path / "metrics.jsonl").read_text()
    assert len(records.splitlines()) < 25  # it stopped early
    train(cfg, tmp_path, resume=True)
    assert (tmp_path / "metrics.jsonl").read_text() == records


def test_gradient_scaler_state_is_saved_and_restored(tiny_cfg, tmp_path):
    cfg = tiny_cfg(*SHORT)
    run = setup(cfg, RunDir(tmp_path), resume=False)
    run.trainer.scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=1234.0)
    state = checkpoint_state(run, [rng_state(torch.device("cpu"))])
    other = setup(cfg, RunDir(tmp_path), resume=False)
    other.trainer.scaler = torch.amp.GradScaler("cpu", enabled=True)
    restore(state, other.trainer, other.corpus.tok, cfg, World())
    assert other.trainer.scaler.get_scale() == 1234.0


def test_another_world_size_gives_every_rank_its_own_random_stream(tiny_cfg, tmp_path):
    cfg = tiny_cfg(*SHORT)
    run = setup(cfg, RunDir(tmp_path), resume=False)
    state = checkpoint_state(run, [rng_state(torch.device("cpu"))])  # written by one process
    draws = []
    for rank in (0, 1):
        restore(state, run.trainer, run.corpus.tok, cfg, World(rank=rank, size=2))
        draws.append(torch.rand(4))
    assert not torch.equal(draws[0], draws[1])
