"""Deferred checks (train.skip_check=device, the CUDA default), forced on the CPU: the same weights
and losses as reading the device every step, a non-finite step undone on the device and counted at
the next read, bit-exact resume, and max_bad_steps still stopping the run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import TINY
from torch import nn

from attn_mt import checkpoint
from attn_mt.config import ConfigError, TrainConfig, load_config
from attn_mt.data.corpus import load_corpus
from attn_mt.models import build_model
from attn_mt.training import trainer as trainer_mod
from attn_mt.training.deferred import DeviceChecks
from attn_mt.training.run import TrainError, train
from attn_mt.training.trainer import Trainer, TrainStep

CPU = torch.device("cpu")
DEVICE = "train.skip_check=device"


@pytest.fixture(scope="module")
def corpus():
    cfg = load_config(None, TINY)
    return cfg, load_corpus(cfg, cfg.model.max_positions)


def trainer(cfg, corpus, check: str, **train) -> Trainer:
    cfg = replace(cfg, train=replace(cfg.train, skip_check=check, **train))
    torch.manual_seed(0)
    tr = Trainer(build_model(cfg.model, **corpus.tok.sizes()), cfg, corpus, CPU, "fp32")
    assert isinstance(tr.checks, DeviceChecks) == (check == "device")
    return tr


def poison(monkeypatch, bad_calls: set[int]) -> None:
    """Training losses number `bad_calls` (1-based) become NaN or inf, their gradients too."""
    real, calls = trainer_mod.token_loss, [0]

    def token_loss(*args, **kwargs):
        loss = real(*args, **kwargs)
        calls[0] += 1
        return (loss * (float("nan") if calls[0] % 2 else float("inf")) if calls[0] in bad_calls
                else loss)

    monkeypatch.setattr(trainer_mod, "token_loss", token_loss)


def run_steps(tr: Trainer, n: int, read_every: int) -> list[tuple[float, int]]:
    """`n` steps, reading (deferred) every `read_every`; the (window loss, window tokens) at each
    read."""
    windows = []
    torch.manual_seed(3)
    for i in range(1, n + 1):
        tr.step(lambda: 0.0)
        if i % read_every == 0:
            tr.read()
            windows.append((tr.state.window_loss, tr.state.window_tokens))
    tr.read()
    return windows


def assert_same_training(a: Trainer, b: Trainer) -> None:
    """Weights, optimizer state, averaged weights and counters equal, bit for bit."""
    for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for key in sa[i]:
            assert torch.equal(sa[i][key], sb[i][key]), (i, key)
    if a.ema is not None:
        assert all(torch.equal(x, y) for x, y in zip(a.ema.weights, b.ema.weights, strict=True))
        assert a.ema.updates == b.ema.updates
    keys = ("step", "tokens", "skipped_steps", "bad_steps", "window_loss", "window_tokens",
            "batch_in_epoch")
    assert [getattr(a.state, k) for k in keys] == [getattr(b.state, k) for k in keys]


@pytest.mark.parametrize("options", [{}, {"optimizer": "muon", "ema_decay": 0.9},
                                     {"accum_steps": 2}, {"fused": True, "ema_decay": 0.9}],
                         ids=["adamw", "muon-ema", "accumulation", "fused-ema"])
def test_deferred_steps_equal_host_steps_bit_for_bit(corpus, options):
    """All steps finite: the update is the same arithmetic, `where` keeps it as it is, and the loss
    sum is the host's float64 additions in the same order, so weights and logged losses match
    exactly."""
    cfg, corpus = corpus
    options = dict(options)
    made = fused if options.pop("fused", False) else (lambda tr: tr)
    host, device = (made(trainer(cfg, corpus, check, **options)) for check in ("host", "device"))
    windows = [run_steps(tr, 7, 3) for tr in (host, device)]
    assert windows[0] == windows[1] and len(windows[0]) == 2
    assert device.grad_norm == host.grad_norm and host.grad_norm is not None
    assert_same_training(host, device)
    assert host.state.step == 7


def fused(tr: Trainer) -> Trainer:
    """The trainer with torch's fused AdamW, CUDA's default (on the CPU too, where torch has it)."""
    tc = tr.cfg
    tr.opt = torch.optim.AdamW(tr.model.parameters(), lr=tc.lr, betas=tc.betas,
                               weight_decay=tc.weight_decay, fused=True)
    return tr


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "fused"])
def test_skipped_steps_change_nothing_and_are_counted_at_the_read(corpus, monkeypatch, optimizer):
    """Steps 1 (whose update would create the optimizer state) and 4 are non-finite. At a constant
    rate (no warmup, so counting attempted steps changes nothing) the run equals the host-checked
    one. The fused AdamW skips by itself (found_inf); the others are put back by `where`."""
    cfg, corpus = corpus
    runs = []
    for check in ("host", "device"):
        poison(monkeypatch, {1, 4})
        tr = trainer(cfg, corpus, check, optimizer="adamw" if optimizer == "fused" else optimizer,
                     warmup_steps=0, weight_decay=0.01)
        if optimizer == "fused":
            tr = fused(tr)
        run_steps(tr, 6, 10)
        runs.append(tr)
    assert runs[1].state.skipped_steps == 2 and runs[1].state.step == 4
    assert runs[1].checks.guard.native == (optimizer == "fused")
    assert_same_training(*runs)


def test_a_skipped_step_leaves_weights_and_optimizer_as_they_were(corpus, monkeypatch):
    cfg, corpus = corpus
    tr = trainer(cfg, corpus, "device", ema_decay=0.9)
    run_steps(tr, 2, 2)
    weights = [t.clone() for t in tr.model.state_dict().values()]
    moments = {i: {k: v.clone() for k, v in s.items()} for i,
               s in tr.opt.state_dict()["state"].items()}
    average = [w.clone() for w in tr.ema.weights]
    poison(monkeypatch, {1})
    tr.step(lambda: 0.0)
    assert tr.state.skipped_steps == 0 and tr.checks.pending == 1  # nothing read yet
    assert all(torch.equal(a, b) for a, b in zip(weights, tr.model.state_dict().values(),
                                                 strict=True))
    after = tr.opt.state_dict()["state"]
    assert all(torch.equal(moments[i][k], after[i][k]) for i in moments for k in moments[i])
    assert all(torch.equal(a, b) for a, b in zip(average, tr.ema.weights, strict=True))
    tr.read()
    assert ((tr.state.step, tr.state.skipped_steps, tr.state.bad_steps, tr.ema.updates)
            == (2, 1, 1, 2))


def test_an_infinite_gradient_is_undone_on_the_device():
    """A finite loss, an infinite gradient: `finite` is false and nothing changed, state made by the
    step included (zeros and step 0: a fresh AdamW)."""
    layer = nn.Linear(2, 2)
    step = TrainStep(layer, TrainConfig(clip_norm=1.0, skip_check="device"), CPU, "fp32")
    before = [p.detach().clone() for p in layer.parameters()]
    layer.weight.grad, layer.bias.grad = torch.full((2, 2), float("inf")), torch.zeros(2)
    step.update(torch.tensor(1.0), lr=1e-3)
    assert not step.checks.finite and step.checks.norm.isinf()
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))
    assert all(not v.any() for s in step.opt.state.values() for v in s.values())
    layer.weight.grad, layer.bias.grad = torch.ones(2, 2), torch.ones(2)
    step.update(torch.tensor(1.0), lr=1e-3)
    assert step.checks.finite
    assert not torch.equal(before[0], layer.weight)


def test_max_bad_steps_stops_the_run_at_a_read(tiny_cfg, tmp_path, monkeypatch):
    """Steps 3 on are non-finite; the read at step 5 (log_every) sees 3 in a row, the one at 10
    eight."""
    poison(monkeypatch, set(range(3, 100)))
    with pytest.raises(TrainError, match=r"at step 2: 8 non-finite losses in a row "
                       r"\(train.max_bad_steps\)"):
        train(tiny_cfg(DEVICE, "train.max_bad_steps=4"), tmp_path)


def test_a_deferred_run_writes_what_a_host_checked_one_does(tiny_cfg, tmp_path):
    """run.py's reads (progress, evaluation, checkpoint, limits) give the same metrics and
    checkpoint."""
    overrides = ("train.max_epochs=1", "train.eval_every=7", "train.checkpoint_every=4",
                 "train.max_steps=16")
    for check in ("host", "device"):
        train(tiny_cfg(*overrides, f"train.skip_check={check}"), tmp_path / check)
    lines = [[{k: v for k, v in json.loads(line).items() if k not in ("tokens_per_s", "elapsed_s")}
              for line in (tmp_path / c / "metrics.jsonl").read_text().splitlines()]
             for c in ("host", "device")]
    assert lines[0] == lines[1] and [r["step"] for r in lines[0]] == [7, 14, 16]
    a, b = (checkpoint.load(tmp_path / c / "checkpoint_last.pt") for c in ("host", "device"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert (a["step"], a["tokens"], a["window_loss"]) == (b["step"], b["tokens"], b["window_loss"])


# dropout on: resuming must restore the RNG; 16 steps of the 18-step epoch, evaluated at 8 and 16
# (before and after the kill)
KILLED = ("model.dropout=0.1", "train.checkpoint_every=4", "train.ema_decay=0.9",
          "train.max_steps=16", "train.eval_every=8")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The run of KILLED with deferred checks, never stopped: trained once for the cases below."""
    run_dir = tmp_path_factory.mktemp("whole")
    train(load_config(None, [*TINY, *KILLED, DEVICE]), run_dir)
    return run_dir


