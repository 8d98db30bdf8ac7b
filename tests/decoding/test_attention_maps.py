"""Attention figures: the weights of every layer and head, and the PNGs drawn from them."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attn_mt.checkpoint import load_model
from attn_mt.cli import app
from attn_mt.config import DecodeConfig
from attn_mt.decoding.attention_maps import attention_maps


@pytest.fixture(scope="module")
def run(tiny_run):
    return load_model(tiny_run / "checkpoint_best.pt")


def test_maps_cover_every_layer_and_head_and_are_distributions(run):
    model, cfg, tok = run
    translation, maps = attention_maps(model, tok, "the dog sees the cat.",
                                       DecodeConfig(max_len_b=4))
    layers, heads = cfg.model.n_layers, cfg.model.n_heads
    assert sorted((m.kind, m.layer) for m in maps) == sorted(
        (k, i) for k in ("encoder_self", "decoder_self", "cross") for i in range(1, layers + 1))
    n_src = len(tok.src_pieces("the dog sees the cat.")) + 1  # with eos
    for m in maps:
        assert m.weights.shape == (heads, len(m.queries), len(m.keys))
        assert torch.allclose(m.weights.sum(-1), torch.ones(heads, len(m.queries)), atol=1e-5)
        assert len(m.keys) == (n_src if m.kind != "decoder_self" else len(m.queries))
    dec = next(m for m in maps if m.kind == "decoder_self")
    assert torch.all(dec.weights.triu(1) == 0)  # causal: no weight on later target tokens
    assert all(m.impl == "sdpa" for m in model.modules() if hasattr(m, "impl"))  # switched back


def test_cli_writes_one_png_per_layer_and_kind(tiny_run, tmp_path):
    out = tmp_path / "figs"
    args = ["attention", "--checkpoint", str(tiny_run / "checkpoint_best.pt"), "--out", str(out),
            "--device", "cpu", "a woman 😀 likes the old horses."]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["cross_layer1.png", "decoder_self_layer1.png", "encoder_self_layer1.png"]
    assert all((out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    empty = CliRunner().invoke(app, ["attention", "--checkpoint",
                                     str(tiny_run / "checkpoint_best.pt"), "--out", str(out), " "])
    assert empty.exit_code == 2
