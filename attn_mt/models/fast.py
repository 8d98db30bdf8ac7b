"""The fast path: the numbers of attention.py and transformer.py, computed sooner.

Each piece has a plain version it is checked against (tests/models/test_fast.py): `fused_attention`
is `attention()` by one fused kernel, `Dropout` is nn.Dropout with a cheaper random mask on CPU, and
`RMSNorm` is nn.RMSNorm kept in fp32 under autocast. docs/performance.md has the measurements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def fused_is_faster(q: Tensor, training: bool) -> bool:
    """Whether `fused_attention` beats `attention` here: everywhere but in CPU training, where
    SDPA has no fused kernel with dropout, and without it trained slower (docs/performance.md)."""
    return not (training and q.device.type == "cpu")


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                    p_drop: float, bias: Tensor | None = None) -> Tensor:
    """`attention`'s output (B, H, T, d_k) by F.scaled_dot_product_attention, with dropout p_drop
    on the weights; `causal` (with no mask or bias, T = S) masks the future without a mask tensor.
    A `bias` goes in as SDPA's float mask, which it adds to the scaled scores: -inf where `mask`
    removes a key."""
    if bias is not None:
        bias = bias.to(q.dtype)
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop,
                                          is_causal=causal)


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper random mask on CPU, where F.dropout draws one Bernoulli sample per
    element.

    This draws 64 random bits per 8 elements and drops an element whose byte is below p * 256
    (p rounded to 1/256, the scale from the rounded p: the expectation is exact), writing the mask
    in x's dtype.
    Other devices, torch.compile and a p that rounds to 0 or 1 use F.dropout.
    """

    def forward(self, x: Tensor) -> Tensor:
        k, n = round(self.p * 256), x.numel()
        if (not self.training or not 0 < k < 256 or x.device.type != "cpu"
                or torch.compiler.is_compiling()):
            return super().forward(x)
        bits = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-(2**63), None)  # 64-bit words
        keep = torch.empty_like(x)
        torch.ge(bits.view(torch.uint8)[:n].view(x.shape), k, out=keep)  # 1 w.p. 1 - k/256
        return x * keep.mul_(256 / (256 - k))


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm computed in fp32 and returned in the input's dtype, as autocast treats LayerNorm
    (under bf16 autocast, torch's own takes a slow unfused path for a bf16 input, fp32 gain)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), self.normalized_shape, self.weight, self.eps).type_as(x)
