"""compare-rnn's config: shared and per-model sections become two experiment configs that differ
only in the model and its optimizer settings."""

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
    with pytest.raises(ConfigError, match="compare.clock='process': must be one of wall, cpu, "
                       "auto"):
        load_compare_config(CONFIG, ["compare.clock=process"])


def test_quick_counts_cpu_time_of_one_thread_and_the_full_run_wall_time():
    """The quick mode's budgets are CPU seconds of one thread (a busy machine does not starve them);
    the full run keeps the wall clock and torch's threads."""
    quick, full = load_compare_config(CONFIG, quick=True), load_compare_config(CONFIG)
    assert quick.compare.clock == "auto" and all(c.train.threads == 1
                                                 for c in quick.configs.values())
    assert full.compare.clock == "wall" and all(c.train.threads == 0 for c in full.configs.values())


def test_each_model_may_be_compiled_on_its_own():
    """What one model may use the other may too: compile (and CUDA graphs) per model, the batches
    still shared."""
    setup = load_compare_config(CONFIG, ["rnn.train.compile=true", "rnn.train.cuda_graphs=true",
                                         "train.length_buckets=[16,32,64,101]"])
    rnn, transformer = setup.configs["rnn"].train, setup.configs["transformer"].train
    assert (rnn.compile and rnn.cuda_graphs and not transformer.compile
            and not transformer.cuda_graphs)
    assert rnn.length_buckets == transformer.length_buckets == (16, 32, 64, 101)
    with pytest.raises(ConfigError, match="only model and train"):
        load_compare_config(CONFIG, ["rnn.train.length_buckets=[16,32]"])  # shapes stay shared

