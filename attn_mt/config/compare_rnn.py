"""compare-rnn's config: its `compare:` section, and one experiment config per model from a file of
shared and per-model sections."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attn_mt.config.loader import ExperimentConfig, from_dict
from attn_mt.config.yamlconf import ConfigError, build, check_limits, read_yaml, set_overrides

MODELS = ("transformer", "rnn")
CLOCKS = ("wall", "cpu", "auto")  # compare.clock
# batches stay shared
PER_MODEL_TRAIN_KEYS = {"lr", "warmup_steps", "weight_decay", "betas", "clip_norm",
                        # each model may use what the other may (docs/compare-rnn.md)
                        "compile", "cuda_graphs"}


# upper bounds far above any sensible value (lower bounds: __post_init__)
MOST = {"budget_minutes": 1e6, "eval_every_minutes": 1e6, "lengths": 1_000_000,
        "length_batch_tokens": 10_000_000, "repeats": 10_000, "decode_sentences": 10_000_000,
        "decode_repeats": 10_000, "beam_size": 1000}


@dataclass(frozen=True)
class CompareConfig:
    """The `compare:` section of compare-rnn's config: budget and what is measured after
    training."""

    budget_minutes: float = 10.0  # training time per model, on its own clock
    # what the budget and the timings count: "wall" seconds, or "cpu" seconds of this process per
    # torch thread (other processes do not starve it; CPU devices only), or "auto": cpu on a CPU,
    # wall on a GPU
    clock: str = "wall"
    eval_every_minutes: float = 1.0  # one validation-BLEU point per this much training time
    lengths: tuple[int, ...] = (8, 16, 32, 64, 128, 256)  # length-scaling benchmark
    length_batch_tokens: int = 4096  # tokens per batch there: batch size = tokens // length
    repeats: int = 5  # timed rounds per length (median reported)
    decode_sentences: int = 500  # test sentences decoded in the speed measurement
    decode_repeats: int = 3
    beam_size: int = 4  # beam of the decoding-speed measurement
    max_param_gap: float = 0.15  # refuse models whose parameter counts differ by more (fairness)

    def __post_init__(self) -> None:
        check_limits("compare", self, MOST)
        for key in ("budget_minutes", "eval_every_minutes", "length_batch_tokens", "repeats",
                    "decode_sentences", "decode_repeats", "beam_size", "max_param_gap"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"compare.{key}={getattr(self, key)!r}: must be a number > 0",
                                  f"compare.{key}")
        if self.clock not in CLOCKS:
            raise ConfigError(f"compare.clock={self.clock!r}: must be one of {', '.join(CLOCKS)}",
                              "compare.clock")
        if not self.lengths or not all(n > 0 for n in self.lengths):
            raise ConfigError(f"compare.lengths={list(self.lengths)}: must be positive integers",
                              "compare.lengths")


@dataclass(frozen=True)
class CompareSetup:
    """One experiment config per model (they differ only in model and optimizer settings)."""

    configs: dict[str, ExperimentConfig]
    compare: CompareConfig


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_compare_config(path: Path, overrides: list[str] = (), quick: bool = False) -> CompareSetup:
    """compare.yaml: shared sections, a `transformer` and an `rnn` section, `compare`, and `quick`.

    `quick=True` merges the `quick` section over the rest; then `section.key=value` overrides apply.
    """
    raw = read_yaml(Path(path))
    quick_raw = raw.pop("quick", {}) or {}
    raw = set_overrides(_merge(raw, quick_raw) if quick else raw, overrides)
    cmp = build(CompareConfig, raw.pop("compare", {}) or {}, "compare.")
    name = raw.pop("name", Path(path).stem)
    configs, own_sections = {}, {kind: raw.pop(kind, None) for kind in MODELS}
    for kind, own in own_sections.items():
        if not isinstance(own, dict) or not isinstance(own.get("model"), dict):
            raise ConfigError(f"{path}: needs a `{kind}:` section with a `model:` mapping", kind)
        extra = set(own) - {"model", "train"} | set(own.get("train", {})) - PER_MODEL_TRAIN_KEYS
        if extra:
            raise ConfigError(f"{kind}: only model and "
                              f"train.{{{', '.join(sorted(PER_MODEL_TRAIN_KEYS))}}} may differ "
                              f"between the models, not {', '.join(sorted(extra))}", kind)
        if own["model"].get("kind", kind) != kind:
            raise ConfigError(f"{kind}.model.kind must be {kind!r}", f"{kind}.model.kind")
        try:
            configs[kind] = from_dict(_merge({**raw, "name": f"{name}-{kind}",
                                              "model": {"kind": kind}}, own))
        except ConfigError as e:
            raise ConfigError(f"{kind} (with the shared sections): {e}", e.field) from None
    return CompareSetup(configs, cmp)
