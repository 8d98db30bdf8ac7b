"""training/progress.py: a bar on a terminal, a plain line every N seconds elsewhere, one summary at
the end."""

from __future__ import annotations

import json
import logging

import pytest

from attn_mt.training.progress import Progress, duration, summary, time_left


def test_duration_and_time_left():
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]
    assert time_left(30.0, 0.25) == 90.0
    assert time_left(1.0, 0.0) is None and time_left(50.0, 1.0) == 0.0


def test_plain_lines_when_not_a_terminal(caplog):
    with caplog.at_level(logging.INFO, logger="attn_mt"), Progress(
        2, 10, terminal=False, every_s=0.0) as bar:
        bar.update()
        bar.report(step=12, loss=2.5, lr=1e-3, tokens_per_s=1234.0, left_s=75.0)
        bar.update()  # the same figures again, a batch later
    assert caplog.messages == ["epoch 2, batch 1/10 (step 12): loss 2.500, 1,234 tokens/s, lr "
                               "1.0e-03, about 1 min 15 s left",
                               "epoch 2, batch 2/10 (step 12): loss 2.500, 1,234 tokens/s, lr "
                               "1.0e-03, about 1 min 15 s left"]


def test_plain_lines_wait_their_interval(caplog):
    with caplog.at_level(logging.INFO, logger="attn_mt"), Progress(
        1, 10, terminal=False, every_s=3600) as bar:
        bar.report(step=1, loss=2.5, lr=1e-3, tokens_per_s=1.0, left_s=None)
    assert caplog.messages == []


def test_terminal_bar_shows_the_figures(capsys):
    with Progress(1, 10, terminal=True) as bar:
        bar.update()
        bar.report(step=1, loss=2.5, lr=1e-3, tokens_per_s=1234.0, left_s=75.0)
        assert bar.bar.postfix == "loss=2.500, tok/s=1,234, lr=1.0e-03, run=1 min 15 s left"


def test_summary_names_scores_and_checkpoint(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({
        "test_bleu": 98.004, "test_chrf": 99.1, "test_split": "test",
        "sacrebleu_signature": "nrefs:1", "tested": "checkpoint_avg.pt", "steps": 330,
        "train_seconds": 65.3}))
    assert summary(tmp_path).splitlines() == [
        "test BLEU 98.00  chrF 99.10  (test, nrefs:1)",
        f"averaged checkpoint: {tmp_path / 'checkpoint_avg.pt'} (330 steps, 1 min 05 s of "
        "training)"]


def test_tensorboard_run_says_how_to_view_it(tiny_cfg, tmp_path, caplog):
    pytest.importorskip("tensorboard")
    from attn_mt.training.run import train

    with caplog.at_level(logging.INFO, logger="attn_mt"):
        train(tiny_cfg("train.tensorboard=true", "train.max_steps=2", "train.bleu_sentences=4"),
              tmp_path / "run")
    assert f"point TensorBoard's log folder at {tmp_path / 'run'}" in caplog.text
    assert any((tmp_path / "run" / "tensorboard").iterdir())
