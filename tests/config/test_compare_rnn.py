"""compare-rnn's config: shared and per-model sections become two experiment configs that differ only
in the model and its optimizer settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from attn_mt.config import ConfigError
from attn_mt.config.compare_rnn import load_compare_config
from attn_mt.models import build_model, count_params

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "compare.yaml"


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
