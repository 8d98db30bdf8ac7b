import pytest
import torch
import torch.nn.functional as F

from attn_mt.config import TransformerConfig
from attn_mt.models import build_model


def make(**kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(**{"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64,
                               "dropout": 0.0, **kw})
    return build_model(cfg, src_vocab=40, tgt_vocab=30 if not kw.get("shared", True) else 40,
                       pad_id=0, shared_vocab=True)


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
    separate = build_model(TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64),
                           src_vocab=40, tgt_vocab=30, pad_id=0, shared_vocab=False)
    assert (separate.src_embed is not separate.tgt_embed
            and separate.out_proj.weight is separate.tgt_embed.weight)
    untied = make(tie_embeddings=False)
    assert untied.out_proj.weight is not untied.tgt_embed.weight


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
    assert layer.self_attn.p_drop == layer.cross_attn.p_drop == 0.0
    assert layer.ff[2].p == 0.1 and layer.sub[0].drop.p == 0.3 and model.drop.p == 0.3
    inherit = make(dropout=0.2).encoder[0]  # unset: the general rate
    assert inherit.self_attn.p_drop == 0.2 and inherit.ff[2].p == 0.2


@pytest.mark.parametrize("kw", [dict(qk_norm=True), dict(norm="rms"), dict(activation="relu2"),
                                dict(activation="gelu"), dict(activation="swiglu"),
                                dict(zero_init=True), dict(positions="rotary", qk_norm=True),
                                dict(positions="learned")],
                         ids=["qk_norm", "rms", "relu2", "gelu", "swiglu", "zero_init", "rotary",
                              "learned"])
def test_speedrun_layers_decode_step_by_step_as_in_one_pass(kw):
    model = make(**kw).eval()
    with torch.no_grad():
        # zero_init's zeros and the norms' ones made noisy: every weight counts
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    src, tgt = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 5))
    mask = model.src_mask(src)
    memory = model.encode(src, mask)
    cache = model.new_cache()
    steps = torch.cat([model.decode(tgt[:, i : i + 1], memory, mask, cache) for i in range(5)],
                      dim=1)
    torch.testing.assert_close(steps, model.decode(tgt, memory, mask), atol=1e-5, rtol=0)


def test_speedrun_layers_are_what_they_say():
    plain, qk, rms = make(), make(qk_norm=True), make(norm="rms")
    assert isinstance(qk.encoder[0].self_attn.q_norm, torch.nn.RMSNorm)
    assert isinstance(plain.encoder[0].self_attn.k_norm, torch.nn.Identity)
    assert (isinstance(rms.enc_norm, torch.nn.RMSNorm)
            and isinstance(rms.decoder[0].sub[2].norm, torch.nn.RMSNorm))
    x = torch.randn(4, 32)
    assert torch.equal(make(activation="relu2").encoder[0].ff[1](x), F.relu(x) ** 2)
    glu = make(activation="swiglu")
    n = sum(p.numel() for p in glu.encoder[0].ff.parameters())
    # equal weights, +- rounding
    assert abs(n - sum(p.numel() for p in plain.encoder[0].ff.parameters())) <= 32 * 3
    zero = make(zero_init=True)
    assert (not zero.encoder[0].self_attn.out_proj.weight.any()
            and not zero.decoder[1].ff[-1].weight.any())
    src = torch.randint(4, 40, (2, 6))
    emb = zero._embed(zero.src_embed, zero.pos, src)
    # layers add nothing yet
    torch.testing.assert_close(zero.encode(src, zero.src_mask(src)), zero.enc_norm(emb))


def test_z_loss_adds_the_squared_log_normaliser_of_real_tokens():
    from types import SimpleNamespace

    from attn_mt.models import loss_sum

    model = make()
    src, tgt_in = torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))
    tgt_out = tgt_in.clone()
    tgt_out[1, 2:] = 0  # padding
    batch = SimpleNamespace(src=src, tgt_in=tgt_in, tgt_out=tgt_out)
    lz = model(src, tgt_in).float().logsumexp(-1)[tgt_out != 0]
    torch.testing.assert_close(loss_sum(model, batch, 0.0, 0, z_loss=1e-2)
                               - loss_sum(model, batch, 0.0, 0), 1e-2 * lz.square().sum(),
                               atol=1e-4, rtol=1e-4)
