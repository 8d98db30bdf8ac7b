"""Position schemes: the tables they add, the rotation and bias they give self-attention on every
path, the parameters the init leaves alone, the checkpoint keys they keep, whether they export."""

import pytest
import torch
from conftest import with_distance_bias

from attn_mt.config import TransformerConfig
from attn_mt.config.marian import MarianConfig
from attn_mt.models import build_model
from attn_mt.models.attention import MultiHeadAttention
from attn_mt.models.imported import MarianSinusoidal
from attn_mt.models.positions import SCHEMES, Learned, Positions, Rotary, Sinusoidal
from attn_mt.models.transformer import Transformer


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
    turned = Rotary(8, 50).attending(2, 5, 5, x.device).rotation(x)
    z = torch.complex(x[..., :4], x[..., 4:])
    angle = torch.arange(2, 7)[:, None] / 10000.0 ** (torch.arange(4) / 4)  # (T, Dh/2)
    w = z * torch.polar(torch.ones_like(angle), angle.float())
    torch.testing.assert_close(turned, torch.cat([w.real, w.imag], dim=-1), atol=1e-5, rtol=0)
    rows = Rotary(8, 50).attending(torch.tensor([[0], [2]]), 5, 5, x.device)  # different steps
    torch.testing.assert_close(rows.rotation(x)[1], turned[1])


def test_rotary_scores_depend_on_the_distance_only():
    rotary = Rotary(8, 50)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    turn = [rotary.attending(i, 1, 1, q.device).rotation for i in (0, 3, 5, 8, 40, 43)]
    score = [(turn[n + 1](q) * turn[n](k)).sum(-1) for n in (0, 2, 4)]
    torch.testing.assert_close(score[0], score[1])
    torch.testing.assert_close(score[0], score[2])
    assert not torch.allclose(score[0], (q * k).sum(-1))  # a distance of 3 is not 0
    model = make(positions="rotary")
    assert (model.pos.pe.numel() == 0 and isinstance(model.pos, Rotary)
            and model.tgt_pos is model.pos)
    assert model.pos.d_k == 8
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 4, 32)
    cross = model.decoder[0].cross_attn.eval()  # cross-attention is never turned
    turned = cross(x, memory, positions=model.pos.attending(5, 3, 3, x.device))[0]
    torch.testing.assert_close(turned, cross(x, memory)[0])


def test_only_additive_schemes_add_and_only_rotary_rotates():
    x = torch.randn(1, 3, 32)
    for name, scheme in SCHEMES.items():
        pos = scheme.from_config(TransformerConfig(d_model=32, n_heads=4, positions=name))
        assert (pos.attending(0, 3, 3, x.device) is not None) == (name == "rotary")
        assert torch.equal(pos(x), x) == (name == "rotary")
    assert torch.equal(Positions()(x, 2), x) and Positions().attending(0, 3, 3, x.device) is None


def test_a_bias_scheme_adds_to_the_scores_alike_on_every_path():
    """A scheme that adds a bias to self-attention's scores: the fused kernel and the reference
    agree, a step at a time with the cache as the whole target, and the weights are
    softmax(q . k / sqrt(d_k) + bias)."""
    model = with_distance_bias(make()).eval()
    src, tgt = torch.randint(4, 40, (2, 6)), torch.randint(4, 40, (2, 5))
    src[0, 4:] = 0  # padding
    with torch.no_grad():
        fused = model(src, tgt)
        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.impl = "reference"
        reference = model(src, tgt)
        torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)
        mask = model.src_mask(src)
        memory, cache = model.encode(src, mask), model.new_cache()
        steps = [model.decode(tgt[:, i : i + 1], memory, mask, cache) for i in range(5)]
        torch.testing.assert_close(torch.cat(steps, 1), reference, atol=1e-5, rtol=0)
        x = torch.randn(1, 4, 32)
        attn = model.encoder[0].self_attn
        _, w = attn(x, positions=model.pos.attending(0, 4, 4, x.device), need_weights=True)
        q, k, _ = attn.project(x, None, None, None)  # (1, H, 4, d_k)
        far = -torch.tensor([0.5, 0.25, 0.125, 0.0625])[:, None, None] * torch.tensor(
            [[abs(i - j) for j in range(4)] for i in range(4)])
        torch.testing.assert_close(w, (q @ k.transpose(-2, -1) / 8**0.5 + far).softmax(-1))
        # the bias counts: no bias, other numbers
        assert not torch.allclose(reference, with_distance_bias(model, (0.0,) * 4)(src, tgt))


def test_the_init_leaves_every_schemes_parameters_as_it_made_them():
    """The weight init asks the modules (`keeps_init`), not the parameters' names: a new scheme's
    table, under any name, keeps its init."""

    class Ones(Positions):
        def __init__(self, d_model: int, max_positions: int) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.ones(max_positions, d_model))
            self.scale = torch.nn.Parameter(torch.full((d_model,), 2.0))  # and its 1-D ones

    class WithOnes(Transformer):
        def position_scheme(self, cfg):
            return Ones(cfg.d_model, cfg.max_positions)

    cfg = TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64)
    model = WithOnes(cfg, src_vocab=40, tgt_vocab=40, pad_id=0, shared_vocab=True)
    assert torch.equal(model.pos.table, torch.ones(256, 32)) and bool((model.pos.scale == 2).all())
    assert not torch.equal(model.encoder[0].self_attn.out_proj.weight, torch.ones(32, 32))


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
