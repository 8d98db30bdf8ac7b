"""Muon for the layers' weight matrices and AdamW for the rest, in one optimizer."""

from __future__ import annotations

import math

import pytest
import torch

from attn_mt.config import ConfigError, RNNConfig, TrainConfig, TransformerConfig
from attn_mt.models import build_model
from attn_mt.training.muon import (
    POLAR_COEFFICIENTS,
    MuonAdamW,
    gram_iterations,
    head_cuts,
    muon_params,
    ns_coefficients,
    orthogonalise,
    orthogonalise_heads,
)


def model(cfg=None):
    torch.manual_seed(0)
    return build_model(cfg or TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64),
                       src_vocab=40, tgt_vocab=40, pad_id=0, shared_vocab=True)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (96, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("ns", "bounds"), [((5, "fixed"), (0.2, 1.3)),
                                            ((3, "polar"), (0.45, 1.6))])
def test_newton_schulz_flattens_the_singular_values(shape, dtype, ns, bounds):
    k = min(shape)
    u, v = (torch.linalg.qr(torch.randn(shape[0], k))[0],
            torch.linalg.qr(torch.randn(shape[1], k))[0])
    g = u @ torch.diag(torch.logspace(-1.5, 0, k)) @ v.T  # singular values from 0.03 to 1
    o = orthogonalise(g, ns_coefficients(*ns), dtype)
    assert o.shape == g.shape and o.dtype == dtype
    s = torch.linalg.svdvals(o.float())
    # every direction moves at about the same rate
    assert bounds[0] < s.min() and s.max() < bounds[1]
    assert (torch.nn.functional.cosine_similarity((u @ v.T).flatten(), o.float().flatten(), dim=0)
            > 0.9)


@pytest.mark.parametrize("steps", [0, 1, 3, 5])
@pytest.mark.parametrize("schedule", ["fixed", "polar"])
def test_the_gram_iterations_give_the_plain_iterations_result(steps, schedule):
    """On a wide matrix the iterations may run on its Gram matrix: the same X (fp32 rounding
    apart)."""
    torch.manual_seed(steps)
    x = torch.randn(64, 256)
    x = x / x.norm()
    plain = x
    for a, b, c in ns_coefficients(steps, schedule):
        gram = plain @ plain.T
        plain = a * plain + (b * gram + c * gram @ gram) @ plain
    assert torch.allclose(gram_iterations(x, ns_coefficients(steps, schedule)), plain, atol=2e-6)


