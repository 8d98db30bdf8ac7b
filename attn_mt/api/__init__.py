"""The public Python API (`import attn_mt`; docs/api.md): what the CLI and the server call.

    model.py      `load` and `Model`: translate, translate_nbest, stream, score, evaluate,
                  contrastive, to, save
    aligning.py   word alignment from cross-attention: links, the AER report against gold, `attn-mt
                  align`
    analyses.py   the work of the Model's analyses: attention maps (of its translation or a given
                  target), explain, heads, prune
    steering.py   decoding steered by the caller (target prefix, sampling, the token stream); device
                  and dtype
    sharing.py    the readers-writer lock that makes one Model safe to share between threads
    attention.py  `Attention`: one sentence's attention maps as arrays, an HTML head view and PNGs
    training.py   `train`, `configure` and `Run`: a config (file, dict or object) into a finished
                  run
    commands.py   the other commands as functions: average, download, export_model, prepare,
                  compare_rnn, bench
    opening.py    the one opener of models: a checkpoint file or an export folder
    terminal.py   what the CLI prints: the text forms of results
    history_pages.py  a run's attention history drawn: the heads command's files and the server's
                      /history page
    limits.py     `Limits`: what `attn-mt serve` answers (the server's; here so the CLI reads the
                  defaults)

Every argument is checked at the door by data/checks.py (an InputError naming it, never a TypeError
from inside). model.py loads analyses.py and steering.py only in the methods that use them.

May import config, checkpoint, device, data, models, decoding, training, measure, export, imports,
analysis and rundir; never serve.
"""
