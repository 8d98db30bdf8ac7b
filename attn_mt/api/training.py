"""`attn_mt.train`: a config (a YAML file, a dict or an ExperimentConfig, with `section.key=value`
overrides) into a finished run, its results and its best model; progress shows in a terminal or a
notebook.

    >>> run = attn_mt.train("configs/toy.yaml", out="runs/toy", overrides=["train.max_epochs=2"])
    >>> run.results["test_bleu"], run.load().translate("a dog runs.")
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attn_mt.config import ExperimentConfig, from_dict, load_config, to_dict
from attn_mt.config.yamlconf import set_overrides
from attn_mt.data import checks
from attn_mt.errors import InputError
from attn_mt.rundir import RunDir

if TYPE_CHECKING:
    from attn_mt.analysis.history import History

Config = str | os.PathLike | Mapping | ExperimentConfig


def configure(source: Config | None = None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """An experiment config from a YAML file, a nested dict or a config object (None: the defaults,
    the toy corpus), with `section.key=value` overrides applied; validated (ConfigError names the
    key).

    >>> cfg = attn_mt.configure("configs/toy.yaml", ["model.n_layers=2"])
    """
    overrides = override_list(overrides)
    if source is None or isinstance(source, str | os.PathLike):
        return load_config(source, overrides)
    if isinstance(source, ExperimentConfig):
        raw = to_dict(source)
    elif isinstance(source, Mapping):
        # the overrides change the copy, never the caller's dict (a section or one within)
        raw = _copy(source)
    else:
        raise InputError(f"a YAML path, a dict or an ExperimentConfig, not {type(source).__name__}",
                         "config")
    set_overrides(raw, overrides)
    return from_dict(raw)


def override_list(overrides: Sequence[str]) -> list[str]:
    """`section.key=value` overrides as a list: any iterable of strings, not one string (its
    characters)."""
    if isinstance(overrides, str):
        raise InputError("expected a list of section.key=value strings, not one string",
                         "overrides")
    return checks.texts(overrides, "overrides", files=False)[0]


def _copy(raw: Mapping) -> dict:
    """A deep copy of a nested config: mappings as dicts, lists as lists, down to the leaves."""
    def copy(x):
        if isinstance(x, Mapping):
            return {k: copy(v) for k, v in x.items()}
        return [copy(v) for v in x] if isinstance(x, list | tuple) else x

    try:
        return copy(raw)
    except RecursionError:
        raise InputError("a dict that holds itself (or nests deeper than Python recurses)",
                         "config") from None


@dataclass(frozen=True)
class Run:
    """A training run's directory: its results, metrics and tested checkpoint (`attn_mt.train`
    returns one; `attn_mt.Run("runs/toy")` opens a finished one)."""

    dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", checks.path(self.dir, "dir"))

    @property
    def files(self) -> RunDir:
        return RunDir(self.dir)

    @property
    def results(self) -> dict:
        """results.json: test BLEU and chrF with signatures, steps, seconds, ... ({} before the run
        ends)."""
        return self.files.read_results()

    @property
    def metrics(self) -> list[dict]:
        """metrics.jsonl: one dict per evaluation (step, train_loss, valid_loss, valid_bleu,
        tokens_per_s, ...)."""
        return self.files.read_metrics()

    @property
    def best(self) -> Path:
        """The checkpoint the run tested: the best one, or the average of the last ones where that
        won."""
        return self.files.tested(self.results)

    def load(self, **kwargs) -> Model:  # noqa: F821 (api.model.Model)
        """The tested checkpoint as a Model (`attn_mt.load`'s keyword arguments)."""
        from .model import load

        return load(self.best, **kwargs)

    def summary(self) -> str:
        """Two lines: the test scores, then the checkpoint (what `attn-mt train` prints at the
        end)."""
        from attn_mt.training.progress import summary

        return summary(self.dir)

    def __repr__(self) -> str:
        r = self.results
        done = f"test BLEU {r['test_bleu']:.2f}, {r['steps']} steps" if r else "not finished"
        return f"<attn_mt.Run {str(self.dir)!r}: {done}>"


@contextlib.contextmanager
def _reporting(quiet: bool) -> Iterator[None]:
    """attn-mt's INFO lines (validation, the end of the run) to stderr while training, when nothing
    else shows them (a notebook, a script without logging set up); the caller's own logging set-up
    is left alone."""
    log = logging.getLogger("attn_mt")
    if quiet or logging.getLogger().handlers or log.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def train(config: Config | None = None, out: str | os.PathLike | None = None, *,
          overrides: Sequence[str] = (), resume: bool = False, overwrite: bool = False,
          quiet: bool = False) -> Run:
    """Train a model: the config's data and tokenizer, the model, the steps, validation and test
    BLEU, into the run directory `out` (default runs/<config name>). `resume` continues a stopped
    run exactly; `overwrite` replaces an earlier run. With `train.init_from` (a checkpoint, or a
    MarianMT folder or hub name) the run fine-tunes that model. Returns the finished `Run`.

    >>> run = attn_mt.train("configs/toy.yaml", "runs/toy2", overrides=["train.max_steps=50"])
    """
    from attn_mt.training.memory import reuse_freed_memory
    from attn_mt.training.run import train as run_training

    from .opening import open_state

    for value, name in ((resume, "resume"), (overwrite, "overwrite"), (quiet, "quiet")):
        checks.boolean(value, name)
    cfg = configure(config, overrides)
    run_dir = checks.path(out, "out") if out is not None else Path("runs") / cfg.name
    # a checkpoint or a
    init = open_state(cfg.train.init_from) if cfg.train.init_from and not resume else None
    # MarianMT model; a resumed run reads only its own checkpoint
    reuse_freed_memory()  # ~20-30% faster CPU training steps (training/memory.py)
    observers = ()
    if cfg.train.record_attention:  # RUN/attention_history.npz
        from attn_mt.analysis.history import Recorder

        observers = (Recorder(run_dir),)
    with _reporting(quiet):
        run_training(cfg, run_dir, resume=resume, overwrite=overwrite, init=init,
                     observers=observers)
    return Run(run_dir)


def history(run_dir: str | os.PathLike) -> History:
    """The attention a run recorded at step 0 (where it started fresh: the untrained model) and at
    each of its evaluations (train.record_attention): every head's weights on a few fixed sentences,
    its roles, entropy and coreference score (analysis/history.py's `History`).

    >>> h = attn_mt.history("runs/toy"); h.steps, h.modules, h.uniform_step()
    """
    from attn_mt.analysis.history import load_history

    return load_history(checks.path(run_dir, "run_dir"))

