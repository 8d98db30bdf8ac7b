"""Position schemes: how a Transformer tells where each token stands, one small class per scheme.

A scheme adds a table to the token embeddings (`forward`), or tells self-attention what to do
(`attending`): turn its queries and keys by a `Rotation`, add a bias to its scores; the base class
does nothing. A new scheme is a class here and its name in `SCHEMES` (and in
`TransformerConfig.positions`). Tables are `pe` (L, D): a buffer, not saved, for the sinusoids; a
parameter, saved as `pos.pe` (and `tgt_pos.pe`), when learned.

Tested in tests/models/test_positions.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attn_mt.config import TransformerConfig


@dataclass(frozen=True)
class Rotation:
    """Rotary positions (RoPE, Su et al. 2021) of T positions: cos and sin of their angles,
    (T, d_k/2), or (B, 1, T, d_k/2) with a first position per sentence. Computed once per pass,
    used by every self-attention layer."""

    cos: Tensor
    sin: Tensor

    def __call__(self, x: Tensor) -> Tensor:
        """Queries or keys x (B, H, T, d_k) turned: each pair (x_i, x_i+d_k/2) by its position's
        angle, in fp32."""
        half = x.size(-1) // 2
        x1, x2 = x.float()[..., :half], x.float()[..., half:]
        turned = [x1 * self.cos - x2 * self.sin, x1 * self.sin + x2 * self.cos]
        return torch.cat(turned, dim=-1).type_as(x)


@dataclass(frozen=True)
class InAttention:
    """What self-attention does with one pass's positions: turn queries and keys by `rotation`, add
    `bias` (H, T, S), or (B, H, T, S), to the scaled scores; either may be None."""

    rotation: Rotation | None = None
    bias: Tensor | None = None


class Positions(nn.Module):
    """A scheme that does nothing; subclasses add a table, or act in self-attention."""

    pe: Tensor  # (L, D) the table added to the embeddings; (0, 0) for none
    keeps_init = True  # the weight init leaves its parameters as the scheme made them
    # why the exports (export/) cannot write it; None: they can
    not_exported: str | None = "both formats hold our fixed sinusoid table only"

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pe", torch.zeros(0, 0), persistent=False)

    @classmethod
    def from_config(cls, cfg: TransformerConfig) -> Positions:
        return cls(cfg.d_model, cfg.max_positions)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """x: (B, T, D) embeddings of positions offset..offset+T-1; `offset` an int, or (B, 1)."""
        if self.pe.size(1) == 0:
            return x
        if isinstance(offset, Tensor):
            return x + self.pe[offset + torch.arange(x.size(1), device=x.device)]  # (B, T, D)
        return x + self.pe[offset : offset + x.size(1)]

    def attending(self, offset: int | Tensor, t: int, s: int,
                  device: torch.device) -> InAttention | None:
        """What self-attention does with queries at offset..offset+t-1 and S keys, the queries the
        last T of them (None: nothing)."""
        return None

    def for_target(self) -> Positions:
        """The target side's scheme: this one, shared (a learned table trains one per side)."""
        return self


class Sinusoidal(Positions):
    """Sinusoids (section 3.5), sin and cos in alternating dimensions."""

    not_exported = None

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        pe = torch.zeros(max_positions, d_model)
        if not pe.is_meta:  # a shapes-only model (models.empty_model) computes nothing
            self.fill(pe, torch.arange(max_positions).unsqueeze(1))  # (L, 1) positions
        self.register_buffer("pe", pe, persistent=False)

    def fill(self, pe: Tensor, pos: Tensor) -> None:
        d_model = pe.size(1)
        freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)


class Learned(Positions):
    """A trained table, N(0, 1/D) at first (as the token embeddings before their sqrt(D) scale),
    one per side."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.pe = nn.Parameter(torch.zeros(max_positions, d_model).normal_(std=d_model**-0.5))

    def for_target(self) -> Positions:
        return Learned(self.pe.size(1), self.pe.size(0))


class Rotary(Positions):
    """No table: self-attention turns each head's queries and keys by their positions
    (`Rotation`), so that q . k depends on the positions' difference only; the angle of pair i is
    position / base^(2i/d_k)."""

    def __init__(self, d_k: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        self.d_k, self.base = d_k, base

    @classmethod
    def from_config(cls, cfg: TransformerConfig) -> Positions:
        return cls(cfg.d_model // cfg.n_heads, cfg.max_positions)

    def attending(self, offset: int | Tensor, t: int, s: int,
                  device: torch.device) -> InAttention:
        positions = offset + torch.arange(t, device=device)  # (T,), or (B, T) for an offset each
        positions = positions[:, None] if positions.dim() == 2 else positions  # (T,) or (B, 1, T)
        half = self.d_k // 2
        exponent = -torch.arange(half, device=device, dtype=torch.float32) / half
        freq = torch.pow(self.base, exponent)  # (d_k/2,)
        angle = positions.to(torch.float32)[..., None] * freq  # (T, d_k/2) or (B, 1, T, d_k/2)
        return InAttention(Rotation(angle.cos(), angle.sin()))


SCHEMES: dict[str, type[Positions]] = {"interleaved": Sinusoidal, "learned": Learned,
                                       "rotary": Rotary}  # TransformerConfig.positions
