"""What `--resume` must match and what it restores: the config (only budget, reporting and decoding
may change), model, optimizer, gradient scaler and RNG state, and whether the run had finished."""

from __future__ import annotations

import logging
from dataclasses import fields

import torch

from attn_mt.config import ConfigError, ExperimentConfig, TrainConfig, from_dict, to_dict
from attn_mt.config.yamlconf import show
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.device import set_rng_state
from attn_mt.training import distributed
from attn_mt.training.schedule import limit_reached
from attn_mt.training.trainer import Trainer, TrainError, TrainState

log = logging.getLogger(__name__)


def finished(st: TrainState, tc: TrainConfig) -> str | None:
    """Why a run that stopped itself (not a Ctrl-C or kill) is still finished under `tc`, or None.

    Budget keys may grow on --resume: a run stopped at max_steps=100 goes on when resumed with 200.
    """
    if not st.stopped:
        return None
    if st.epoch >= tc.max_epochs:
        return f"reached train.max_epochs={tc.max_epochs}"
    if tc.patience and st.bad_evals >= tc.patience:
        return f"no BLEU improvement in {tc.patience} evaluations"
    return limit_reached(tc, st.step, st.elapsed_s)


# settings --resume may change: the budget, how often to report and save, where the data lives, and
# decoding; any other change would alter the data order or the optimisation of the run
RESUMABLE = {"name", "data.dir", "data.name", "train.max_steps", "train.max_minutes", "train.max_epochs",
             "train.patience", "train.eval_every", "train.bleu_sentences", "train.checkpoint_every",
             "train.keep_last", "train.max_bad_steps", "train.log_every", "train.threads", "train.device",
             "train.compile", "train.tensorboard"}


def check_config(saved: dict, cfg: ExperimentConfig) -> None:
    """Refuse to resume with settings that change the data order or the optimisation, naming the keys;
    called before any data is read."""
    try:
        before = _flat(to_dict(from_dict(saved)))
    except ConfigError as e:
        raise TrainError(f"--resume: the checkpoint's config is not valid for this attn-mt: {e}") from None
    now = _flat(to_dict(cfg))
    changed = [k for k in sorted(set(before) | set(now))
               if before.get(k) != now.get(k) and k not in RESUMABLE and not k.startswith("decode.")]
    if changed:
        what = "; ".join(f"{k} is {show(now.get(k))}, the checkpoint was trained with {show(before.get(k))}"
                         for k in changed[:5])
        raise TrainError(f"--resume: {what} (it would change the data order or the optimisation; "
                         "start a new run with --overwrite or another --out)")


def check_tokenizer(tokenizer: dict, tok: Tokenizer) -> None:
    if tokenizer != tok.state():
        raise TrainError("--resume: the tokenizer differs from the checkpoint's (the data or tokenizer "
                         "settings changed); start a new run instead")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def restore(resumed: dict, trainer: Trainer, tok: Tokenizer, cfg: ExperimentConfig,
            world: distributed.World) -> TrainState:
    """Load a checkpoint_last.pt dict into model, optimizer, scaler and RNG; returns where the run stood."""
    check_config(resumed["config"], cfg)
    check_tokenizer(resumed["tokenizer"], tok)
    trainer.model.load_state_dict(resumed["model"])
    trainer.opt.load_state_dict(resumed["optimizer"])
    if resumed.get("scaler") and trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(resumed["scaler"])
    st = TrainState(**{f.name: resumed[f.name] for f in fields(TrainState) if f.name in resumed})
    set_rng_state(resumed["rng"], trainer.device)
    ranks = resumed.get("rng_ranks") or []
    if len(ranks) == world.size:
        set_rng_state(ranks[world.rank], trainer.device)
    elif world.size != max(len(ranks), 1):  # a different torchrun world: each rank needs a stream of its own
        log.warning("resumed with %d processes, the checkpoint was written by %d: each rank's random numbers "
                    "are reseeded from (seed, rank, step), so the run is no longer bit-exact", world.size,
                    max(len(ranks), 1))
        torch.manual_seed((cfg.train.seed * 1_000_003 + world.rank * 10_007 + st.step) % 2**63)
    return st
