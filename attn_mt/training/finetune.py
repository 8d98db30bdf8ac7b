"""Fine-tuning: a run that starts from another model's weights (`train.init_from`: a checkpoint of
ours, or a MarianMT model the API has read as a checkpoint state), with its tokenizer and shape, a
fresh optimizer and schedule, on the config's data; and the parts of a model that `train.freeze`
keeps as they are.

    >>> cfg = adopt(cfg, init)            # the model and tokenizer sections of the model it starts
                                          from
    >>> start_from(model, init); freeze(model, cfg.train.freeze)
"""

from __future__ import annotations

import logging
from dataclasses import fields, replace

from torch import nn

from attn_mt.checkpoint import CheckpointError, check_weights, tokenizer_from_state
from attn_mt.config import ConfigError, ExperimentConfig, TransformerConfig, from_dict
from attn_mt.config.yamlconf import show
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import TrainError

log = logging.getLogger(__name__)
# the config's, not the model's
KEEP = ("dropout", "attention_dropout", "activation_dropout", "attention")


def adopt(cfg: ExperimentConfig, init: dict) -> ExperimentConfig:
    """`cfg` with the model and tokenizer sections of the model in `init` (its shape, its
    vocabulary); the dropouts and attention implementation stay the config's."""
    try:
        theirs = from_dict(init["config"])
    except (ConfigError, KeyError) as e:
        raise TrainError(f"{cfg.train.init_from}: its config is not valid for this attn-mt: {e}",
                         "init_from") from None
    conflicts = [*_conflicts("model", cfg.model, theirs.model, KEEP),
                 *_conflicts("tokenizer", cfg.tokenizer,
                             theirs.tokenizer)]
    if conflicts:
        raise TrainError(f"{cfg.train.init_from}: a fine-tuned run takes this model's shape and "
                         "tokenizer, and the config sets them otherwise: "
                         f"{', '.join(conflicts[:6])}; leave these keys out (or set them as the "
                         "model has them)", "init_from")
    model = theirs.model
    if isinstance(model, TransformerConfig) and isinstance(cfg.model, TransformerConfig):
        model = replace(model, **{k: getattr(cfg.model, k) for k in KEEP}, size="fixed")
    return replace(cfg, model=model, tokenizer=theirs.tokenizer)


def _conflicts(section: str, ours: object, theirs: object, keep: tuple[str, ...] = ()) -> list[str]:
    """`section.key=value (the model's: value)` for each key the config sets (away from its default)
    to another value than the model's own; `keep` and model.size are the config's to set."""
    default = type(ours)()
    return [f"{section}.{f.name}={show(getattr(ours, f.name))} (the model's: "
            f"{show(getattr(theirs, f.name, None))})" for f in fields(ours)
            if f.name not in (*keep, "size") and getattr(ours, f.name) != getattr(default, f.name)
            and getattr(ours, f.name) != getattr(theirs, f.name, None)]


def init_tokenizer(cfg: ExperimentConfig, init: dict) -> Tokenizer:
    """The tokenizer of the model a run starts from (the data is tokenized with it)."""
    try:
        return tokenizer_from_state(init.get("tokenizer"))
    except CheckpointError as e:
        raise TrainError(f"{cfg.train.init_from}: {e}", "init_from") from None


def start_from(model: nn.Module, init: dict, where: str) -> None:
    """Load the weights of `init` into `model` (built from the adopted config: the shapes fit)."""
    try:
        model.load_state_dict(check_weights(init["model"], model.state_dict()))
    except CheckpointError as e:
        raise TrainError(f"{where}: {e}", "init_from") from None
    log.info("fine-tuning from %s (its step %s)", where, init.get("step", 0))


def freeze(model: nn.Module, parts: tuple[str, ...]) -> int:
    """Stop training `parts` ("embeddings": the embedding tables and an output layer tied to them;
    "encoder": the encoder layers); returns how many parameters are left to train."""
    for part in parts:
        modules = [model.src_embed, model.tgt_embed] if part == "embeddings" else [model.encoder]
        for module in modules:
            module.requires_grad_(False)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if parts:
        log.info("frozen: %s; %.2fM parameters trained", ", ".join(parts), trained / 1e6)
    return trained
