"""attn-mt: a small, readable Transformer translation trainer, measured against an RNN baseline.

The public API (docs/api.md); importing `attn_mt` loads nothing else until a name is used:

    >>> import attn_mt
    >>> run = attn_mt.train("configs/toy.yaml", "runs/toy")                # train, test BLEU, a Run
    >>> model = attn_mt.load("runs/toy/checkpoint_best.pt")               # a checkpoint or an
                                                                          export folder
    >>> model.translate("the old man sees a small dog.", beam=5)
    >>> model.score("a dog runs.", "ein Hund rennt.").log_prob            # forced decoding
    >>> model.attention("a dog runs.")                                    # every head; a view in a
                                                                          notebook
    >>> model.explain("a dog runs.", kind="encoder", layer=1, head=2, token="dog")  # five steps
    >>> model.heads(sources, refs), model.prune(2, sources, refs), model.evaluate(sources, refs)
    >>> model.align("a dog runs.", "ein Hund rennt.").pharaoh                # word links from
                                                                             attention

Tested in tests/api/test_model.py (every public name resolves; no torch at import) and
tests/test_readme.py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_HOMES = {
    "load": "attn_mt.api.model", "Model": "attn_mt.api.model", "train": "attn_mt.api.training",
    "configure": "attn_mt.api.training", "Run": "attn_mt.api.training",
    "history": "attn_mt.api.training",
    "Attention": "attn_mt.api.attention", "average": "attn_mt.api.commands",
    "download": "attn_mt.api.commands", "export_model": "attn_mt.api.commands",
    "prepare": "attn_mt.api.commands", "compare_rnn": "attn_mt.api.commands",
    "bench": "attn_mt.api.commands", "create_app": "attn_mt.serve", "Limits": "attn_mt.api.limits",
    "Item": "attn_mt.decoding.contrastive", "ContrastiveReport": "attn_mt.decoding.contrastive",
    "Entry": "attn_mt.data.cache",
    "Translation": "attn_mt.decoding.translate", "Score": "attn_mt.decoding.scoring",
    "Explanation": "attn_mt.analysis.explanation", "HeadsReport": "attn_mt.analysis.overview",
    "Alignment": "attn_mt.decoding.alignment", "AlignmentReport": "attn_mt.analysis.aer",
    "ExperimentConfig": "attn_mt.config", "DecodeConfig": "attn_mt.config",
    "DECODE_OPTIONS": "attn_mt.config", "AttnMTError": "attn_mt.errors",
    "ConfigError": "attn_mt.errors", "InputError": "attn_mt.errors", "ModelError": "attn_mt.errors",
    "RunError": "attn_mt.errors", "TrainError": "attn_mt.errors", "Interrupted": "attn_mt.errors",
}
__all__ = ["DECODE_OPTIONS", "Alignment", "AlignmentReport", "Attention", "AttnMTError",
           "ConfigError", "ContrastiveReport", "DecodeConfig", "Entry", "ExperimentConfig",
           "Explanation", "HeadsReport", "InputError", "Interrupted", "Item", "Limits", "Model",
           "ModelError", "Run", "RunError", "Score", "TrainError", "Translation", "__version__",
           "average", "bench", "compare_rnn", "configure", "create_app", "download", "export_model",
           "history", "load", "prepare", "train"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'attn_mt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    # (no public name is also a subpackage's: importing one would replace it)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for editors and type checkers; at run time __getattr__ imports on first use
    from attn_mt.analysis.aer import AlignmentReport
    from attn_mt.analysis.explanation import Explanation
    from attn_mt.analysis.overview import HeadsReport
    from attn_mt.api.attention import Attention
    from attn_mt.api.commands import average, bench, compare_rnn, download, export_model, prepare
    from attn_mt.api.limits import Limits
    from attn_mt.api.model import Model, load
    from attn_mt.api.training import Run, configure, history, train
    from attn_mt.config import DecodeConfig, ExperimentConfig
    from attn_mt.data.cache import Entry
    from attn_mt.decoding.alignment import Alignment
    from attn_mt.decoding.contrastive import ContrastiveReport, Item
    from attn_mt.decoding.scoring import Score
    from attn_mt.decoding.translate import Translation
    from attn_mt.errors import (
        AttnMTError,
        ConfigError,
        InputError,
        Interrupted,
        ModelError,
        RunError,
        TrainError,
    )
    from attn_mt.serve import create_app
