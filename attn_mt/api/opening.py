"""Opening a model: a checkpoint file (ours: trained, averaged or pruned), an export folder, or a
MarianMT model (a transformers folder or a hub name: opus-mt, or our own export in the
`transformers` format), as a `Translator`.

This is the one place that chooses between the kinds; `attn_mt.load` and every command go through
it.

Tested in tests/api/test_model.py, tests/export/test_ctranslate2.py and tests/marian/test_marian.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attn_mt.checkpoint import CheckpointError
from attn_mt.config.train import MOST
from attn_mt.decoding.translator import Translator, checkpoint_translator, model_translator
from attn_mt.errors import InputError
from attn_mt.files import mark_model


def open_translator(path: Path | str, device: str = "auto",
                    threads: int | None = None) -> Translator:
    """A checkpoint file (PyTorch), a directory written by `attn-mt export` (CTranslate2), or a
    MarianMT model (a transformers folder, or a hub name where the hub is reachable), on `device`;
    `threads` sets torch's (or CTranslate2's) CPU threads where given."""
    # train.threads' bound: OpenMP allocates per thread, and 10**9 threads end the process (no
    # exception)
    if threads is not None and not 1 <= threads <= MOST["threads"]:
        raise InputError(f"must be from 1 to {MOST['threads']}, not {threads}", "threads")
    translator = _open(path, device, threads)
    # a report is never written over it or into it (hub names: imports/marian.py)
    mark_model(translator.path)
    return translator


def _open(path: Path | str, device: str, threads: int | None) -> Translator:
    # a folder, a hub name or nothing: the Marian reader loads only for these
    if not Path(path).is_file():
        from attn_mt.imports.marian import is_marian

        if is_marian(path):
            if threads is not None:
                torch.set_num_threads(threads)
            return marian_translator(path, device)
    path = Path(path)
    if path.is_dir():
        from attn_mt.export.ctranslate2 import META

        # CTranslate2 loads only for an export
        from attn_mt.imports.ct2_translator import export_translator

        if not (path / META).is_file():
            hf = _model_type(path)
            raise CheckpointError(f"{path}: a folder (an export?) without {META}{hf}; give a "
                                  "checkpoint file written by `attn-mt train` (e.g. "
                                  "RUN/checkpoint_best.pt), a folder written by `attn-mt export` "
                                  "or a MarianMT folder", "path")

        return export_translator(path, device, threads=threads or 0)
    if threads is not None:
        torch.set_num_threads(threads)
    return checkpoint_translator(path, device)


def _model_type(folder: Path) -> str:
    """", whose config.json says model_type X" where a config.json of another model type is there,
    else ""."""
    import json

    try:
        kind = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return ""
    return f", whose config.json says model_type={kind!r:.40} (not 'marian')"


def marian_translator(path: Path | str, device: str = "auto") -> Translator:
    """A MarianMT model (imports/marian.py reads it as our checkpoint state) as a PyTorch
    Translator."""
    from attn_mt.checkpoint import model_from_state
    from attn_mt.device import pick_device
    from attn_mt.imports.marian import marian_state

    dev = pick_device(device)
    state = marian_state(path)
    try:
        model, cfg, tok = model_from_state(state, dev)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return model_translator(model, cfg, tok, dev, path, state)


def open_state(path: Path | str) -> dict:
    """The checkpoint state of a checkpoint file or a MarianMT model: what `train.init_from` starts
    from."""
    from attn_mt.checkpoint import load
    from attn_mt.imports.marian import is_marian, marian_state

    return marian_state(path) if is_marian(path) else load(path)