@pytest.mark.parametrize("ns", [(5, "fixed"), (3, "polar")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nearly_rank_one_momentum_stays_bounded(ns, dtype):
    """The first steps' momentum is nearly rank one (largest singular value up to 0.998 of the
    Frobenius norm): the Gram form in bf16 turned one like it into singular values of 1e4 (fixed) or
    1.75 (polar)."""
    torch.manual_seed(0)
    u, v = torch.linalg.qr(torch.randn(256, 256))[0], torch.linalg.qr(torch.randn(1024, 256))[0]
    s = torch.logspace(-4, -2, 256)
    s[0] = 1.0
    g = u @ torch.diag(s) @ v.T  # (256, 1024), the top singular value 0.999 of the Frobenius norm
    exact = orthogonalise(g.double(), ns_coefficients(*ns), torch.float64)
    o = orthogonalise(g, ns_coefficients(*ns), dtype).double()
    assert torch.linalg.svdvals(o)[0] < 1.6
    assert (o - exact).norm() / exact.norm() < (2e-3 if dtype == torch.float32 else 0.08)


def composite(coefficients, s):
    """What the iterations do to singular values s: X = U S V^T -> U p_k(...p_1(S)) V^T."""
    for a, b, c in coefficients:
        s = a * s + b * s**3 + c * s**5
    return s


def nearest_quintic(lo, hi):
    """The odd quintic nearest to 1 in the max norm on [lo, hi], by Lawson's reweighted least
    squares."""
    s = torch.cat([torch.logspace(math.log10(lo), math.log10(hi), 2000, dtype=torch.float64),
                   torch.linspace(lo, hi, 2000, dtype=torch.float64)])
    basis = torch.stack([s, s**3, s**5], 1)
    w = torch.full_like(s, 1 / len(s))
    for _ in range(2000):
        coef = torch.linalg.lstsq(basis * w.sqrt()[:, None], w.sqrt()[:, None]).solution[:, 0]
        w = w * (1 - basis @ coef).abs()
        w = w / w.sum()
    return coef


def test_the_polar_coefficients_are_each_the_nearest_quintic_on_what_the_ones_before_leave():
    lo, hi = 0.005, 1.0
    for a, b, c in POLAR_COEFFICIENTS:
        assert torch.allclose(nearest_quintic(lo, hi * 1.02),
                              torch.tensor([a, b, c], dtype=torch.float64), rtol=2e-3)
        out = composite([(a, b, c)], torch.linspace(lo, hi, 20001, dtype=torch.float64))
        lo, hi = out.min().item(), out.max().item()


def test_three_polar_iterations_flatten_more_than_three_fixed_ones_and_stay_bounded_past_1():
    s = torch.logspace(math.log10(0.005), 0, 20001, dtype=torch.float64)
    polar, fixed3, fixed5 = (composite(ns_coefficients(*ns), s)
                             for ns in ((3, "polar"), (3, "fixed"), (5, "fixed")))
    assert 0.48 < polar.min() and polar.max() < 1.52  # [0.005, 1] -> [0.49, 1.51]
    # Jordan et al.'s 3 leave 0.005 at 0.20, their 5 at 0.68
    assert fixed3.min() < 0.21 and fixed5.min() > 0.68
    past = composite(ns_coefficients(3, "polar"),
                     torch.linspace(1.0, 1.02, 201, dtype=torch.float64))
    # rounding that pushes one past 1 (by up to 2%) stays in range
    assert 0.48 < past.min() and past.max() < 1.52
    # beyond it does
    assert composite(ns_coefficients(3, "polar"), torch.tensor([1.05], dtype=torch.float64)) > 100


def test_the_polar_schedule_has_five_iterations():
    with pytest.raises(ValueError, match="5 iterations, not 6"):
        ns_coefficients(6, "polar")
    with pytest.raises(ConfigError, match="train.muon_ns_steps=6"):
        TrainConfig(muon_ns_steps=6, muon_ns_schedule="polar")


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
    assert torch.allclose(step, orthogonalise(grads[w], ns_coefficients(5)), atol=1e-5)
    # AdamW's first step: lr * g / (|g| + eps), lr * sign(g) where |g| >> eps (1e-8)
    emb = "src_embed.weight"
    moved = (before[emb] - m.get_parameter(emb).detach())[grads[emb].abs() > 1e-4]
    assert torch.allclose(moved.abs(), torch.full_like(moved, 1e-2), rtol=1e-3)
    assert {"momentum_buffer", "step"} == set(opt.state[m.get_parameter(w)])
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(opt.state[m.get_parameter(emb)])


def test_the_attention_projections_split_into_heads_and_nothing_else_does():
    m = model()  # d_model 32, 4 heads of 8
    cuts = head_cuts(m)
    # (96, 32): Q, K, V of 4 heads
    assert cuts["encoder.0.self_attn.qkv_proj.weight"] == ("rows", 12)
    assert cuts["decoder.1.cross_attn.q_proj.weight"] == ("rows", 4)
    assert cuts["decoder.1.cross_attn.kv_proj.weight"] == ("rows", 8)
    # (32, 32): each head's 8 inputs
    assert cuts["decoder.0.self_attn.out_proj.weight"] == ("cols", 4)
    # no feed-forward, no output layer
    assert len(cuts) == 2 * 2 + 2 * 5 and set(cuts) <= muon_params(m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_heads_are_orthogonalised_one_by_one(dtype):
    torch.manual_seed(0)
    g = torch.randn(96, 32)
    ns = ns_coefficients(3, "polar")
    by_rows = orthogonalise_heads(g, ("rows", 12), ns, dtype)
    assert torch.allclose(by_rows[16:24].float(), orthogonalise(g[16:24], ns, dtype).float(),
                          atol=1e-5)
    by_cols = orthogonalise_heads(g, ("cols", 4), ns, dtype)
    assert by_cols.shape == g.shape and by_cols.dtype == dtype
    assert torch.allclose(by_cols[:, 8:16].float(), orthogonalise(g[:, 8:16], ns, dtype).float(),
                          atol=1e-5)
    s = torch.linalg.svdvals(by_cols[:, 8:16].float())
    # each head's block is near-orthogonal; the whole is not one
    assert 0.45 < s.min() and s.max() < 1.6
    assert torch.linalg.svdvals(by_cols.float()).max() > 1.6


def test_a_per_head_step_moves_an_attention_weight_by_its_heads_orthogonalised_momentum():
    m = model()
    opt = MuonAdamW(m, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.0, momentum=0.0, per_head=True)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    src, tgt = torch.randint(3, 40, (4, 6)), torch.randint(3, 40, (4, 5))
    m(src, tgt).logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    opt.step()
    # (32, 32) in 4 blocks of (32, 8): scaled by 0.2 sqrt(32)
    w = "encoder.1.self_attn.out_proj.weight"
    step = (before[w] - m.get_parameter(w).detach()) / (1e-2 * 0.2 * math.sqrt(32))
    assert torch.allclose(step[:, 24:], orthogonalise(grads[w][:, 24:], ns_coefficients(5)),
                          atol=1e-5)
    w = "encoder.0.ff.0.weight"  # not attention: the whole matrix, as without per_head
    step = (before[w] - m.get_parameter(w).detach()) / (1e-2 * 0.2 * 8)
    assert torch.allclose(step, orthogonalise(grads[w], ns_coefficients(5)), atol=1e-5)


def test_weight_decay_shrinks_muon_weights_before_the_step():
    m = model()
    opt = MuonAdamW(m, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.5, momentum=0.0)
    w = m.get_parameter("encoder.0.ff.0.weight")  # (64, 32)
    before = w.detach().clone()
    m(torch.randint(3, 40, (4, 6)), torch.randint(3, 40, (4, 5))).logsumexp(-1).mean().backward()
    g = w.grad.clone()
    opt.step()
    expected = before * (1 - 1e-2 * 0.5) - 1e-2 * 0.2 * 8 * orthogonalise(g, ns_coefficients(5))
    assert torch.allclose(w.detach(), expected, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matrices_stacked_by_shape_equal_each_orthogonalised_alone(dtype):
    """One batched Newton-Schulz run per block shape: whole matrices of two shapes, and heads cut by
    rows and by columns whose blocks share a shape with a whole matrix."""
    from attn_mt.training.muon import orthogonalise_stacked

    torch.manual_seed(0)
    grads = [torch.randn(64, 32), torch.randn(64, 32), torch.randn(48, 32), torch.randn(24, 32),
             torch.randn(32, 24)]
    # 48 x 32 by rows: (24, 32) twice; 32 x 24 by cols: (32, 8)
    cuts = [None, None, ("rows", 2), None, ("cols", 3)]
    ns = ns_coefficients(3, "polar")
    stacked, single = (orthogonalise_stacked(grads, cuts, ns, dtype, stack)
                       for stack in (True, False))
    for g, cut, (update, block), (one, _) in zip(grads, cuts, stacked, single, strict=True):
        alone = (orthogonalise(g, ns, dtype) if cut is None
                 else orthogonalise_heads(g, cut, ns, dtype))
        assert update.shape == g.shape and update.dtype == dtype and torch.equal(one, alone)
        torch.testing.assert_close(update.float(), alone.float(), atol=1e-5
                                   if dtype == torch.float32 else 2e-2, rtol=0)
        assert block == (g.shape if cut is None else (24, 32) if cut[0] == "rows" else (32, 8))


@pytest.mark.parametrize("threads, stacked", [(1, False), (2, True)])
def test_a_cpu_step_stacks_the_blocks_with_two_threads_or_more(threads, stacked, monkeypatch):
    """Stacked, the Muon step of configs/multi30k.yaml took 0.74x-0.76x of the one-by-one time on 2
    cores, and 0.99x-1.06x on one thread (docs/performance.md)."""
    import attn_mt.training.muon as muon

    seen, real = [], muon.orthogonalise_stacked
    monkeypatch.setattr(muon, "orthogonalise_stacked", lambda *a: seen.append(a[-1]) or real(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        m = model()
        opt = MuonAdamW(m, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.0, momentum=0.0)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    finally:
        torch.set_num_threads(before)
    assert seen == [stacked]
