"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one run.

Averaging the last few checkpoints of a run smooths the noise of the final updates and usually gains
BLEU at no training cost. Two callers, and only they load this module: `attn-mt average`
(`attn_mt.average`: `average_files`), and a run that keeps its last snapshots (train.keep_last >=
2), which averages them at its end and tests the average where it wins on valid BLEU
(training/finish.py's `finish`: `average_snapshots`). Which config changes keep a run the same run
is config/changes.py's.

Tested in tests/test_average.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from attn_mt.checkpoint import CheckpointError, checked_state, load, save
from attn_mt.config import ConfigError
from attn_mt.config.changes import config_changes
from attn_mt.config.yamlconf import show
from attn_mt.files import check_outputs
from attn_mt.rundir import RunDir

log = logging.getLogger(__name__)


def average(paths: list[Path | str], force: bool = False) -> dict:
    """One checkpoint whose weights are the element-wise mean of several checkpoints of one run.

    All files must hold the same model (same parameter names and shapes) and the same tokenizer;
    config, tokenizer and step come from the last. They must also come from one run: the same config
    apart from the budget (RESUMABLE), so the same seed, unless `force`. The result holds weights
    only (no optimizer): it translates and evaluates, it does not resume.
    """
    if not paths:
        raise CheckpointError("nothing to average: give at least one checkpoint")
    states = [(Path(p), load(p)) for p in paths]
    # each one whole (config, tokenizer, finite weights), an error naming it
    for path, state in states:
        try:
            checked_state(state)
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
    first_path, first = states[0]
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path, state in states[1:]:
        if not force:
            _same_run(path, state, first_path, first)
        weights = state["model"]
        if weights.keys() != total.keys():
            raise CheckpointError(f"{path}: has other parameters than {first_path}; "
                                  "only checkpoints of one model can be averaged")
        if state.get("tokenizer") != first.get("tokenizer"):
            raise CheckpointError(f"{path}: has another tokenizer than {first_path}")
        for key, value in weights.items():
            if value.shape != total[key].shape:
                raise CheckpointError(f"{path}: {key} has shape {tuple(value.shape)}, "
                                      f"{first_path} has {tuple(total[key].shape)}")
            if value.is_floating_point():
                total[key] += value.double()
    last = states[-1][1]
    model = {k: (v / len(states)).to(last["model"][k].dtype) if v.is_floating_point()
             else last["model"][k] for k, v in total.items()}
    return {"model": model, "config": last["config"], "tokenizer": last["tokenizer"],
            "step": last.get("step", 0), "epoch": last.get("epoch", 0),
            "averaged": [str(p) for p, _ in states]}


def _same_run(path: Path, state: dict, first_path: Path, first: dict) -> None:
    """CheckpointError unless the checkpoint at `path` comes from the run of `first`
    (config/changes.py)."""
    try:
        changed = config_changes(first["config"], state["config"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: config is not valid for this attn-mt: {e}") from None
    if changed:
        what = "; ".join(f"{k} is {show(new)} there, {show(old)} in {first_path.name}" for k, old,
                         new in changed[:4])
        raise CheckpointError(f"{path}: not of the same run as {first_path} ({what}); averaging "
                              "checkpoints of different runs gives a broken model (`force` "
                              "averages them anyway)")


def average_files(paths: list[Path], out: Path, force: bool = False) -> None:
    """`attn-mt average`: the weights of several checkpoints of one run, averaged into `out`; a
    snapshot pattern the shell left unmatched (no run kept any) says why. `out` is checked first:
    not one of `paths`, nor a checkpoint name of a run directory (`RunDir.refuse_own`)."""
    missing = next((p for p in paths if not p.exists()), None)
    # the shell left an unmatched glob as it was
    if missing is not None and "checkpoint_step" in missing.name:
        raise CheckpointError(f"{missing}: checkpoint not found (a run keeps checkpoint_step*.pt "
                              "only with train.keep_last: N)")
    # before any work: never over a checkpoint it reads
    check_outputs([("out", out, (".pt",))], paths)
    RunDir(out.parent).refuse_own(out, "out")
    save(average(paths, force=force), out)


def average_snapshots(files: RunDir, model: torch.nn.Module, best_bleu: float,
                      valid_bleu: Callable[[], float]) -> tuple[Path, dict]:
    """The end of a run: its kept snapshots averaged into checkpoint_avg.pt and loaded into `model`,
    scored by `valid_bleu`; (the better of average and best single checkpoint (`best_bleu`), the
    results' extras)."""
    snapshots = files.snapshots()
    n = len(snapshots)
    averaged = average(snapshots)
    save(averaged, files.average)
    model.load_state_dict(averaged["model"])
    avg_bleu = valid_bleu()
    better = avg_bleu > best_bleu
    log.info("average of the last %d checkpoints: valid BLEU %.2f (best single %.2f); testing %s",
             n, avg_bleu, best_bleu, "the average" if better else "the best single checkpoint")
    return (files.average if better else files.best), {"averaged_valid_bleu": avg_bleu,
                                                       "averaged_checkpoints": n}
