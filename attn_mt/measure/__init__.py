"""Measurements: `attn-mt bench`, `attn-mt compare-rnn` and the fair-timing helpers they share.

May import config, checkpoint, device, data, models, decoding and training (the step, `training.trainer`,
never the run, `training.run`); never export or serve.
"""
