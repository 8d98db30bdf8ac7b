"""analysis/tensors.py: one attention module's inputs, weights and outputs as tensors, for a noisy
2-layer model. Attention redone by hand from them equals the module's own weights and output, for
every kind; a padded batch gives each sentence what it gets alone; the decoder's mask is causal;
named heads switch off and come back."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY, random_checkpoint

import attn_mt
from attn_mt.analysis import inside, without
from attn_mt.config import load_config
from attn_mt.errors import InputError

LONG, SHORT = "the old man sees a small dog.", "a dog."


@pytest.fixture(scope="module")
def model(tiny_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("tensors") / "noisy.pt"
    random_checkpoint(lambda *o: load_config(None, [*TINY, *o]), tiny_run, path,
                      "decode.max_len_a=0.0", "decode.max_len_b=8")
    return attn_mt.load(path, device="cpu")


def by_hand(a) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (B, H, T, S), output (B, T, D)) from the module's inputs, projections and mask."""
    b, t, d = a.x.shape

    def heads(m: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, H, L, d_k)
        return m.view(b, m.shape[1], a.n_heads, a.d_k).transpose(1, 2)

    q, k, v = (heads(a.x @ a.w_q.T + a.b_q), heads(a.context @ a.w_k.T + a.b_k),
               heads(a.context @ a.w_v.T + a.b_v))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(a.d_k)).masked_fill(
        ~a.mask[:, None], float("-inf"))
    w = scores.softmax(-1)
    return w, (w @ v).transpose(1, 2).reshape(b, t, d) @ a.w_o.T + a.b_o


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_attention_by_hand_equals_the_modules_own_weights_and_output(model, kind):
    a = inside(model, [LONG, SHORT], kind=kind, layer=2)
    w, out = by_hand(a)
    assert torch.allclose(w, a.weights, atol=1e-5)
    assert torch.allclose(out, a.output, atol=1e-4)
    e = model.explain(LONG, kind=kind, layer=2, head=2, token=1)  # greedy, as inside's translations
    assert torch.allclose(w[0, 1, 1, : len(e.keys)], torch.tensor([key.weight for key in e.keys]),
                          atol=1e-5)
    assert torch.allclose(a.attend(a.x, a.context, a.mask)[1], a.weights, atol=1e-6)


def test_a_padded_sentence_gets_what_it_gets_alone_and_the_decoder_mask_is_causal(model):
    pair, alone = (inside(model, [LONG, SHORT], kind="encoder", layer=1),
                   inside(model, SHORT, kind="encoder", layer=1))
    n = len(alone.source_tokens[0])
    assert pair.source_tokens[1] == alone.source_tokens[0] and pair.x.shape[1] > n
    assert not pair.mask[1, :, n:].any() and pair.mask[0].all()
    assert torch.allclose(pair.weights[1, :, :n, :n], alone.weights[0], atol=1e-5)
    assert torch.allclose(pair.output[1, :n], alone.output[0], atol=1e-5)
    dec = inside(model, LONG, kind="decoder", layer=1, targets="der alte Mann")
    t = dec.x.shape[1]
    assert dec.target_inputs[0][0] == "<s>" and len(dec.target_inputs[0]) == t
    assert torch.equal(dec.mask[0], torch.ones(t, t, dtype=torch.bool).tril())
    assert dec.embeddings.shape == (1, len(dec.source_tokens[0]), dec.x.shape[2])


def test_without_switches_named_heads_off_inside_its_block_only(model):
    target = "der alte Mann sieht einen kleinen Hund."
    before = inside(model, LONG, kind="cross", layer=1, targets=target)
    with without(model, "cross 1.1", "cross 1.2"):
        off = inside(model, LONG, kind="cross", layer=1, targets=target)
    with without(model, "cross 1.1"):
        one_off = inside(model, LONG, kind="cross", layer=1, targets=target)
    # both heads off: the module's output is W_o's bias alone, whatever the input; one off:
    # something between
    assert torch.allclose(off.output[0], off.b_o.expand_as(off.output[0]), atol=1e-6)
    assert not torch.allclose(one_off.output, off.output, atol=1e-3)
    assert not torch.allclose(one_off.output, before.output, atol=1e-3)
    assert torch.allclose(inside(model, LONG, kind="cross", layer=1, targets=target).output,
                          before.output)


@pytest.mark.parametrize("call, field", [
    (lambda m: inside(m, LONG, kind="self"), "kind"),
    (lambda m: inside(m, LONG, layer=3), "layer"),
    (lambda m: inside(m, [LONG, ""]), "texts"),
    (lambda m: inside(m, [LONG, SHORT], targets=["x"]), "targets"),
    (lambda m: without(m, "cross 3.1").__enter__(), "heads"),
    (lambda m: without(m, "cross 1.9").__enter__(), "heads"),
    (lambda m: without(m, "heads").__enter__(), "heads"),
])
def test_bad_arguments_name_their_field(model, call, field):
    with pytest.raises(InputError) as err:
        call(model)
    assert err.value.field == field
