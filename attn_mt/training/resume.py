"""What resuming must match and what it restores: the config (only budget, reporting and decoding
may change), model, optimizer, gradient scaler and RNG state, and whether the run had finished.

The optimizer's moments are restored by parameter name, never by position: checkpoint format 2 saves
each group's `param_names` (torch's key) beside the positional state; format 1 saved none, so its
positions are named by the checkpoint's own weights (the optimizer was built from
`model.parameters()`, which follow the state_dict's order: that is how a run written before the
attention modules changed their registration order, `out_proj` after the input projections, is
restored correctly).
"""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from pathlib import Path

import torch
from torch import nn

from attn_mt.checkpoint import FORMAT_VERSION, CheckpointError, check_weights
from attn_mt.config import ConfigError, ExperimentConfig, TrainConfig, to_dict
from attn_mt.config.changes import config_changes
from attn_mt.config.yamlconf import show
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.device import set_rng_state
from attn_mt.errors import TrainError
from attn_mt.training.schedule import TrainState, limit_reached
from attn_mt.training.stops import Stop
from attn_mt.training.trainer import Trainer
from attn_mt.training.variants import World

log = logging.getLogger(__name__)


def finished(st: TrainState, tc: TrainConfig) -> str | None:
    """Why a run that stopped itself (not a Ctrl-C or kill) is still finished under `tc`, or None.

    Budget keys may grow on resuming: a run stopped at max_steps=100 goes on when resumed with 200.
    """
    if not st.stopped:
        return None
    if st.epoch >= tc.max_epochs:
        return Stop.max_epochs(tc)
    if tc.patience and st.bad_evals >= tc.patience:
        return Stop.patience(tc)
    return limit_reached(tc, st.step, st.elapsed_s, st.tokens)


def resumed_config(resumed: dict, path: Path, cfg: ExperimentConfig) -> ExperimentConfig:
    """The config a resumed run continues with, once `check_resumable` has found that the checkpoint
    can continue it: an automatic size keeps the shape and warmup it chose (autosize.CHOSEN, as the
    checkpoint's config has them); every other setting is the given config's."""
    saved = resumed.get("config", {})
    if getattr(cfg.model, "size", "fixed") == "auto":
        from attn_mt.training import autosize

        try:
            cfg = replace(cfg, **{part: replace(getattr(cfg, part),
                                                **{k: int(saved[part][k]) for k in keys})
                                  for part, keys in autosize.CHOSEN.items()})
        except (KeyError, TypeError, ValueError):
            pass  # the check names what differs
    check_resumable(resumed, path, cfg)
    return cfg


def check_resumable(resumed: dict, path: Path, cfg: ExperimentConfig) -> None:
    """Refuse, before any data is read, a checkpoint that cannot continue a run: weights only (as
    `attn-mt average` writes), or a config that changes the data order or the optimisation."""
    missing = [k for k in ("optimizer", "rng", "tokenizer", "step") if k not in resumed]
    if missing:
        raise TrainError(f"{path}: holds weights only (no {', '.join(missing)}; e.g. written by "
                         "attn-mt average): it translates and evaluates but cannot continue a run",
                         "resume")
    check_config(resumed["config"], cfg)


def check_config(saved: dict, cfg: ExperimentConfig) -> None:
    """Refuse to resume with settings that change the data order or the optimisation, naming the
    keys; called before any data is read."""
    try:
        changed = config_changes(saved, to_dict(cfg))
    except ConfigError as e:
        raise TrainError(f"the checkpoint's config is not valid for this attn-mt: {e}",
                         "resume") from None
    if changed:
        what = "; ".join(f"{k} is {show(now)}, the checkpoint was trained with {show(before)}"
                         for k, before, now in changed[:5])
        raise TrainError(f"{what} (it would change the data order or the optimisation; "
                         "start a new run with `overwrite` or another `out`)", "resume")


def check_tokenizer(tokenizer: dict, tok: Tokenizer) -> None:
    if tokenizer != tok.state():
        raise TrainError("the tokenizer differs from the checkpoint's (the data or tokenizer "
                         "settings changed); start a new run instead", "resume")


