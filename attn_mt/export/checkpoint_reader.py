"""What both exporters share: `ExportError`, and `read_transformer`, which reads and checks the
checkpoint.

Tested in tests/export/test_transformers.py and tests/export/test_ctranslate2.py.
"""

from __future__ import annotations

from pathlib import Path

from attn_mt.checkpoint import CheckpointError, load, model_from_state
from attn_mt.config import ConfigError, ExperimentConfig, from_dict
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.models.positions import SCHEMES


class ExportError(CheckpointError):
    """A checkpoint that cannot be exported, or an export that cannot be read; one line says why."""


# the speedrun's layer options (docs/speedrun.md) that neither export format holds: (field, its
# standard value)
NOT_EXPORTED = (("qk_norm", False), ("norm", "layer"))
NEW_ACTIVATIONS = ("gelu", "relu2", "swiglu")


def check_exportable(cfg: ExperimentConfig, checkpoint: Path, target: str) -> None:
    """One line naming the first model setting `target` cannot hold (docs/export.md), if any."""
    m = cfg.model
    for key, standard in NOT_EXPORTED:
        if getattr(m, key) != standard:
            raise ExportError(f"{checkpoint}: model.{key}={getattr(m, key)} cannot be exported to "
                              f"{target} (only model.{key}={standard}; docs/export.md)")
    why = SCHEMES[m.positions].not_exported  # the scheme says
    if why is not None:
        raise ExportError(f"{checkpoint}: model.positions={m.positions} cannot be exported to "
                          f"{target} ({why}; docs/export.md)")
    if m.activation in NEW_ACTIVATIONS:
        raise ExportError(f"{checkpoint}: model.activation={m.activation} cannot be exported to "
                          f"{target} (relu or swish only; docs/export.md)")


def read_transformer(checkpoint: Path, target: str) -> tuple[dict, ExperimentConfig, Tokenizer]:
    """The state, config and tokenizer of a Transformer checkpoint to export to `target`, its
    tokenizer and weights checked first, so that a damaged or an RNN checkpoint ends in one line
    naming the file."""
    state = load(checkpoint)
    try:
        cfg = from_dict(state["config"])
    except ConfigError as e:
        raise ExportError(f"{checkpoint}: config is not valid for this attn-mt: {e}") from None
    if cfg.model.kind != "transformer":
        raise ExportError(f"{checkpoint}: is an {cfg.model.kind.upper()} model; only Transformer "
                          f"checkpoints can be exported to {target}")
    check_exportable(cfg, checkpoint, target)
    try:
        _, _, tok = model_from_state(state)
    except CheckpointError as e:
        raise ExportError(f"{checkpoint}: {e}") from None
    return state, cfg, tok
