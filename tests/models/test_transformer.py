import pytest
import torch
import torch.nn.functional as F

from attn_mt.config import TransformerConfig
from attn_mt.models import build_model
from attn_mt.models.transformer import PositionalEncoding


def make(**kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(**{"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "dropout": 0.0, **kw})
    return build_model(cfg, src_vocab=40, tgt_vocab=30 if not kw.get("shared", True) else 40, pad_id=0,
                       shared_vocab=True)


def test_shapes_encode_decode():
    model = make()
    src, tgt = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 5))
    mask = model.src_mask(src)
    memory = model.encode(src, mask)
    assert mask.shape == (3, 1, 1, 7) and memory.shape == (3, 7, 32)
    assert model.decode(tgt, memory, mask).shape == (3, 5, 40)


def test_tied_embeddings():
    model = make()
    assert model.src_embed is model.tgt_embed
    assert model.out_proj.weight is model.tgt_embed.weight
    separate = build_model(TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64), src_vocab=40,
                           tgt_vocab=30, pad_id=0, shared_vocab=False)
    assert separate.src_embed is not separate.tgt_embed and separate.out_proj.weight is separate.tgt_embed.weight
    untied = make(tie_embeddings=False)
    assert untied.out_proj.weight is not untied.tgt_embed.weight


def test_sinusoidal_positions():
    pe = PositionalEncoding(16, 50).pe
    assert torch.allclose(pe[0, 0::2], torch.zeros(8)) and torch.allclose(pe[0, 1::2], torch.ones(8))
    assert torch.allclose(pe[3, 0], torch.sin(torch.tensor(3.0)))


@pytest.mark.slow
def test_post_norm_also_learns():
    for norm_first in (True, False):
        model = make(norm_first=norm_first).train()
        src = torch.randint(4, 40, (4, 6))
        tgt = torch.cat([torch.full((4, 1), 2), src[:, :5]], dim=1)
        out = torch.cat([src[:, :5], torch.full((4, 1), 3)], dim=1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(40):
            loss = F.cross_entropy(model(src, tgt).flatten(0, 1), out.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.2 * losses[0], (norm_first, losses[0], losses[-1])


def test_dropout_only_in_training():
    model = make(dropout=0.5)
    src, tgt = torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt))
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))


def test_separate_attention_and_activation_dropout():
    src, tgt = torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))

    def varies(**kw):
        model = make(**kw).train()
        return not torch.allclose(model(src, tgt), model(src, tgt))

    # each rate alone reaches the model; 0 turns its site off while the others stay on
    assert not varies(dropout=0.0)
    assert varies(dropout=0.0, attention_dropout=0.5)
    assert varies(dropout=0.0, activation_dropout=0.5)
    assert not varies(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = make(dropout=0.3, attention_dropout=0.0, activation_dropout=0.1)
    layer = model.decoder[0]
    assert layer.self_attn.dropout == layer.cross_attn.dropout == 0.0
    assert layer.ff[2].p == 0.1 and layer.sub[0].dropout.p == 0.3 and model.dropout.p == 0.3
    inherit = make(dropout=0.2).encoder[0]  # unset: the general rate
    assert inherit.self_attn.dropout == 0.2 and inherit.ff[2].p == 0.2
