"""decoding/translator.py: a checkpoint opens as a Translator; non-finite weights refused, not translated."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.checkpoint import CheckpointError
from attn_mt.cli import app as cli
from attn_mt.decoding.search import translate_nbest
from attn_mt.decoding.translator import checkpoint_translator


def test_a_checkpoint_opens_and_translates_as_translate_nbest(tiny_run):
    path = tiny_run / "checkpoint_best.pt"
    t = checkpoint_translator(path, "cpu")
    model, cfg, tok = checkpoint.load_model(path)
    assert t.kind == "checkpoint" and t.decode == cfg.decode and t.state["step"] == checkpoint.load(path)["step"]
    texts = ["a dog", "", "the old man sees a small dog."]
    assert t.translate_nbest(texts, cfg.decode) == translate_nbest(model, tok, texts, cfg.decode)


def test_non_finite_weights_are_refused_in_one_line(tiny_run, tmp_path):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    name = next(k for k in state["model"] if k.startswith("encoder.") and k.endswith(".weight"))  # not tied
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    with pytest.raises(CheckpointError, match=f"not finite.*{name}"):
        checkpoint_translator(bad, "cpu")
    r = CliRunner().invoke(cli, ["translate", "--checkpoint", str(bad), "a dog"])
    assert r.exit_code == 1 and "not finite" in r.output and r.output.count("\n") == 1 and "Traceback" not in r.output
