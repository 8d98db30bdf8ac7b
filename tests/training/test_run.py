import json
import shutil
from dataclasses import replace

import pytest
import torch
from conftest import SHORT

from attn_mt.config import TrainConfig
from attn_mt.device import pick_precision
from attn_mt.training.run import train
from attn_mt.training.schedule import budget_spent, lr_at


def test_lr_warmup_then_inverse_sqrt():
    cfg = TrainConfig(lr=1e-3, warmup_steps=100)
    assert lr_at(1, cfg) == pytest.approx(1e-5)
    assert lr_at(50, cfg) == pytest.approx(5e-4)
    assert lr_at(100, cfg) == pytest.approx(1e-3)
    assert lr_at(400, cfg) == pytest.approx(5e-4)
    assert max(lr_at(s, cfg) for s in range(1, 1000)) == pytest.approx(1e-3)


def test_lr_linear_decay_to_zero_over_the_budget():
    cfg = TrainConfig(lr=1e-3, warmup_steps=100, schedule="linear")
    assert lr_at(50, cfg, 0.0) == pytest.approx(5e-4)
    assert lr_at(100, cfg, 0.0) == pytest.approx(1e-3)
    assert lr_at(5000, cfg, 0.25) == pytest.approx(7.5e-4)
    assert lr_at(5000, cfg, 1.0) == 0.0


def test_linear_warmup_never_outlasts_its_share_of_a_short_budget():
    cfg = TrainConfig(lr=1e-3, warmup_steps=500, schedule="linear", warmup_fraction=0.1, max_steps=300)
    lrs = [lr_at(s, cfg, budget_spent(cfg, s - 1, 0.0, 0.0)) for s in range(1, 301)]
    peak = max(range(300), key=lambda i: lrs[i])
    assert 25 <= peak <= 35  # the warmup ends at 10% of 300 steps, not at step 500
    assert lrs[peak] == pytest.approx(1e-3 * (1 - peak / 300), rel=1e-6)
    assert lrs[-1] < 1e-5 and all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :], strict=False))
    long = TrainConfig(lr=1e-3, warmup_steps=500, schedule="linear", warmup_fraction=0.1, max_steps=10_000)
    assert lr_at(250, long, 0.025) == pytest.approx(5e-4 * 0.975)  # a long budget: warmup_steps decide
    assert lr_at(250, replace(cfg, warmup_fraction=0.0), 0.5) == pytest.approx(5e-4 * 0.5)


def test_budget_spent_is_the_first_limit_to_end():
    cfg = TrainConfig(max_epochs=10, max_steps=1000, max_minutes=2)
    assert budget_spent(cfg, step=100, seconds=30, epochs=5) == pytest.approx(0.5)  # epochs lead
    assert budget_spent(cfg, step=800, seconds=30, epochs=1) == pytest.approx(0.8)  # steps lead
    assert budget_spent(cfg, step=10, seconds=90, epochs=1) == pytest.approx(0.75)  # minutes lead
    assert budget_spent(TrainConfig(max_epochs=4), step=10**6, seconds=10**6, epochs=8) == 1.0


def test_precision_choice():
    cpu = torch.device("cpu")
    assert pick_precision("fp32", cpu) == "fp32"
    assert pick_precision("auto", cpu) in ("bf16", "fp32")


def test_run_directory_contents(tiny_run):
    names = {p.name for p in tiny_run.iterdir()}
    assert {"config.yaml", "spm.model", "checkpoint_best.pt", "checkpoint_last.pt", "metrics.jsonl",
            "results.json"} <= names
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    for key in ("step", "epoch", "train_loss", "valid_loss", "valid_bleu", "lr", "tokens_per_s", "elapsed_s"):
        assert key in records[0]
    assert records[1]["valid_loss"] < records[0]["valid_loss"]
    results = json.loads((tiny_run / "results.json").read_text())
    for key in ("test_bleu", "test_chrf", "sacrebleu_signature", "train_seconds", "params", "device"):
        assert key in results
    assert results["sacrebleu_signature"].startswith("nrefs:1|case:mixed")


def test_overfits_a_few_sentences(tiny_cfg, tmp_path):
    """Eight sentences, many epochs: the model learns them by heart."""
    cfg = tiny_cfg("data.toy_size=10", "train.max_epochs=100", "train.eval_every=25", "train.warmup_steps=30",
                   "train.lr=5e-3",
                   "train.batch_tokens=400", "model.d_model=64", "model.d_ff=128", "train.label_smoothing=0",
                   "train.bleu_sentences=10", "tokenizer.vocab_size=64")
    train(cfg, tmp_path)
    first, *_, last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert last["train_loss"] < 0.1 and first["train_loss"] > 1.0, (first, last)


def test_max_steps_and_accumulation(tiny_cfg, tmp_path):
    train(tiny_cfg("train.max_steps=7", "train.accum_steps=2"), tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 7
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    assert state["step"] == 7


def test_linear_schedule_ends_near_zero(tiny_cfg, tmp_path):
    train(tiny_cfg("train.max_steps=8", "train.eval_every=4", "train.warmup_steps=2", "train.lr=1e-3",
                   "train.schedule=linear"), tmp_path)
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lrs[0] == pytest.approx(1e-3 * (1 - 3 / 8))  # the lr of step 4, set with 3 of 8 steps spent
    assert lrs[-1] == pytest.approx(1e-3 * (1 - 7 / 8))


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="torch.compile needs a C++ compiler")
def test_compiled_training_matches_eager(tiny_cfg, tmp_path):
    """train.compile=true trains the same model: the same losses, to rounding."""
    losses = {}
    for flag in ("false", "true"):
        train(tiny_cfg("train.max_steps=6", "train.eval_every=3", f"train.compile={flag}"), tmp_path / flag)
        records = [json.loads(line) for line in (tmp_path / flag / "metrics.jsonl").read_text().splitlines()]
        losses[flag] = [r["valid_loss"] for r in records]
    assert len(losses["true"]) == 2
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-3)


def test_validation_longer_than_the_position_table_is_cut_not_a_crash(tiny_cfg, tmp_path):
    cfg = tiny_cfg("model.max_positions=12", *SHORT)
    train(cfg, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["steps"] > 0
