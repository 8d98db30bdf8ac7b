"""Typed, frozen experiment configs: YAML -> dotted overrides -> validated dataclasses.

Defaults live here; a YAML file only overrides them. Every key a user can write is a
field below, and every field is checked for its type and range when the config is built.
"""

from __future__ import annotations

import os
import re
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and what is allowed."""


@dataclass(frozen=True)
class SplitsConfig:
    train: str = "train"
    valid: str = "valid"
    test: str = "test"


@dataclass(frozen=True)
class DataConfig:
    source: Literal["files", "jsonl", "hf", "toy"] = "toy"
    dir: str = ""  # files: {dir}/{split}.{lang}; jsonl: {dir}/{split}.jsonl; hf: local dataset dir
    name: str = ""  # hf: hub name (used when dir is empty)
    hf_config: str = ""  # hf: dataset config name, e.g. "de-en"
    src_lang: str = "de"
    tgt_lang: str = "en"
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    max_len: int = 100  # training pairs with more tokens on either side are dropped
    toy_size: int = 12000  # toy: number of training pairs
    toy_seed: int = 0

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ConfigError(f"data.max_len={self.max_len}: must be >= 1")
        if self.source in ("files", "jsonl") and not self.dir:
            raise ConfigError(f"data.dir: required when data.source={self.source}")
        if self.source == "hf" and not (self.dir or self.name):
            raise ConfigError("data.name or data.dir: one is required when data.source=hf")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
        if self.toy_size < 10:
            raise ConfigError(f"data.toy_size={self.toy_size}: must be >= 10")


@dataclass(frozen=True)
class TokenizerConfig:
    type: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages (allows full embedding tying)
    character_coverage: float = 1.0

    def __post_init__(self) -> None:
        if self.vocab_size < 16:
            raise ConfigError(f"tokenizer.vocab_size={self.vocab_size}: must be >= 16")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise ConfigError("tokenizer.character_coverage must be in [0.9, 1.0]")


@dataclass(frozen=True)
class TransformerConfig:
    kind: Literal["transformer"] = "transformer"
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 3  # encoder and decoder layers each
    d_ff: int = 1024
    dropout: float = 0.1
    norm_first: bool = True  # pre-norm (True) or post-norm as in the original paper
    tie_embeddings: bool = True
    max_positions: int = 256
    attention: Literal["sdpa", "reference"] = "sdpa"

    def __post_init__(self) -> None:
        for key in ("d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: must be in [0, 1)")


@dataclass(frozen=True)
class RNNConfig:
    """Encoder-decoder RNN with additive attention (Bahdanau et al. 2015), the baseline of compare-rnn."""

    kind: Literal["rnn"] = "rnn"
    d_embed: int = 256  # embeddings, and the pre-output layer (so the output can be tied)
    d_hidden: int = 256  # encoder state per direction, and the decoder state
    d_attn: int = 256  # hidden size of the additive attention
    cell: Literal["gru", "lstm"] = "gru"  # encoder cell; the decoder is a GRU
    n_layers: int = 1  # encoder and decoder layers each
    dropout: float = 0.1
    tie_embeddings: bool = True
    max_positions: int = 256  # longest source / output in tokens (the RNN itself has no limit)

    def __post_init__(self) -> None:
        for key in ("d_embed", "d_hidden", "d_attn", "n_layers", "max_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: must be in [0, 1)")


ModelConfig = TransformerConfig | RNNConfig
MODEL_KINDS: dict[str, type] = {"transformer": TransformerConfig, "rnn": RNNConfig}


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 1000
    schedule: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"  # after warmup: lr * sqrt(warmup / step),
    #     or linear decay to 0 at the end of the budget (max_steps, max_minutes or max_epochs, the first to end)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    label_smoothing: float = 0.1
    batch_tokens: int = 4096  # target tokens per optimizer step (before accumulation)
    accum_steps: int = 1
    clip_norm: float = 1.0  # 0 disables clipping
    max_epochs: int = 20
    max_steps: int = 0  # 0: no limit
    max_minutes: float = 0.0  # wall-clock budget; 0: no limit
    seed: int = 1
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    eval_every: int = 0  # steps between evaluations; 0: once per epoch
    bleu_sentences: int = 500  # validation sentences decoded for BLEU at each evaluation
    patience: int = 0  # stop after this many evaluations without a better BLEU; 0: off
    checkpoint_every: int = 0  # also save checkpoint_last.pt every N steps; 0: only at evals
    keep_last: int = 0  # keep the weights of the last N evaluations (checkpoint_step*.pt); N >= 2 also
    #                     averages them at the end and tests the average if it wins on valid
    max_bad_steps: int = 5  # non-finite losses are skipped; this many in a row stop the run
    log_every: int = 20  # steps between progress-bar updates (each one syncs the device)
    threads: int = 0  # torch intra-op threads on CPU; 0: torch's default
    compile: bool = False  # torch.compile the training forward/backward (`attn-mt bench --compile`
    #                        measures whether it pays: on the 2-core CPU it did not, README Performance)

    def __post_init__(self) -> None:
        positive = ("lr", "batch_tokens", "accum_steps", "max_epochs", "bleu_sentences")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key}={getattr(self, key)}: must be > 0")
        nonneg = ("warmup_steps", "weight_decay", "clip_norm", "max_steps", "max_minutes",
                  "eval_every", "patience", "checkpoint_every", "keep_last", "threads")
        for key in nonneg:
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}={getattr(self, key)}: must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing}: must be in [0, 1)")
        if self.log_every < 1:
            raise ConfigError(f"train.log_every={self.log_every}: must be >= 1")
        if self.max_bad_steps < 1:
            raise ConfigError(f"train.max_bad_steps={self.max_bad_steps}: must be >= 1")


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 1  # 1: greedy
    alpha: float = 0.6  # GNMT length penalty exponent
    nbest: int = 1
    max_len_a: float = 1.5  # maximum output length = a * source length + b
    max_len_b: int = 10
    batch_size: int = 64

    def __post_init__(self) -> None:
        for key in ("beam_size", "nbest", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"decode.{key}={getattr(self, key)}: must be >= 1")
        if self.nbest > self.beam_size:
            raise ConfigError(f"decode.nbest={self.nbest} exceeds decode.beam_size={self.beam_size}")
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ConfigError("decode.max_len_a must be >= 0 and decode.max_len_b >= 1")


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=TransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


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
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")


def from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """Build and validate a config from a nested dict (e.g. the one stored in a checkpoint)."""
    return _build(ExperimentConfig, raw, "")


def load_config(path: Path | str | None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read YAML (safe loader), apply `section.key=value` overrides, build and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            data = path.read_bytes()
            text = data.decode("utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise ConfigError(f"{path}: line {line}: invalid UTF-8 (byte {data[e.start]:#04x})") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
        raw.setdefault("name", path.stem)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        try:
            node[parts[-1]] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            node[parts[-1]] = value
    try:
        return from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path is not None else str(e)) from None


_ENV = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def _expand_env(value: str) -> str:
    """`${VAR}` and `${VAR:-default}` in string values, so configs can point at local data."""
    return _ENV.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {raw!r}")
    if cls is ExperimentConfig and isinstance(raw.get("model"), dict):
        kind = raw["model"].get("kind", "transformer")
        if kind not in MODEL_KINDS:
            raise ConfigError(f"model.kind={kind!r}: allowed: {', '.join(MODEL_KINDS)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in raw:
        if key not in names:
            where = f"{prefix}{key}"
            section = prefix.rstrip(".") or "top level"
            raise ConfigError(f"unknown key {where!r}; allowed in {section}: {', '.join(names)}")
    kwargs = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if f.name == "model" and cls is ExperimentConfig:
            tp = MODEL_KINDS[raw["model"].get("kind", "transformer")]
        kwargs[f.name] = _check(tp, raw[f.name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix.rstrip('.')}: {e}") from None


def _check(tp: Any, value: Any, key: str) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `key`."""
    if is_dataclass(tp):
        return _build(tp, value, key + ".")
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: allowed: {', '.join(map(str, allowed))}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key}={value!r}: expected a list of {len(args)} values")
        return tuple(_check(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "5e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return _expand_env(str(value))
    raise ConfigError(f"{key}={value!r}: expected {tp.__name__}, got {type(value).__name__}")
