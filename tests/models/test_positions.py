"""Position schemes: the tables they add, the rotation they give self-attention, the checkpoint keys
they keep."""

import pytest
import torch

from attn_mt.config import TransformerConfig
from attn_mt.config.marian import MarianConfig
from attn_mt.models import build_model
from attn_mt.models.imported import MarianSinusoidal
from attn_mt.models.positions import SCHEMES, Learned, Rotary, Sinusoidal


def make(**kw):
    torch.manual_seed(0)
    # Marian's table: its own kind
    kind = MarianConfig if kw.get("positions") == "halves" else TransformerConfig
    cfg = kind(**{"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "dropout": 0.0, **kw})
    return build_model(cfg, src_vocab=40, tgt_vocab=40, pad_id=0, shared_vocab=True)


def test_sinusoidal_positions():
    pe = Sinusoidal(16, 50).pe
    assert (torch.allclose(pe[0, 0::2], torch.zeros(8))
            and torch.allclose(pe[0, 1::2], torch.ones(8)))
    assert torch.allclose(pe[3, 0], torch.sin(torch.tensor(3.0)))


def test_marians_table_holds_the_same_sinusoids_sines_first():
    ours, marian = Sinusoidal(16, 50).pe, MarianSinusoidal(16, 50).pe
    torch.testing.assert_close(marian[:, :8], ours[:, 0::2], atol=1e-5, rtol=0)
    torch.testing.assert_close(marian[:, 8:], ours[:, 1::2], atol=1e-5, rtol=0)


def test_a_table_is_added_at_the_offset_of_each_row():
    pos = Sinusoidal(8, 20)
    x = torch.zeros(2, 3, 8)
    torch.testing.assert_close(pos(x, 4), pos.pe[4:7].expand(2, 3, 8))
    rows = pos(x, torch.tensor([[0], [5]]))  # (B, 1): rows at different steps
    torch.testing.assert_close(rows[1], pos.pe[5:8])
    torch.testing.assert_close(rows[0], pos.pe[0:3])


def test_rotation_is_rope_as_complex_numbers():
    """Pair (x_i, x_i+Dh/2) as the complex number x_i + i x_i+Dh/2, multiplied by e^(i pos /
    base^(2i/Dh))."""
    x = torch.randn(2, 3, 5, 8)
    turned = Rotary(8, 50).rotation(2, 5, x.device)(x)
    z = torch.complex(x[..., :4], x[..., 4:])
    angle = torch.arange(2, 7)[:, None] / 10000.0 ** (torch.arange(4) / 4)  # (T, Dh/2)
    w = z * torch.polar(torch.ones_like(angle), angle.float())
    torch.testing.assert_close(turned, torch.cat([w.real, w.imag], dim=-1), atol=1e-5, rtol=0)
    rows = Rotary(8, 50).rotation(torch.tensor([[0], [2]]), 5, x.device)  # rows at different steps
    torch.testing.assert_close(rows(x)[1], turned[1])


def test_rotary_scores_depend_on_the_distance_only():
    rotary = Rotary(8, 50)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    score = [(rotary.rotation(i + 3, 1, q.device)(q) * rotary.rotation(i, 1, q.device)(k)).sum(-1)
             for i in (0, 5, 40)]
    torch.testing.assert_close(score[0], score[1])
    torch.testing.assert_close(score[0], score[2])
    assert not torch.allclose(score[0], (q * k).sum(-1))  # a distance of 3 is not 0
    model = make(positions="rotary")
    assert (model.pos.pe.numel() == 0 and isinstance(model.pos, Rotary)
            and model.tgt_pos is model.pos)
    assert model.pos.d_k == 8
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 4, 32)
    cross = model.decoder[0].cross_attn.eval()  # cross-attention is never turned
    torch.testing.assert_close(cross(x, memory, rotation=model.pos.rotation(5, 3, x.device))[0],
                               cross(x, memory)[0])


def test_only_additive_schemes_add_and_only_rotary_rotates():
    x = torch.randn(1, 3, 32)
    for name, scheme in SCHEMES.items():
        pos = scheme.from_config(TransformerConfig(d_model=32, n_heads=4, positions=name))
        assert (pos.rotation(0, 3, x.device) is not None) == (name == "rotary")
        assert torch.equal(pos(x), x) == (name == "rotary")


@pytest.mark.parametrize("positions", ["interleaved", "halves", "rotary", "learned"])
def test_checkpoint_keys_are_those_of_before(positions):
    """Only learned tables are saved, as pos.pe and tgt_pos.pe: checkpoints of every scheme load as
    before."""
    model = make(positions=positions)
    keys = {k for k in model.state_dict() if "pos" in k}
    assert keys == ({"pos.pe", "tgt_pos.pe"} if positions == "learned" else set())


def test_learned_positions_are_a_trained_table_per_side():
    from attn_mt.training.muon import muon_params

    sinusoids, learned = make(), make(positions="learned")
    assert isinstance(learned.pos, Learned) and isinstance(sinusoids.pos, Sinusoidal)
    assert sinusoids.tgt_pos is sinusoids.pos and not any("pe" in k for k in sinusoids.state_dict())
    assert (learned.tgt_pos is not learned.pos
            and {"pos.pe", "tgt_pos.pe"} <= set(learned.state_dict()))
    table = learned.pos.pe
    assert table.shape == (learned.max_positions, 32) and table.requires_grad
    # N(0, 1/D)
    assert abs(table.std().item() - 32**-0.5) < 0.02 and not torch.equal(table, learned.tgt_pos.pe)
    # AdamW trains them, as the embeddings
    assert not {"pos.pe", "tgt_pos.pe"} & muon_params(learned)
    src, tgt = torch.randint(4, 40, (2, 6)), torch.randint(4, 40, (2, 5))
    learned(src, tgt).float().logsumexp(-1).sum().backward()
    # only positions used
    assert learned.pos.pe.grad[:6].abs().sum() > 0 and not learned.pos.pe.grad[6:].any()
    assert learned.tgt_pos.pe.grad[:5].abs().sum() > 0 and not learned.tgt_pos.pe.grad[5:].any()
    # the table is what the model adds: another row at position 0 changes the output
    with torch.no_grad():
        before = learned.encode(src, learned.src_mask(src))
        learned.pos.pe[0] += 1.0
        assert not torch.allclose(before, learned.encode(src, learned.src_mask(src)))
