"""Checkpoints: atomic writes, safe loads, and rebuilding a model from what a checkpoint holds.

A checkpoint is a dict of tensors and plain data only (it loads with
`torch.load(..., weights_only=True)`, so a crafted file cannot run code):
    format_version, model (state_dict), optimizer, step, epoch, batch_in_epoch,
    config (nested dict), tokenizer (SentencePiece model bytes), rng, best_bleu, ...
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from attn_mt.config import ConfigError, ExperimentConfig, from_dict
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.models import Seq2Seq, build_model

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged or from an incompatible version."""


def save(state: dict, path: Path) -> None:
    """Write `state` to `path` atomically: a temporary file in the same directory, fsync, rename.

    A crash or SIGKILL at any moment leaves either the old file or the new one, never a mix.
    Raises CheckpointError when the file cannot be written (e.g. a full disk).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format_version": FORMAT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # make the rename itself durable
        finally:
            os.close(fd)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write checkpoint ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed while saving
        stale.unlink(missing_ok=True)


def load(path: Path | str, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint dict, or raise CheckpointError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # weights_only met a class or function: a pickle that could run code
            raise CheckpointError(f"{path}: refused: holds objects other than tensors and plain data "
                                  "(loading it could run code)") from None
        raise CheckpointError(f"{path}: not a readable checkpoint (corrupt pickle data)") from None
    except Exception as e:  # truncated or damaged files fail in many ways (zip, pickle, utf-8, ...)
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt: "
                              f"{_first_line(e)})") from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{path}: not an attn-mt checkpoint")
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by checkpoint format {version}, this attn-mt reads format {FORMAT_VERSION}"
        )
    return state


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else e.__class__.__name__


def model_from_state(state: dict, device: torch.device | str = "cpu",
                     ) -> tuple[Seq2Seq, ExperimentConfig, Tokenizer]:
    """Rebuild (model in eval mode, config, tokenizer) from a loaded checkpoint dict."""
    try:
        cfg = from_dict(state["config"])
    except ConfigError as e:
        raise CheckpointError(f"checkpoint config is not valid for this attn-mt: {e}") from None
    tok = Tokenizer.from_state(state["tokenizer"])
    model = build_model(cfg.model, **tok.sizes())
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not fit the model: {str(e).splitlines()[0]}") from None
    return model.to(device).eval(), cfg, tok


def load_model(path: Path | str, device: torch.device | str = "cpu",
               ) -> tuple[Seq2Seq, ExperimentConfig, Tokenizer]:
    """(model, config, tokenizer) from a checkpoint file."""
    try:
        return model_from_state(load(path), device)
    except CheckpointError as e:
        if str(e).startswith(str(path)):
            raise
        raise CheckpointError(f"{path}: {e}") from None


def average(paths: list[Path | str]) -> dict:
    """One checkpoint whose weights are the element-wise mean of several checkpoints of one run.

    Averaging the last few checkpoints of a run smooths the noise of the final updates and
    usually gains BLEU at no training cost. All files must hold the same model (same parameter
    names and shapes) and the same tokenizer; config, tokenizer and step come from the last.
    The result holds weights only (no optimizer): it translates and evaluates, it does not resume.
    """
    if not paths:
        raise CheckpointError("nothing to average: give at least one checkpoint")
    states = [(Path(p), load(p)) for p in paths]
    first_path, first = states[0]
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path, state in states[1:]:
        weights = state["model"]
        if weights.keys() != total.keys():
            raise CheckpointError(f"{path}: has other parameters than {first_path}; "
                                  "only checkpoints of one model can be averaged")
        if state.get("tokenizer") != first.get("tokenizer"):
            raise CheckpointError(f"{path}: has another tokenizer than {first_path}")
        for key, value in weights.items():
            if value.shape != total[key].shape:
                raise CheckpointError(f"{path}: {key} has shape {tuple(value.shape)}, "
                                      f"{first_path} has {tuple(total[key].shape)}")
            if value.is_floating_point():
                total[key] += value.double()
    last = states[-1][1]
    model = {k: (v / len(states)).to(last["model"][k].dtype) if v.is_floating_point() else last["model"][k]
             for k, v in total.items()}
    return {"model": model, "config": last["config"], "tokenizer": last["tokenizer"],
            "step": last.get("step", 0), "epoch": last.get("epoch", 0),
            "averaged": [str(p) for p, _ in states]}
