"""Sequence-to-sequence models behind one interface (`Seq2Seq`), `build_model` to choose one by
config, the training loss (`token_loss`; `loss_sum` on a batch) every model is trained with, and its
mean per target token (`mean_loss`) that validation and the heads analysis measure.

May import `attn_mt.config` only: never data, training, decoding, measure, export or serve.

Tested in tests/models/ and tests/training/test_run.py.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.config import ModelConfig

from .attention import AttentionWeights
from .seq2seq import DecoderCache, Seq2Seq
from .sizing import check_memory, count_params, shapes_only
from .transformer import Transformer

__all__ = ["AttentionWeights", "DecoderCache", "Seq2Seq", "build_model", "count_params",
           "empty_model", "loss_sum", "mean_loss", "token_loss"]


def build_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                shared_vocab: bool) -> Seq2Seq:
    """A freshly initialised model of the configured kind (sizes from the tokenizer:
    `tok.sizes()`), once its size is known to fit in memory (sizing.py)."""
    sizes = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "pad_id": pad_id,
             "shared_vocab": shared_vocab}
    check_memory(cfg, empty_model(cfg, **sizes))
    return _construct(cfg, sizes)


def empty_model(cfg: ModelConfig, **sizes) -> Seq2Seq:
    """`build_model`'s model as shapes only, nothing allocated however large the config (what a
    checkpoint's weights are checked against before a model is built)."""
    with shapes_only():
        return _construct(cfg, sizes)


def _construct(cfg: ModelConfig, sizes: dict) -> Seq2Seq:
    if cfg.kind == "transformer":
        return Transformer(cfg, **sizes)
    if cfg.kind == "rnn":
        from .rnn import RNNSeq2Seq  # the baseline loads where a config asks for it

        return RNNSeq2Seq(cfg, **sizes)
    from .imported import LAYOUTS  # a Transformer in another toolkit's layout

    return LAYOUTS[cfg.kind](cfg, **sizes)


def token_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float, pad_id: int,
               z_loss: float = 0.0) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy of `logits` (B, T, V) against the target ids (B, T),
    pads left out. With `z_loss`, plus z_loss times each token's log Z^2 (Z the softmax's
    normaliser), which keeps the logits from drifting (PaLM)."""
    logits, target = logits.flatten(0, 1).float(), target.flatten()  # (B*T, V), (B*T,)
    loss = F.cross_entropy(logits, target, ignore_index=pad_id, label_smoothing=label_smoothing,
                           reduction="sum")
    if z_loss:
        loss = loss + z_loss * (logits.logsumexp(-1).square() * (target != pad_id)).sum()
    return loss


def loss_sum(model: nn.Module, batch, label_smoothing: float, pad_id: int,
             z_loss: float = 0.0) -> torch.Tensor:
    """token_loss of the model's teacher-forced logits on a batch (the data package's Batch: src
    (B, S), tgt_in and tgt_out (B, T) token ids)."""
    logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    return token_loss(logits, batch.tgt_out, label_smoothing, pad_id, z_loss)


@torch.inference_mode()
def mean_loss(model: nn.Module, batches: Iterable, pad_id: int, device: torch.device) -> float:
    """Mean per-token cross-entropy (no label smoothing) over `batches` (Batch: src, tgt_in, tgt_out
    and n_tokens), each moved to `device`, teacher-forced; summed on the device, read once."""
    total, n = torch.zeros((), device=device), 0
    for batch in batches:
        batch = batch.to(device)
        total += loss_sum(model, batch, 0.0, pad_id)
        n += batch.n_tokens
    return total.item() / max(n, 1)
