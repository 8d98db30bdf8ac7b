"""The fast path (models/fast.py): each piece gives the numbers of its plain version."""

import pytest
import torch

from attn_mt.models.attention import attention, causal_mask
from attn_mt.models.fast import Dropout, RMSNorm, fused_attention, fused_is_faster


@pytest.mark.parametrize("biased", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cached", [False, True], ids=["whole", "cache"])
def test_fused_kernel_is_the_reference_on_random_inputs(causal, cached, biased):
    """The fused kernel gives `attention`'s output (dropout off), with padding and causal masks,
    queries as many as the keys or the last few of them (a cache), and with a position scheme's
    bias on the scores (per head, or per sentence and head)."""
    torch.manual_seed(0)
    for n in range(5):
        b, h, dh, s = 3, 4, 8, int(torch.randint(2, 12, ()))
        t = int(torch.randint(1, s + 1, ())) if cached else s
        q, k, v = torch.randn(b, h, t, dh), torch.randn(b, h, s, dh), torch.randn(b, h, s, dh)
        keep = torch.rand(b, 1, 1, s) > 0.3
        keep[..., 0] = True  # every query keeps a key: the first, which the causal mask never hides
        bias = 3 * torch.randn(*((b,) if n % 2 else ()), h, t, s) if biased else None
        for mask in (None, keep):
            future = causal_mask(t, s)
            full = mask if not causal else (future if mask is None else mask & future)
            ref, _ = attention(q, k, v, full, bias=bias)
            # SDPA's is_causal, as the modules call it
            plain = causal and mask is None and t == s and bias is None
            got = fused_attention(q, k, v, None if plain else full, plain, 0.0, bias)
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
            if biased:  # the bias counts
                assert not torch.allclose(got, attention(q, k, v, full)[0], atol=1e-3)


def test_cpu_training_takes_the_explicit_formula_and_everything_else_the_fused_kernel():
    q = torch.zeros(1, 1, 2, 4)
    assert not fused_is_faster(q, training=True) and fused_is_faster(q, training=False)
    assert fused_is_faster(q.to("meta"), training=True)


def test_rms_norm_computes_in_fp32_and_returns_the_inputs_dtype():
    torch.manual_seed(0)
    norm, plain = RMSNorm(16), torch.nn.RMSNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        plain.weight.copy_(norm.weight)
    x = torch.randn(3, 16).bfloat16()
    y = norm(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, plain(x.float()).bfloat16(), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_keeps_expectation(dtype):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000, dtype=dtype, requires_grad=True)
    y = Dropout(0.1).train()(x)
    assert y.dtype == dtype and y.shape == x.shape
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 26 / 256) < 0.002  # p rounded to 1/256: 0.1 -> 26/256
    assert abs(y.float().mean().item() - 1) < 0.01
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # gradient = mask x scale = y for x = 1
    assert torch.equal(Dropout(0.1).eval()(x), x)


def test_fast_dropout_is_seeded_and_lanes_are_uniform():
    x = torch.ones(4, 1001)  # numel not a multiple of 8
    drop = Dropout(0.5).train()
    torch.manual_seed(3)
    a = drop(x)
    torch.manual_seed(3)
    assert torch.equal(a, drop(x))
    torch.manual_seed(0)
    keep = (drop(torch.ones(100_000, 8)) != 0).float().mean(0)  # the 8 lanes of a 64-bit word
    assert torch.all((keep - 0.5).abs() < 0.01), keep


@pytest.mark.parametrize("p", [0.001, 0.999])
def test_fast_dropout_leaves_rates_it_cannot_round_to_f_dropout(p):
    torch.manual_seed(0)
    y = Dropout(p).train()(torch.ones(100_000))  # p * 256 rounds to 0 or 256: F.dropout's exact p
    assert torch.isfinite(y).all()
    assert abs((y == 0).float().mean().item() - p) < 0.002
