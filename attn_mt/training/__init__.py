"""Training: the run (`run.train`), the step (`trainer`), the learning-rate schedule, resuming,
the run directory's files, TensorBoard and torch.distributed.

May import config, checkpoint, device, data, models and decoding (search, for validation BLEU); never
measure, export or serve. Nothing imports the run but the CLI.
"""
