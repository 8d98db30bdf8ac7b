"""Opening a model: a checkpoint file (ours: trained, averaged or pruned) or an export folder, as a `Translator`.

This is the one place that chooses between the kinds; `attn_mt.load` and every command go through it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attn_mt.checkpoint import CheckpointError
from attn_mt.decoding.translator import Translator, checkpoint_translator
from attn_mt.errors import InputError


def open_translator(path: Path | str, device: str = "auto", threads: int | None = None) -> Translator:
    """A checkpoint file (PyTorch) or a directory written by `attn-mt export` (CTranslate2), on `device`;
    `threads` sets torch's (or CTranslate2's) CPU threads where given."""
    if threads is not None and threads < 1:
        raise InputError(f"must be >= 1, not {threads}", "threads")
    path = Path(path)
    if path.is_dir():
        from attn_mt.export.ct2_translator import export_translator  # CTranslate2 loads only for an export
        from attn_mt.export.ctranslate2 import META

        if not (path / META).is_file():
            raise CheckpointError(f"{path}: a folder (an export?) without {META}; give a checkpoint file written "
                                  "by `attn-mt train` (e.g. RUN/checkpoint_best.pt) or a folder written by "
                                  "`attn-mt export`", "path")

        return export_translator(path, device, threads=threads or 0)
    if threads is not None:
        torch.set_num_threads(threads)
    return checkpoint_translator(path, device)
