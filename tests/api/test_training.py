"""attn_mt.train, configure and Run: a config of any form into a finished run, with visible
progress."""

from __future__ import annotations

import copy
import logging

import pytest
import yaml
from conftest import TINY

import attn_mt


def _raw(*overrides: str) -> dict:
    raw: dict = {}
    for item in [*TINY, *overrides]:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    return raw


def test_configure_takes_a_dict_an_object_or_a_file_with_overrides(tmp_path):
    from_dict = attn_mt.configure(_raw(), ["model.n_layers=2"])
    assert from_dict.model.n_layers == 2 and from_dict.model.d_model == 32
    assert attn_mt.configure(from_dict, ["train.lr=1e-3"]).train.lr == 1e-3
    assert attn_mt.configure(from_dict) == from_dict
    with pytest.raises(attn_mt.InputError) as e:
        attn_mt.configure(_raw(), "model.n_layers=2")
    assert e.value.field == "overrides"
    with pytest.raises(attn_mt.ConfigError, match="not found"):
        attn_mt.configure(tmp_path / "missing.yaml")


def test_configure_never_changes_the_callers_dict():
    """Overrides of a key within a section's section (data.splits.test) changed the caller's dict:
    the copy was one level deep."""
    raw = _raw()
    raw["data"]["splits"] = {"test": "test"}
    raw["train"]["freeze"] = ["encoder"]
    before = copy.deepcopy(raw)
    cfg = attn_mt.configure(raw, ["data.splits.test=valid", "train.freeze=[embeddings]",
                                  "train.lr=1e-2"])
    assert (cfg.data.splits.test == "valid" and cfg.train.freeze == ("embeddings",)
            and cfg.train.lr == 1e-2)
    assert raw == before


@pytest.mark.slow
def test_train_returns_the_finished_run_and_shows_its_progress(tmp_path, capfd):
    root = logging.getLogger()
    handlers, root.handlers[:] = root.handlers[:], []  # as in a notebook: nobody set up logging
    try:
        run = attn_mt.train(_raw("train.max_epochs=1", "train.bleu_sentences=5"), tmp_path / "run")
    finally:
        root.handlers[:] = handlers
    err = capfd.readouterr().err
    assert "valid BLEU" in err  # the validation line reaches the notebook's stderr
    assert not logging.getLogger("attn_mt").handlers  # and the handler is gone again
    assert run.dir == tmp_path / "run" and run.results["steps"] == run.metrics[-1]["step"] > 0
    assert run.best.exists() and f"{run.results['test_bleu']:.2f}" in run.summary()
    model = run.load(device="cpu")
    assert isinstance(model.translate("a dog."), str)
    assert repr(run).startswith("<attn_mt.Run") and "test BLEU" in repr(run)
    again = attn_mt.Run(tmp_path / "run")
    assert again.results == run.results
    with pytest.raises(attn_mt.TrainError, match="holds an earlier run"):
        attn_mt.train(_raw("train.max_epochs=1"), tmp_path / "run")
