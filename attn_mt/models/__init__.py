"""Sequence-to-sequence models behind one interface (`Seq2Seq`), `build_model` to choose one by config,
the training loss (`token_loss`; `loss_sum` on a batch) every model is trained with, and its mean per
target token (`mean_loss`) that validation and the heads analysis measure.

May import `attn_mt.config` only: never data, training, decoding, measure, export or serve.

Tested in tests/models/ and tests/training/test_run.py.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attn_mt.config import ConfigError, ModelConfig

from .attention import AttentionWeights
from .seq2seq import DecoderCache, Seq2Seq
from .transformer import Transformer

__all__ = ["AttentionWeights", "DecoderCache", "Seq2Seq", "build_model", "check_memory", "count_params",
           "empty_model", "loss_sum", "token_loss",
           "mean_loss"]


def build_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                shared_vocab: bool) -> Seq2Seq:
    """A freshly initialised model of the configured kind (sizes from the tokenizer: `tok.sizes()`), once its
    size is known to fit in memory (`check_memory`)."""
    sizes = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "pad_id": pad_id, "shared_vocab": shared_vocab}
    check_memory(cfg, empty_model(cfg, **sizes))
    return _construct(cfg, sizes)


def _construct(cfg: ModelConfig, sizes: dict) -> Seq2Seq:
    if cfg.kind == "transformer":
        return Transformer(cfg, **sizes)
    if cfg.kind == "rnn":
        from .rnn import RNNSeq2Seq  # the baseline loads where a config asks for it

        return RNNSeq2Seq(cfg, **sizes)
    raise ValueError(f"unknown model kind {cfg.kind!r}")


def empty_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int, shared_vocab: bool) -> Seq2Seq:
    """`build_model`'s model as shapes only: on the meta device and not initialised, so nothing is allocated
    however large the config (what a checkpoint's weights are checked against before a model is built)."""
    sizes = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "pad_id": pad_id, "shared_vocab": shared_vocab}
    with torch.device("meta"), _NoInit():
        return _construct(cfg, sizes)


class _NoInit(TorchFunctionMode):
    """Initialisers and in-place fills do nothing (on meta tensors some cost seconds of imports); a torch
    function mode holds for this thread only, so a model built meanwhile in another is initialised."""

    SKIP = frozenset({"normal_", "uniform_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                      "kaiming_normal_", "zeros_", "ones_", "constant_", "zero_", "fill_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.SKIP:
            return args[0] if args else next(iter((kwargs or {}).values()))
        return func(*args, **(kwargs or {}))


KEYS = {"pos.pe": ("model.max_positions", "model.d_model"), "embed": ("tokenizer.vocab_size", "model.d_model"),
        "out_proj.weight": ("tokenizer.vocab_size", "model.d_model")}  # a table's name -> the keys that size it


def check_memory(cfg: ModelConfig, shapes: nn.Module) -> None:
    """Refuse (ConfigError naming the largest table and its keys) a model whose float32 weights and tables,
    with the temporaries that compute its sinusoids, need more memory than this process can still get."""
    tables = {n: t for n, t in [*shapes.named_parameters(), *shapes.named_buffers()]}
    need = sum(t.numel() * 4 for t in tables.values())
    need += sum(3 * t.numel() * 4 for n, t in shapes.named_buffers() if n.endswith("pos.pe"))  # float64 sin, cos
    free = memory_free()
    if need <= free:
        return
    name, big = max(tables.items(), key=lambda kv: kv[1].numel())
    keys = next((v for k, v in KEYS.items() if k in name), ("model.d_model", "model.d_ff", "model.n_layers"))
    raise ConfigError(f"{keys[0]}: the model needs {need / 2**30:.1f} GiB ({name} {tuple(big.shape)}: "
                      f"{big.numel() * 4 / 2**30:.1f} GiB, sized by {' and '.join(keys)}), more than the "
                      f"{free / 2**30:.1f} GiB of memory this process can get; make it smaller", keys[0])


def memory_free() -> int:
    """Bytes this process can still allocate: the system's available memory (Linux: MemAvailable), less where
    an address-space limit (ulimit -v, RLIMIT_AS) is nearer."""
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, StopIteration, ValueError):
        return free
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return free if soft == resource.RLIM_INFINITY else min(free, soft - used)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def token_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float, pad_id: int,
               z_loss: float = 0.0) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy of `logits` (B, T, V) against the target ids (B, T), pads left out.
    With `z_loss`, plus z_loss times each token's log Z^2 (Z the softmax's normaliser), which keeps the logits
    from drifting (PaLM)."""
    logits, target = logits.flatten(0, 1).float(), target.flatten()  # (B*T, V), (B*T,)
    loss = F.cross_entropy(logits, target, ignore_index=pad_id, label_smoothing=label_smoothing, reduction="sum")
    if z_loss:
        loss = loss + z_loss * (logits.logsumexp(-1).square() * (target != pad_id)).sum()
    return loss


def loss_sum(model: nn.Module, batch, label_smoothing: float, pad_id: int, z_loss: float = 0.0) -> torch.Tensor:
    """token_loss of the model's teacher-forced logits on a batch (the data package's Batch: src (B, S), tgt_in
    and tgt_out (B, T) token ids)."""
    return token_loss(model(batch.src, batch.tgt_in), batch.tgt_out, label_smoothing, pad_id, z_loss)


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
