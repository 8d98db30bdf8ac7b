"""The experiment config as a whole: its sections, and reading and writing it (YAML -> dotted
overrides -> validated dataclasses, tuples back to lists).

Defaults live in each section's module (data.py, tokenizer.py, model.py, train.py, decode.py); a
YAML file only overrides them. Every key a user can write is a field there, checked for its type and
range when the config is built (yamlconf.py reads YAML and builds dataclasses; files.py writes
files).


Tested in tests/config/test_config.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attn_mt.config.data import DataConfig
from attn_mt.config.decode import DecodeConfig
from attn_mt.config.marian import MarianConfig, upgrade
from attn_mt.config.model import ModelConfig, TransformerConfig
from attn_mt.config.tokenizer import TokenizerConfig
from attn_mt.config.train import TrainConfig
from attn_mt.config.yamlconf import ConfigError, build, read_yaml, set_overrides
from attn_mt.files import write_atomic


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig | MarianConfig = field(default_factory=TransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        """Checks that need two sections (each section checks its own fields)."""
        widths, most = self.train.length_buckets, self.model.max_positions
        if widths and widths[-1] > most:
            raise ConfigError(f"train.length_buckets={list(widths)}: widths above "
                              f"model.max_positions={most} hold no sequence the model takes",
                              "train.length_buckets")


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Plain nested dict (tuples as lists): what goes into config.yaml and checkpoints."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return plain(asdict(cfg))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """Build and validate a config from a nested dict (e.g. the one stored in a checkpoint)."""
    return build(ExperimentConfig, upgrade(raw), "")


def load_config(path: Path | str | None,
                overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read YAML (safe loader), apply `section.key=value` overrides, build and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_yaml(Path(path))
        raw.setdefault("name", Path(path).stem)
    set_overrides(raw, overrides)
    try:
        return from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path is not None else str(e), e.field) from None
