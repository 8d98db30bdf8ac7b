"""Measurements: `attn-mt bench`, `attn-mt compare-rnn`, the set-up they share (prelude.py) and the
fair-timing helpers (timing.py).

May import config, checkpoint, device, data, models, decoding and training (the step,
`training.trainer`, never the run, `training.run`); never export or serve.
"""
