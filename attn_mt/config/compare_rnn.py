"""compare-rnn's config: one experiment config per model from a file of shared and per-model sections."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attn_mt.config import CompareConfig, ConfigError, ExperimentConfig, from_dict
from attn_mt.config.yamlconf import build, read_yaml, set_overrides

MODELS = ("transformer", "rnn")
PER_MODEL_TRAIN_KEYS = {"lr", "warmup_steps", "weight_decay", "betas", "clip_norm"}  # batches stay shared


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

    `--quick` merges the `quick` section over the rest; then `section.key=value` overrides apply.
    """
    raw = read_yaml(Path(path))
    quick_raw = raw.pop("quick", {}) or {}
    raw = set_overrides(_merge(raw, quick_raw) if quick else raw, overrides)
    cmp = build(CompareConfig, raw.pop("compare", {}) or {}, "compare.")
    name = raw.pop("name", Path(path).stem)
    configs, own_sections = {}, {kind: raw.pop(kind, None) for kind in MODELS}
    for kind, own in own_sections.items():
        if not isinstance(own, dict) or not isinstance(own.get("model"), dict):
            raise ConfigError(f"{path}: needs a `{kind}:` section with a `model:` mapping")
        extra = set(own) - {"model", "train"} | set(own.get("train", {})) - PER_MODEL_TRAIN_KEYS
        if extra:
            raise ConfigError(f"{kind}: only model and train.{{{', '.join(sorted(PER_MODEL_TRAIN_KEYS))}}} "
                              f"may differ between the models, not {', '.join(sorted(extra))}")
        if own["model"].get("kind", kind) != kind:
            raise ConfigError(f"{kind}.model.kind must be {kind!r}")
        try:
            configs[kind] = from_dict(_merge({**raw, "name": f"{name}-{kind}", "model": {"kind": kind}}, own))
        except ConfigError as e:
            raise ConfigError(f"{kind} (with the shared sections): {e}") from None
    return CompareSetup(configs, cmp)
