"""train.tensorboard: scalars and attention images under the run directory."""

from __future__ import annotations

import pytest

from attn_mt.training.run import train


@pytest.mark.slow
def test_tensorboard_events_for_a_run(tiny_cfg, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tiny_cfg("train.tensorboard=true", "train.max_epochs=2", "train.bleu_sentences=5"),
          tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"),
                              size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tokens_per_s", "train/grad_norm", "valid/loss",
            "valid/bleu"} <= scalars
    assert len(events.Scalars("valid/bleu")) == 2  # one per evaluation (epoch)
    images = events.Tags()["images"]
    assert images == ["attention/cross_layer1"] and len(events.Images(images[0])) == 2
    assert events.Images(images[0])[0].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_the_flag_nothing_is_written(tiny_cfg, tmp_path):
    train(tiny_cfg("train.max_steps=2", "train.bleu_sentences=5"), tmp_path)
    assert not (tmp_path / "tensorboard").exists()
