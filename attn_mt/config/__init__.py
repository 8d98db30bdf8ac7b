"""Typed, frozen experiment configs, one module per section: data.py, tokenizer.py, model.py,
train.py, decode.py (with the table of decode options) and compare_rnn.py (compare-rnn's file);
loader.py puts them together and reads and writes them. Each section's module holds its dataclass,
defaults, upper bounds and checks.

This module only names them: `from attn_mt.config import TrainConfig`. May import nothing of attn_mt
(its errors and files aside: loader.py writes a config atomically).
"""

from attn_mt.config.data import DataConfig, SplitsConfig
from attn_mt.config.decode import (
    ARGS,
    DECODE_OPTIONS,
    FIELDS,
    OPTION,
    DecodeConfig,
    DecodeOption,
    Penalty,
)
from attn_mt.config.loader import ExperimentConfig, from_dict, load_config, save_config, to_dict
from attn_mt.config.model import ModelConfig, RNNConfig, TransformerConfig
from attn_mt.config.tokenizer import TokenizerConfig
from attn_mt.config.train import TrainConfig
from attn_mt.config.yamlconf import ConfigError

__all__ = ["ARGS", "DECODE_OPTIONS", "FIELDS", "OPTION", "CompareConfig", "ConfigError",
           "DataConfig", "DecodeConfig", "DecodeOption", "ExperimentConfig", "ModelConfig",
           "Penalty", "RNNConfig", "SplitsConfig", "TokenizerConfig", "TrainConfig",
           "TransformerConfig", "from_dict", "load_config", "save_config", "to_dict"]


def __getattr__(name: str) -> object:
    """compare-rnn's `CompareConfig`, loaded when first named: only that command reads
    compare_rnn.py."""
    if name == "CompareConfig":
        from attn_mt.config.compare_rnn import CompareConfig

        return CompareConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