def restore(resumed: dict, trainer: Trainer, tok: Tokenizer, cfg: ExperimentConfig,
            world: World) -> tuple[TrainState, str | None]:
    """Load a checkpoint_last.pt dict into model, optimizer, scaler and RNG; returns where the run
    stood, and why it is finished under `cfg` (`finished`; None: it goes on). `cfg` is the config
    `resumed_config` checked against the checkpoint's."""
    check_tokenizer(resumed["tokenizer"], tok)
    trained = resumed["model"]
    try:
        # `model` is the average (ema.py); the optimizer continues the trained weights
        if trainer.ema is not None:
            if "trained_model" not in resumed:
                raise CheckpointError("train.ema_decay is set but the checkpoint holds no "
                                      "trained_model weights")
            trained = resumed["trained_model"]
            trainer.ema.load(check_weights(resumed["model"], trainer.model.state_dict()),
                             int(resumed["step"]))  # one update per counted (finite) step
        trainer.model.load_state_dict(check_weights(trained, trainer.model.state_dict()))
    except CheckpointError as e:
        raise TrainError(f"checkpoint_last.pt: {e}", "resume") from None
    load_optimizer(trainer.opt, trainer.model, resumed["optimizer"],
                   resumed.get("format_version", FORMAT_VERSION), trained)
    if resumed.get("scaler") and trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(resumed["scaler"])
    st = TrainState(**{f.name: resumed[f.name] for f in fields(TrainState) if f.name in resumed})
    done = finished(st, cfg.train)
    set_rng_state(resumed["rng"], trainer.device)
    ranks = resumed.get("rng_ranks") or []
    if len(ranks) == world.size:
        set_rng_state(ranks[world.rank], trainer.device)
    # a different torchrun world: each rank needs a stream of its own
    elif world.size != max(len(ranks), 1):
        log.warning("resumed with %d processes, the checkpoint was written by %d: each rank's "
                    "random numbers are reseeded from (seed, rank, step), so the run is no longer "
                    "bit-exact", world.size, max(len(ranks), 1))
        torch.manual_seed((cfg.train.seed * 1_000_003 + world.rank * 10_007 + st.step) % 2**63)
    log.info("resumed at step %d (epoch %d, batch %d)", st.step, st.epoch, st.batch_in_epoch)
    return st, done


def optimizer_state(opt: torch.optim.Optimizer, model: nn.Module) -> dict:
    """`opt.state_dict()` with each group's parameter names, so that resuming restores the moments
    by name."""
    state = opt.state_dict()
    names = {id(p): n for n, p in model.named_parameters()}
    for saved, group in zip(state["param_groups"], opt.param_groups, strict=True):
        saved["param_names"] = [names[id(p)] for p in group["params"]]
    return state


def _names_by_position(saved: dict, version: int, model: nn.Module,
                       weights: dict) -> list[list[str]]:
    """The parameter name of every position of each saved group."""
    if version >= 2:
        return [g["param_names"] for g in saved["param_groups"]]
    # format 1: positions follow model.parameters() of the model that saved it, i.e. the saved
    # weights' order with buffers and the second name of a tied weight left out
    params = dict(model.named_parameters(remove_duplicate=False))
    order, seen = [], set()
    for name in weights:
        if name in params and id(params[name]) not in seen:
            seen.add(id(params[name]))
            order.append(name)
    sizes = [len(g["params"]) for g in saved["param_groups"]]
    if sum(sizes) != len(order):
        raise TrainError(f"checkpoint_last.pt (checkpoint format {version}) has optimizer state "
                         f"for {sum(sizes)} parameters, its weights have {len(order)}; start a new "
                         "run", "resume")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [order[a : a + n] for a, n in zip(starts, sizes, strict=True)]


def load_optimizer(opt: torch.optim.Optimizer, model: nn.Module, saved: dict, version: int,
                   weights: dict) -> None:
    """Load `saved` (an optimizer state_dict of checkpoint format `version`) into `opt` by parameter
    name.

    torch's `load_state_dict` pairs saved and current parameters by position; the saved groups' id
    lists are reordered here so that each position holds the id saved for the same name, shapes
    checked.
    """
    try:
        names = _names_by_position(saved, version, model, weights)
        groups = saved["param_groups"]
        if len(groups) != len(opt.param_groups):
            raise ValueError(f"{len(groups)} parameter groups, the optimizer has "
                             f"{len(opt.param_groups)}")
        params = dict(model.named_parameters(remove_duplicate=False))
        current = {id(p): n for n, p in model.named_parameters()}
        regrouped = []
        for group, saved_names, now in zip(groups, names, opt.param_groups, strict=True):
            unknown = [n for n in saved_names if n not in params]
            if unknown:
                raise ValueError(f"names the model does not have: {', '.join(unknown[:3])}")
            ids = {current[id(params[n])]: i for n,
                   i in zip(saved_names, group["params"], strict=True)}
            want = [current[id(p)] for p in now["params"]]
            if ids.keys() != set(want):
                lost = sorted(set(want) - ids.keys()) or sorted(ids.keys() - set(want))
                raise ValueError(f"parameter names differ from the model's ({', '.join(lost[:3])})")
            for name in want:
                moments = saved["state"].get(ids[name], {})
                avg = moments.get("exp_avg")
                if avg is not None and avg.shape != params[name].shape:
                    raise ValueError(f"{name}: moments of shape {tuple(avg.shape)}, the weight has "
                                     f"{tuple(params[name].shape)}")
            regrouped.append({**{k: v for k, v in group.items() if k != "param_names"},
                              "params": [ids[n] for n in want]})
        opt.load_state_dict({"state": saved["state"], "param_groups": regrouped})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TrainError(f"checkpoint_last.pt (checkpoint format {version}): optimizer state does "
                         f"not fit this model: {e}; start a new run", "resume") from None
