"""Sequence-to-sequence models behind one interface (`Seq2Seq`), `build_model` to choose one by config,
the training loss (`loss_sum`) every model is trained with, and its mean per target token (`mean_loss`) that
validation and the heads analysis measure.

May import `attn_mt.config` only: never data, training, decoding, measure, export or serve.

Tested in tests/models/ and tests/training/test_run.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.config import ModelConfig

from .attention import AttentionWeights
from .rnn import RNNSeq2Seq
from .seq2seq import DecoderCache, Seq2Seq
from .transformer import Transformer

__all__ = ["AttentionWeights", "DecoderCache", "Seq2Seq", "build_model", "count_params", "empty_model", "loss_sum",
           "mean_loss"]


def build_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                shared_vocab: bool) -> Seq2Seq:
    """A freshly initialised model of the configured kind (sizes from the tokenizer: `tok.sizes()`)."""
    kinds = {"transformer": Transformer, "rnn": RNNSeq2Seq}
    if cfg.kind not in kinds:
        raise ValueError(f"unknown model kind {cfg.kind!r}")
    return kinds[cfg.kind](cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=pad_id, shared_vocab=shared_vocab)


def empty_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int, shared_vocab: bool) -> Seq2Seq:
    """`build_model`'s model as shapes only: on the meta device and not initialised, so nothing is allocated
    however large the config (what a checkpoint's weights are checked against before a model is built)."""
    with torch.device("meta"), _no_init():
        return build_model(cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=pad_id, shared_vocab=shared_vocab)


@contextlib.contextmanager
def _no_init():
    # initialisers do nothing meanwhile (on meta tensors, some cost seconds of imports); not thread-safe
    names = ("normal_", "uniform_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
             "kaiming_normal_", "zeros_", "ones_", "constant_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def loss_sum(model: nn.Module, batch, label_smoothing: float, pad_id: int, z_loss: float = 0.0) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy over a batch's target tokens; `batch` holds src, tgt_in
    and tgt_out, (B, S) and (B, T) token ids (the data package's Batch). With `z_loss`, plus z_loss times
    each token's log Z^2 (Z the softmax's normaliser), which keeps the logits from drifting (PaLM)."""
    logits = model(batch.src, batch.tgt_in).flatten(0, 1).float()  # (B*T, V)
    target = batch.tgt_out.flatten()
    loss = F.cross_entropy(logits, target, ignore_index=pad_id, label_smoothing=label_smoothing, reduction="sum")
    if z_loss:
        loss = loss + z_loss * (logits.logsumexp(-1).square() * (target != pad_id)).sum()
    return loss


@torch.inference_mode()
def mean_loss(model: nn.Module, batches: Iterable, pad_id: int, device: torch.device) -> float:
    """Mean per-token cross-entropy (no label smoothing) over `batches` (the data package's Batch: src, tgt_in,
    tgt_out and n_tokens), each moved to `device`, teacher-forced; summed on the device, read once."""
    total, n = torch.zeros((), device=device), 0
    for batch in batches:
        batch = batch.to(device)
        total += loss_sum(model, batch, 0.0, pad_id)
        n += batch.n_tokens
    return total.item() / max(n, 1)
