"""The Transformer's variants since the paper, each one config choice that docs/speedrun.md
measures: ReLU², GELU and swish activations (`ACTIVATIONS`, model.activation), SwiGLU's gated
feed-forward network (`GatedFeedForward`), RMSNorm in place of LayerNorm (`make_norm`, model.norm)
and output projections that start at zero (`zero_init`, model.zero_init). transformer.py builds
the paper's layers and asks here once for each choice.

Tested in tests/models/test_transformer.py (each variant is what it says and decodes step by step
as in one pass).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from attn_mt.config import TransformerConfig

from .attention import MultiHeadAttention
from .fast import Dropout, RMSNorm


class ReLUSquared(nn.Module):
    """relu(x)^2 (So et al. 2021, "Primer")."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "swish": nn.SiLU, "gelu": nn.GELU, "relu2": ReLUSquared}


class GatedFeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): W_2 (silu(x W_g) * x W_1), with 2/3 of d_ff hidden features so that
    its three matrices hold as many weights as the plain layer's two."""

    def __init__(self, d_model: int, d_ff: int, p_drop: float) -> None:
        super().__init__()
        hidden = round(2 * d_ff / 3)
        self.up = nn.Linear(d_model, 2 * hidden)  # [W_g; W_1], fused
        self.drop = Dropout(p_drop)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.up(x).chunk(2, dim=-1)  # 2 x (B, T, hidden)
        return self.down(self.drop(F.silu(gate) * value))


def make_norm(cfg: TransformerConfig) -> nn.Module:
    """The layer normalisation of the residual stream: LayerNorm, or RMSNorm (no mean, no bias)."""
    return RMSNorm(cfg.d_model) if cfg.norm == "rms" else nn.LayerNorm(cfg.d_model)


def zero_init(model: nn.Module) -> None:
    """Every sublayer starts by adding nothing to the residual stream: the output projections of
    attention and of the feed-forward networks (the paper's, an nn.Sequential, or gated) zero."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            nn.init.zeros_(m.out_proj.weight)
        elif isinstance(m, GatedFeedForward):
            nn.init.zeros_(m.down.weight)
        elif isinstance(m, nn.Sequential):
            nn.init.zeros_(m[-1].weight)
