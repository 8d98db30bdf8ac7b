import torch

from attn_mt.config import TransformerConfig
from attn_mt.models import build_model
from attn_mt.models.attention import (
    CrossAttention,
    SelfAttention,
    attention,
    causal_mask,
    padding_mask,
)


def both_paths(mha, *args, **kwargs):
    """Outputs of the SDPA and the reference path, and the weights the reference path returns."""
    mha.impl = "sdpa"
    fast, none = mha(*args, **kwargs)
    assert none is None  # weights only when asked for
    mha.impl = "reference"
    ref, _ = mha(*args, **kwargs)
    _, weights = mha(*args, **kwargs, need_weights=True)
    both_paths.weights = weights
    return fast, ref


def test_reference_is_the_textbook_formula():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    out, w = attention(q, k, v)
    expected_w = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 4))


def test_reference_hands_back_its_steps():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    mask = torch.tensor([True, True, False, True, True])
    steps = {}
    _, w = attention(q, k, v, mask, trace=steps)
    torch.testing.assert_close(steps["scores"], q @ k.transpose(-1, -2))
    # unmasked: the masked key shows too
    torch.testing.assert_close(steps["scaled"], steps["scores"] / 8**0.5)
    assert torch.all(w[..., 2] == 0)


def test_sdpa_matches_reference_with_padding_and_causal_masks():
    torch.manual_seed(0)
    mha = SelfAttention(d_model=32, n_heads=4).eval()
    x, ctx = torch.randn(3, 7, 32), torch.randn(3, 9, 32)
    ids = torch.tensor([[5] * 9, [5] * 6 + [0] * 3, [5] * 2 + [0] * 7])
    src_mask = padding_mask(ids, 0)
    cross = CrossAttention(d_model=32, n_heads=4).eval()
    cross.load_state_dict({k: v for k, v in cross.state_dict().items()})
    fast, ref = both_paths(cross, x, ctx, src_mask)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    fast, ref = both_paths(mha, ctx, mask=src_mask)  # encoder self-attention with padding
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    fast, ref = both_paths(mha, x, causal=True)  # decoder self-attention
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    tgt_pad = padding_mask(torch.tensor([[5] * 7, [5] * 4 + [0] * 3, [5] * 7]), 0)
    fast, ref = both_paths(mha, x, mask=tgt_pad & causal_mask(7), causal=False)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert both_paths.weights.shape == (3, 4, 7, 7)


def test_padded_keys_get_zero_weight():
    torch.manual_seed(0)
    mha = SelfAttention(d_model=16, n_heads=2).eval()
    ids = torch.tensor([[4, 4, 4, 0, 0]])
    _, weights = mha(torch.randn(1, 5, 16), mask=padding_mask(ids, 0), need_weights=True)
    assert torch.all(weights[..., 3:] == 0)


def tiny_model(impl="sdpa"):
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, attention=impl)
    return build_model(cfg, src_vocab=50, tgt_vocab=50, pad_id=0, shared_vocab=True).eval()


def test_future_target_tokens_cannot_change_earlier_outputs():
    model = tiny_model()
    src = torch.randint(4, 50, (2, 6))
    tgt = torch.randint(4, 50, (2, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, 50, (2, 3))
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_extra_source_padding_changes_nothing():
    for impl in ("sdpa", "reference"):
        model = tiny_model(impl)
        src = torch.randint(4, 50, (2, 6))
        tgt = torch.randint(4, 50, (2, 5))
        padded = torch.cat([src, torch.zeros(2, 4, dtype=torch.long)], dim=1)
        torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-5)


def test_whole_model_paths_agree():
    fast, ref = tiny_model("sdpa"), tiny_model("reference")
    src = torch.tensor([[5, 6, 7, 3, 0, 0], [8, 9, 10, 11, 12, 3]])
    tgt = torch.tensor([[2, 5, 6, 0], [2, 7, 8, 9]])
    torch.testing.assert_close(fast(src, tgt), ref(src, tgt), atol=1e-5, rtol=1e-5)


def test_no_torch_transformer_modules_in_model():
    model = tiny_model()
    banned = (torch.nn.Transformer, torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer,
              torch.nn.TransformerDecoderLayer)
    assert not any(isinstance(m, banned) for m in model.modules())
