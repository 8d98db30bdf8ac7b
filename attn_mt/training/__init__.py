"""Training: the run (`run.train`), the step (`trainer`), validation and test scoring (`validation`),
the learning-rate schedule, resuming, the run directory's files (`rundir.RunDir`, their one owner),
TensorBoard and torch.distributed.

May import config, checkpoint, device, data, models and decoding (search, for validation BLEU); never
measure, export or serve. Nothing imports the run but the CLI.
"""
