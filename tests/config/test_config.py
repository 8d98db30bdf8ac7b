import dataclasses

import pytest
import yaml
from conftest import cli, one_line_error, write_config

from attn_mt.config import (
    ConfigError,
    ExperimentConfig,
    from_dict,
    load_config,
    save_config,
    to_dict,
)


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_and_yaml_override(tmp_path):
    cfg = load_config(write(tmp_path, "model: {d_model: 64, n_heads: 8}\ntrain: {lr: 5e-4}\n"))
    assert cfg.model.d_model == 64 and cfg.model.n_heads == 8
    assert cfg.train.lr == 5e-4 and isinstance(cfg.train.lr, float)
    assert cfg.model.d_ff == ExperimentConfig().model.d_ff  # untouched keys keep code defaults
    assert cfg.name == "c"


def test_set_overrides_are_typed(tmp_path):
    cfg = load_config(write(tmp_path, "{}"), ["train.lr=5e-4", "model.n_layers=4",
                                              "data.splits.test=test2017", "model.norm_first=false",
                                              "model.attention_dropout=0"])
    assert cfg.model.attention_dropout == 0.0 and cfg.model.activation_dropout is None
    assert cfg.train.lr == 5e-4 and cfg.model.n_layers == 4 and cfg.data.splits.test == "test2017"
    assert cfg.model.norm_first is False


@pytest.mark.parametrize("overrides, words", [
    (["model.n_layer=4"], ["model.n_layer", "n_layers"]),
    (["train.lr=fast"], ["train.lr", "float"]),
    (["model.n_layers=2.5"], ["model.n_layers", "int"]),
    (["model.d_model=100", "model.n_heads=3"], ["d_model=100", "n_heads=3"]),
    (["train.device=tpu"], ["train.device", "cuda"]),
    (["data.source=csv"], ["data.source", "jsonl"]),
    (["model.kind=lstm"], ["model.kind", "transformer"]),
    (["train.batch_tokens=0"], ["train.batch_tokens"]),
    (["decode.nbest=3", "decode.beam_size=2"], ["decode.nbest"]),
    (["data.source=files"], ["data.dir"]),
    (["bogus=1"], ["bogus", "allowed"]),
    (["model.attention_dropout=1.0"], ["model.attention_dropout", "[0, 1)"]),
    (["train.subword_sampling=1.0"], ["train.subword_sampling", "[0, 1)"]),
    (["model.positions=absolute"], ["model.positions", "learned"]),
    (["model.activation_dropout=-0.1"], ["model.activation_dropout"]),
])
def test_bad_values_name_the_key(overrides, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    message = str(e.value)
    assert "\n" not in message
    # the key, as the check that failed knows it
    assert e.value.field in (overrides[0].split("=")[0], words[0])
    for word in words:
        assert word in message


def test_yaml_syntax_error_gives_line(tmp_path):
    path = write(tmp_path, "train:\n  lr: 1e-3\n  batch_tokens: [1, 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line \d+"):
        load_config(path)


def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_frozen_and_round_trip(tmp_path):
    cfg = load_config(None, ["model.d_model=64", "train.betas=[0.9, 0.99]"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.d_model = 32
    save_config(cfg, tmp_path / "config.yaml")
    again = from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert again == cfg and to_dict(again) == to_dict(cfg)


def test_env_expansion(tmp_path, monkeypatch):
    path = write(tmp_path, "data: {source: files, dir: '${M30K_TEST:-data/m30k}'}\n")
    assert load_config(path).data.dir == "data/m30k"
    monkeypatch.setenv("M30K_TEST", "/somewhere")
    assert load_config(path).data.dir == "/somewhere"


@pytest.mark.parametrize("name", ["toy.yaml", "multi30k.yaml", "multi30k_en_de.yaml",
                                  "multi30k_rnn.yaml", "multi30k_gpu.yaml"])
def test_shipped_configs_load(name):
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / name, [])
    assert cfg.data.src_lang != cfg.data.tgt_lang
    if name.startswith("multi30k"):
        assert cfg.decode.beam_size > 1 and cfg.data.dir.endswith("multi30k")


@pytest.mark.parametrize("override,text", [
    ("train.lr=nan", "train.lr=nan: must be a finite number"),
    ("decode.max_len_a=nan", "decode.max_len_a=nan: must be a finite number"),
    ("train.lr=inf", "must be a finite number"),
    ("model.d_model=1000000000", "model.d_model=1000000000: must be at most"),
    ("train.batch_tokens=1000000000000", "train.batch_tokens=1000000000000: must be at most"),
    ("train.seed=-3", "train.seed=-3: must be >= 0"),
])
def test_impossible_numbers_fail_before_any_data_is_read(override, text, tmp_path):
    result = cli("train", "-c", write_config(tmp_path / "c.yaml"), "--out", tmp_path / "run",
                 "--set", override)
    one_line_error(result, 2, text)
    assert not (tmp_path / "run").exists()


def test_config_reader_is_safe(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {tmp_path}/PWNED']\n")
    with pytest.raises(ValueError, match="line 1"):
        load_config(path)
    assert not (tmp_path / "PWNED").exists()
