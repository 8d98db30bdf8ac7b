"""The public Python API (`import attn_mt`; docs/api.md): what the CLI and the server call.

    model.py      `load` and `Model`: translate, score, attention, explain, heads, prune, evaluate
    attention.py  `Attention`: one sentence's attention maps as arrays, an HTML head view and PNGs
    training.py   `train`, `configure` and `Run`: a config (file, dict or object) into a finished run
    commands.py   the other commands as functions: average, download, export_model, prepare, compare_rnn, bench
    opening.py    the one opener of models: a checkpoint file or an export folder
    terminal.py   what the CLI prints: the text forms of results
    flags.py      the CLI's words: an argument's flag, a failure as one line and an exit status (no torch)
    limits.py     `Limits`: what `attn-mt serve` answers (the server's; here so the CLI reads the defaults)

May import config, checkpoint, device, data, models, decoding, training, measure, export, analysis and rundir;
never serve.
"""
