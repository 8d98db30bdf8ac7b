"""decoding/translator.py: a checkpoint opens as a Translator; non-finite weights refused, not
translated."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.checkpoint import CheckpointError
from attn_mt.cli import app as cli
from attn_mt.decoding.translate import translate_nbest
from attn_mt.decoding.translator import checkpoint_translator


def test_a_checkpoint_opens_and_translates_as_translate_nbest(tiny_run):
    path = tiny_run / "checkpoint_best.pt"
    t = checkpoint_translator(path, "cpu")
    model, cfg, tok = checkpoint.load_model(path)
    assert (t.kind == "checkpoint" and t.decode == cfg.decode
            and t.state["step"] == checkpoint.load(path)["step"])
    texts = ["a dog", "", "the old man sees a small dog."]
    assert t.translate_nbest(texts, cfg.decode) == translate_nbest(model, tok, texts, cfg.decode)


def test_non_finite_weights_are_refused_in_one_line(tiny_run, tmp_path):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    # not tied
    name = next(k for k in state["model"] if k.startswith("encoder.") and k.endswith(".weight"))
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    with pytest.raises(CheckpointError, match=f"not finite.*{name}"):
        checkpoint_translator(bad, "cpu")
    r = CliRunner().invoke(cli, ["translate", "--checkpoint", str(bad), "a dog"])
    assert (r.exit_code == 1 and "not finite" in r.output and r.output.count("\n") == 1
            and "Traceback" not in r.output)


def test_decode_options_name_the_flags_or_fields_of_their_caller():
    from attn_mt.cli import DECODE_FLAGS
    from attn_mt.config import ARGS, DecodeConfig
    from attn_mt.config.yamlconf import OptionError
    from attn_mt.decoding.translator import decode_options

    defaults = DecodeConfig(beam_size=4, nbest=2, alpha=0.6)
    assert decode_options(defaults) == defaults  # nothing given: the model's own section
    assert (decode_options(defaults, beam_size=6, alpha=1.0, nbest=1)
            == DecodeConfig(beam_size=6, alpha=1.0, nbest=1))
    with pytest.raises(OptionError, match=r"^--beam 0: must be >= 1$") as e:
        decode_options(defaults, DECODE_FLAGS, beam_size=0)
    # as the caller spells it: the CLI marks the flag, the API the argument
    assert e.value.option == "--beam"
    with pytest.raises(OptionError, match=r"5 hypotheses need a beam at least as wide, not --beam "
                       r"3: add --beam 5"):
        decode_options(defaults, DECODE_FLAGS, beam_size=3, nbest=5)
    with pytest.raises(OptionError, match=r"not the checkpoint's beam size \(4\): add beam 5") as e:
        decode_options(defaults, ARGS, nbest=5)
    assert e.value.option == "nbest"


def test_evaluate_texts_scores_the_best_translations(tiny_run):
    from attn_mt.decoding.metrics import score
    from attn_mt.decoding.translator import evaluate_texts

    t = checkpoint_translator(tiny_run / "checkpoint_best.pt", "cpu")
    sources, refs = ["a dog", "the old man sees a small "
                     "dog."], ["ein Hund", "der alte Mann sieht einen kleinen Hund."]
    result = evaluate_texts(t, sources, refs, t.decode)
    hyps = [n[0].text for n in translate_nbest(t.model, t.tok, sources, t.decode)]
    assert result == {**score(hyps, refs), "decode": {"beam_size": t.decode.beam_size,
                                                      "alpha": t.decode.alpha}}
