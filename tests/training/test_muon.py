"""Muon for the layers' weight matrices and AdamW for the rest, in one optimizer."""

from __future__ import annotations

import pytest
import torch

from attn_mt.config import RNNConfig, TransformerConfig
from attn_mt.models import build_model
from attn_mt.training.muon import NS_COEFFICIENTS, MuonAdamW, gram_iterations, muon_params, orthogonalise


def model(cfg=None):
    torch.manual_seed(0)
    return build_model(cfg or TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64), src_vocab=40,
                       tgt_vocab=40, pad_id=0, shared_vocab=True)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (96, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_flattens_the_singular_values(shape, dtype):
    k = min(shape)
    u, v = torch.linalg.qr(torch.randn(shape[0], k))[0], torch.linalg.qr(torch.randn(shape[1], k))[0]
    g = u @ torch.diag(torch.logspace(-1.5, 0, k)) @ v.T  # singular values from 0.03 to 1
    o = orthogonalise(g, 5, dtype)
    assert o.shape == g.shape and o.dtype == dtype
    s = torch.linalg.svdvals(o.float())
    assert 0.2 < s.min() and s.max() < 1.3  # every direction moves at about the same rate
    assert torch.nn.functional.cosine_similarity((u @ v.T).flatten(), o.float().flatten(), dim=0) > 0.9


@pytest.mark.parametrize("steps", [0, 1, 3, 5])
def test_the_gram_iterations_give_the_plain_iterations_result(steps):
    """On a wide matrix the iterations may run on its Gram matrix: the same X (fp32 rounding apart)."""
    a, b, c = NS_COEFFICIENTS
    torch.manual_seed(steps)
    x = torch.randn(64, 256)
    x = x / x.norm()
    plain = x
    for _ in range(steps):
        gram = plain @ plain.T
        plain = a * plain + (b * gram + c * gram @ gram) @ plain
    assert torch.allclose(gram_iterations(x, steps), plain, atol=2e-6)


def test_muon_takes_the_linear_layers_and_leaves_embeddings_norms_and_biases_to_adamw():
    m = model()
    names = muon_params(m)
    assert len(names) == 2 * 4 + 2 * 7  # encoder: qkv, out, ff x2; decoder: + cross q, kv, out
    assert all(n.endswith(".weight") and m.get_parameter(n).ndim == 2 for n in names)
    assert "src_embed.weight" not in names  # the embedding table, tied to the output layer
    rnn = muon_params(model(RNNConfig(d_embed=16, d_hidden=16, d_attn=16)))
    assert "attn.score.weight" not in rnn and "pre_out.weight" in rnn  # a (1, n) row is a vector


def test_one_step_moves_muon_weights_by_the_orthogonalised_momentum():
    m = model()
    opt = MuonAdamW(m, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.0, momentum=0.0)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    src, tgt = torch.randint(3, 40, (4, 6)), torch.randint(3, 40, (4, 5))
    m(src, tgt).logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    opt.step()
    w = "encoder.0.ff.0.weight"  # (64, 32): scaled by 0.2 sqrt(64) to AdamW's RMS
    step = (before[w] - m.get_parameter(w).detach()) / (1e-2 * 0.2 * 8)
    assert torch.allclose(step, orthogonalise(grads[w], 5), atol=1e-5)
    emb = "src_embed.weight"  # AdamW's first step: lr * sign(g) where the gradient is not 0
    moved = (before[emb] - m.get_parameter(emb).detach())[grads[emb].abs() > 1e-6]
    assert torch.allclose(moved.abs(), torch.full_like(moved, 1e-2), rtol=1e-3)
    assert {"momentum_buffer", "step"} == set(opt.state[m.get_parameter(w)])
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(opt.state[m.get_parameter(emb)])
