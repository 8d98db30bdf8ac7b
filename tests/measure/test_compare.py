"""compare-rnn: config loading and a small end-to-end run through the CLI that writes a valid report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.config import ConfigError
from attn_mt.config.compare import load_compare_config
from attn_mt.models import build_model, count_params

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "compare.yaml"

# --quick, made smaller still: 300 toy pairs, tiny models, 4 s of training each
SMALL = [
    "data.toy_size=300", "tokenizer.vocab_size=120", "train.bleu_sentences=20", "train.device=cpu",
    "train.precision=fp32", "train.threads=1",  # one thread: tiny ops, and robust to a busy machine
    "transformer.model.d_model=32", "transformer.model.d_ff=64", "transformer.model.n_heads=2",
    "rnn.model.d_embed=32", "rnn.model.d_hidden=40", "rnn.model.d_attn=32",
    "compare.budget_minutes=0.07", "compare.eval_every_minutes=0.03", "compare.lengths=[8,32]",
    "compare.length_batch_tokens=256", "compare.repeats=2", "compare.decode_sentences=16",
    "compare.decode_repeats=1", "compare.beam_size=2", "decode.beam_size=2", "decode.max_len_b=4",
]


@pytest.mark.parametrize("quick,vocab", [(False, 8000), (True, 400)])
def test_shipped_configs_have_comparable_sizes(quick, vocab):
    setup = load_compare_config(CONFIG, quick=quick)
    params = [count_params(build_model(c.model, src_vocab=vocab, tgt_vocab=vocab, pad_id=0,
                                       shared_vocab=True)) for c in setup.configs.values()]
    assert [c.model.kind for c in setup.configs.values()] == ["transformer", "rnn"]
    assert (max(params) - min(params)) / max(params) <= 0.15
    a, b = setup.configs.values()
    assert a.data == b.data and a.tokenizer == b.tokenizer and a.decode == b.decode
    assert a.train.batch_tokens == b.train.batch_tokens and a.train.seed == b.train.seed


def test_config_errors():
    with pytest.raises(ConfigError, match="only model and train"):
        load_compare_config(CONFIG, ["rnn.train.batch_tokens=100"])
    with pytest.raises(ConfigError, match="compare.repeats"):
        load_compare_config(CONFIG, ["compare.repeats=0"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_compare_config(CONFIG, ["compare.budget=3"])
    with pytest.raises(ConfigError, match="must be 'rnn'"):
        load_compare_config(CONFIG, ["rnn.model.kind=transformer"])


def test_refuses_unequal_sizes(tmp_path):
    result = CliRunner().invoke(app, ["compare-rnn", "--config", str(CONFIG), "--quick", "--out",
                                      str(tmp_path), *sum((["--set", o] for o in SMALL), []),
                                      "--set", "rnn.model.d_hidden=200"])
    assert result.exit_code == 2 and "parameter counts differ" in result.output


def test_compare_rnn_writes_a_valid_report(tmp_path):
    args = ["compare-rnn", "--config", str(CONFIG), "--quick", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, *sum((["--set", o] for o in SMALL), [])])
    assert result.exit_code == 0, result.output
    assert "train tokens/s" in result.output and "Background load" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["machine"]["torch"] and report["machine"]["threads"] >= 1
    assert set(report["background_load"]) == {"training", "length_scaling", "decoding"}
    for name in ("transformer", "rnn"):
        m = report["models"][name]
        assert m["params"] > 0 and m["train_tokens_per_s"] > 0 and m["decode_sentences_per_s"] > 0
        assert m["beam_sentences_per_s"] > 0 and m["peak_memory_mb"] > 0
        assert 0 <= m["test_bleu"] <= 100
        assert m["curve"] and all({"elapsed_s", "valid_bleu"} <= p.keys() for p in m["curve"])
        times = [p["elapsed_s"] for p in m["curve"]]
        assert times == sorted(times) and times[-1] >= 0.07 * 60
    assert [r["length"] for r in report["length_scaling"]] == [8, 32]
    for row in report["length_scaling"]:
        assert row["transformer_ms"] > 0 and row["rnn_ms"] > 0
        assert row["rnn_sequential_steps"] == row["length"] and row["transformer_sequential_steps"] == 1
    for name in ("report.md", "bleu_vs_time.png", "time_vs_length.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert "| length n |" in (tmp_path / "report.md").read_text()
    translated = CliRunner().invoke(app, ["translate", "--checkpoint", str(tmp_path / "rnn.pt"),
                                          "--device", "cpu", "the dog sees a cat."])
    assert translated.exit_code == 0, translated.output
