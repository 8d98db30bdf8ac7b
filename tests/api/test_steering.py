"""Steered decoding and placement (attn_mt/api/steering.py): a target prefix, sampling with a
temperature and a seed, the token stream, `dtype`, `Model.to` and `Model.save`."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import attn_mt

TEXTS = ["a small dog sees the old man.", "yesterday the children find the red ball.", "",
         "the cat sleeps."]


@pytest.fixture(scope="module")
def model(tiny_run):
    return attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")


def _ids(model, text):
    return model.tokenizer.encode_tgt([text])[0]


@pytest.mark.parametrize("beam", [1, 3])
def test_a_target_prefix_starts_every_translation_and_its_log_prob_is_the_models(model, beam):
    prefix = "die Kinder finden"
    nbest = model.translate_nbest(TEXTS, beam=beam, nbest=beam, target_prefix=prefix)
    for text, hyps in zip(TEXTS, nbest, strict=True):
        if not text:
            assert hyps[0].text == ""
            continue
        for h in hyps:
            assert _ids(model, h.text)[: len(_ids(model, prefix))] == _ids(model, prefix), h.text
            scored = model.score(text, h.text)
            # the prefix's tokens count, as the model gives them
            assert abs(scored.log_prob - h.log_prob) < 1e-3
    per_text = model.translate(TEXTS[:2], beam=beam, target_prefix=["ein", "gestern"])
    assert per_text[0].startswith("ein") and per_text[1].startswith("gestern")


def test_sampling_is_reproducible_with_a_seed_and_varies_without_one(model):
    first = model.translate(TEXTS, temperature=1.5, seed=7)
    assert model.translate(TEXTS, temperature=1.5, seed=7) == first
    draws = {tuple(model.translate(TEXTS[:2], temperature=2.0, seed=s)) for s in range(6)}
    assert len(draws) > 1
    # cold: greedy
    assert model.translate(TEXTS, temperature=1e-4, seed=1) == model.translate(TEXTS, beam=1)
    scored = model.score(TEXTS[0], first[0])
    sampled = model.translate_nbest(TEXTS[0], beam=1)[0]
    # greedy is the likelier
    assert scored.log_prob <= sampled.log_prob + 1e-4 or first[0] == sampled.text
    with pytest.raises(attn_mt.InputError) as e:
        model.translate(TEXTS[0], beam=3, temperature=1.0)
    assert e.value.field == "beam"
    # one that beams
    wide = attn_mt.Model(replace(model.translator, decode=replace(model.decode, beam_size=4)))
    assert wide.translate(TEXTS, temperature=1.5, seed=7) == first  # sampling: greedy steps, beam 1


SIX = ["a small dog sees the old man.", "yesterday the children find the red ball.",
       "the cat sleeps.", "two cats sleep.", "the old man sees a small dog.", "a dog runs."]


def test_an_unseeded_sample_leaves_the_global_rng_as_it_was(model):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model.translate(SIX[:2], temperature=1.0)  # no seed: a fresh one, not torch.seed()
    assert torch.equal(torch.get_rng_state(), before)


def test_a_seeded_sample_is_the_same_alone_in_any_batch_and_beside_any_texts(model):
    together = model.translate(SIX, temperature=1.5, seed=7)
    assert [model.translate(t, temperature=1.5, seed=7) for t in SIX] == together
    assert model.translate(SIX, temperature=1.5, seed=7, batch_size=1) == together
    assert model.translate(SIX, temperature=1.5, seed=7, batch_size=4) == together
    assert model.translate(SIX[::-1], temperature=1.5, seed=7) == together[::-1]
    # stripped, as decoded
    assert model.translate([" " + SIX[0]], temperature=1.5, seed=7) == together[:1]
    repeats = model.translate([SIX[1]] * 3, temperature=1.5, seed=7)
    assert repeats[0] == together[1] and len(set(repeats)) > 1  # a repeated text draws again


def test_return_attention_forces_the_sampled_ids_of_the_same_call(model):
    tok = model.tokenizer
    # the snowman: an unknown piece, drawn as ⁇
    steer = dict(temperature=1.5, seed=7, target_prefix="ein \u2603")
    plain = model.translate(SIX, **steer)
    atts = model.translate(SIX, return_attention=True, **steer)
    assert [a.translation for a in atts] == plain
    for att, text in zip(atts, plain, strict=True):
        assert "<unk>" in att.target_tokens and att.target_tokens[-1] == "</s>"
        # the decode's ids, not re-tokenized
        ids = [tok.tgt.piece_to_id(p) for p in att.target_tokens[:-1]]
        assert tok.decode_tgt([ids])[0] == text
    sampled = model.translate(SIX, temperature=1.5, seed=7)
    assert [a.translation for a in model.translate(SIX, temperature=1.5, seed=7,
                                                   return_attention=True)] == sampled


def test_the_stream_gives_the_greedy_translation_a_piece_at_a_time(model):
    for text in TEXTS:
        pieces = list(model.stream(text))
        assert "".join(pieces) == model.translate(text, beam=1)
        assert len(pieces) >= (1 if text else 0)
    pieces = list(model.stream(TEXTS[0], target_prefix="ein Hund"))
    assert "".join(pieces) == model.translate(TEXTS[0], beam=1, target_prefix="ein Hund")
    long = list(model.stream(TEXTS[1]))
    assert len(long) > 2  # more than one piece: it streams


def test_save_writes_a_checkpoint_that_loads_the_same(model, tmp_path):
    path = model.save(tmp_path / "copy.pt")
    again = attn_mt.load(path, device="cpu")
    assert again.translate(TEXTS) == model.translate(TEXTS)
    assert again.info["step"] == model.info["step"]
    with pytest.raises(attn_mt.InputError) as e:
        model.save(tmp_path / "copy.txt")
    assert e.value.field == "path"
    with pytest.raises(attn_mt.InputError):
        model.save(model.path)  # never over the file it was read from


def test_dtype_and_to_cast_and_move_in_place(tiny_run):
    half = attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu", dtype="bfloat16")
    assert next(half.module.parameters()).dtype == torch.bfloat16 and "bfloat16" in repr(half)
    full = attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")
    got, expected = half.translate(TEXTS), full.translate(TEXTS)
    # bf16 rounding may change a word
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= 2
    assert half.to(dtype="float32") is half and half.translate(TEXTS) == expected
    assert half.to("cpu").device == "cpu"
    with pytest.raises(attn_mt.AttnMTError) as e:
        full.to("cuda:99")
    assert e.value.field == "device"


def test_a_prefix_with_a_piece_the_model_never_generates_is_refused_in_one_line(tiny_run, tmp_path):
    """A Marian checkpoint with model.banned_ids (every MarianMT folder bans its pad): a prefix
    holding a banned piece made beam search raise IndexError, n-best return [], sampling raise on
    NaN and greedy emit pad."""
    from attn_mt import checkpoint

    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    plain = attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")
    banned = _ids(plain, "Hund")[-1]
    # Marian's
    state["config"]["model"].update(kind="marian", positions="halves", banned_ids=[banned])
    vocab = state["model"]["out_proj.weight"].size(0)
    state["model"]["out_bias"] = torch.zeros(vocab)  # the kind's logit bias, zero
    checkpoint.save(state, tmp_path / "banned.pt")
    model = attn_mt.load(tmp_path / "banned.pt", device="cpu")
    calls = [lambda: model.translate(TEXTS[0], target_prefix="ein Hund"),
             lambda: model.translate(TEXTS[0], beam=3, target_prefix="ein Hund"),
             lambda: model.translate_nbest(TEXTS[:2], beam=3, nbest=2,
                                           target_prefix=["ein", "ein Hund"]),
             lambda: model.translate(TEXTS[0], temperature=1.0, seed=1, target_prefix="ein Hund"),
             lambda: list(model.stream(TEXTS[0], target_prefix="ein Hund"))]
    for call in calls:
        with pytest.raises(attn_mt.InputError, match="never generates") as e:
            call()
        assert (e.value.field == "target_prefix" and f"(id {banned})" in str(e.value)
                and "\n" not in str(e.value))
    for beam in (1, 3):  # a prefix without it decodes, never choosing the banned piece after it
        out = model.translate(TEXTS[0], beam=beam, target_prefix="ein")
        assert out.startswith("ein") and banned not in _ids(model, out)
