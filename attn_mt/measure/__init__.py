"""Measurements: `attn-mt bench`, `attn-mt compare-rnn` and the fair-timing helpers they share.

May import config, checkpoint, device, data, models, decoding and the training step
(`training.trainer`), never the training run (`training.run`).
"""
