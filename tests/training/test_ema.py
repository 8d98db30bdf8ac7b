"""training/ema.py: the moving average of the weights, what a run evaluates and saves with it, and
resume."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from attn_mt import checkpoint
from attn_mt.checkpoint import load_model
from attn_mt.data.corpus import load_corpus
from attn_mt.training.ema import WeightEMA
from attn_mt.training.run import train
from attn_mt.training.validation import validation_loss


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight  # one parameter, two names
        self.c = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2))


def set_all(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_average_starts_as_a_plain_mean_then_decays():
    model = Tied()
    set_all(model, 0.0)
    ema = WeightEMA(model, decay=0.9)
    for value in (3.0, 6.0):  # decays 1/2 then 2/3: the mean of 0, 3 and 6
        set_all(model, value)
        ema.update()
    assert all(torch.allclose(w, torch.full_like(w, 3.0)) for w in ema.weights)
    for _ in range(20):  # then towards 6, never past it
        ema.update()
    assert all(bool(((w > 5.0) & (w < 6.0)).all()) for w in ema.weights)


def test_swapped_in_holds_the_average_and_restores_the_trained_weights_exactly():
    torch.manual_seed(0)
    model = Tied()
    ema = WeightEMA(model, decay=0.5)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    set_all(model, 1.0)
    ema.update()  # the average: halfway between the initial weights and 1
    after = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped_in():
        for k, v in model.state_dict().items():
            if k != "scale":
                assert torch.allclose(v, (trained[k] + 1.0) / 2), k
    assert all(torch.equal(v, after[k]) for k, v in model.state_dict().items())


def test_state_dict_keeps_buffers_and_ties_and_round_trips():
    model = Tied()
    ema = WeightEMA(model, decay=0.5)
    set_all(model, 2.0)
    ema.update()
    state = ema.state_dict(model)
    assert state.keys() == model.state_dict().keys()
    assert state["a.weight"] is state["b.weight"]  # one tensor, as in the model's own state_dict
    assert torch.equal(state["scale"], model.scale)
    fresh = WeightEMA(model, decay=0.5)
    fresh.load(state, ema.updates)
    assert fresh.updates == 1 and all(torch.equal(x, y) for x,
                                      y in zip(fresh.weights, ema.weights, strict=True))


def test_a_run_evaluates_saves_and_tests_the_average(tiny_cfg, tmp_path):
    train(tiny_cfg("train.ema_decay=0.9", "train.max_epochs=1"), tmp_path)
    saved = checkpoint.load(tmp_path / "checkpoint_last.pt")
    assert saved["step"] > 0 and "ema_updates" not in saved  # the update count is the step count
    assert any(not torch.equal(saved["model"][k], saved["trained_model"][k])
               for k in saved["model"])
    model, cfg, _ = load_model(tmp_path / "checkpoint_last.pt")  # what translate reads: the average
    corpus = load_corpus(cfg, cfg.model.max_positions)
    loss = validation_loss(model, corpus, cfg.data.splits.valid, cfg.train.batch_tokens,
                           torch.device("cpu"), "fp32")
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    # the validation scored the average
    assert record["valid_loss"] == pytest.approx(loss, abs=1e-4)
    assert json.loads((tmp_path / "results.json").read_text())["tested"] == "checkpoint_best.pt"


def test_resume_needs_the_trained_weights(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.ema_decay=0.9", "train.max_epochs=1")
    train(cfg, tmp_path)
    last = tmp_path / "checkpoint_last.pt"
    state = checkpoint.load(last)
    del state["trained_model"]
    state["stopped"] = ""
    checkpoint.save(state, last)
    with pytest.raises(Exception, match="no trained_model weights"):
        train(cfg, tmp_path, resume=True)
