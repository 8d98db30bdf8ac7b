"""Training: the run (`run.train`: set up by `start`, evaluated and saved by `evaluation`, ended
by `finish`), the step (`trainer`, its parts chosen once by `variants`), validation and test
scoring (`validation`), the learning-rate schedule, resuming, TensorBoard and torch.distributed.

May import config, checkpoint, device, data, models, decoding (search, for validation BLEU) and
rundir (the run directory's files); never measure, export or serve. Nothing imports the run but
the public API.
"""