@pytest.mark.parametrize("first", ["device", "host"])
def test_a_killed_deferred_run_resumes_bit_exact(tiny_cfg, tmp_path, monkeypatch, whole, first):
    """Killed after step 10's backward pass: resumed from step 8's checkpoint, it ends as the run
    that was never stopped (checkpoints are written after a read, so their counters are exact). A
    run begun with host checks (as on a CPU) may go on with deferred ones (as on a GPU): the same,
    while no step is skipped."""
    cfg = tiny_cfg(*KILLED, DEVICE)

    class Killed(BaseException):
        pass

    real, calls = TrainStep.update, [0]

    def killing(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 11:
            raise Killed
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "update", killing)
    with pytest.raises(Killed):
        train(tiny_cfg(*KILLED, f"train.skip_check={first}"), tmp_path / "cut")
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / "cut" / "checkpoint_last.pt")["step"] == 8
    train(cfg, tmp_path / "cut", resume=True)
    a, b = (checkpoint.load(d / "checkpoint_last.pt") for d in (whole, tmp_path / "cut"))
    for weights in ("model", "trained_model"):
        assert all(torch.equal(a[weights][k], b[weights][k]) for k in a[weights])
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    keys = ("step", "tokens", "skipped_steps", "window_loss", "train_loss", "best_bleu")
    assert [a[k] for k in keys] == [b[k] for k in keys]
    assert (whole / "metrics.jsonl").read_text().count("\n") == 2


def test_skip_check_takes_one_of_three_places():
    with pytest.raises(ConfigError, match="skip_check"):
        load_config(None, [*TINY, "train.skip_check=sometimes"])


def test_bench_and_profile_time_the_update_train_makes():
    """`update` (bench's, profile's and autosize's step) checks on the device where train defers,
    the same weights as host checks; auto defers on CUDA only."""
    assert not isinstance(TrainStep(nn.Linear(2, 2), TrainConfig(), CPU, "fp32").checks,
                          DeviceChecks)
    layers = []
    for check in ("host", "device"):
        torch.manual_seed(0)
        layer = nn.Linear(3, 2)
        step = TrainStep(layer, TrainConfig(skip_check=check), CPU, "fp32")
        assert isinstance(step.checks, DeviceChecks) == (check == "device")
        for x in torch.randn(3, 4, 3):
            loss = layer(x).square().sum()
            loss.backward()
            step.update(loss.detach(), 1e-2)
        # the guard made the step
        assert (getattr(step.checks, "guard", None) is not None) == (check == "device")
        layers.append(layer)
    assert all(torch.equal(a, b) for a, b in zip(*(m.parameters() for m in layers), strict=True))
