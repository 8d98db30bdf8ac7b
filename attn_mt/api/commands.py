"""The public API's functions beyond one model: data, checkpoints of a run, exports, measurements,
serving. Each is one command of the CLI (`attn-mt average` is `attn_mt.average`), callable from
Python.

    >>> attn_mt.average(["runs/toy/checkpoint_step0000300.pt",
    ...                  "runs/toy/checkpoint_step0000330.pt"], "avg.pt")

Tested in tests/test_cli.py, tests/test_average.py, tests/data/test_cache.py (prepare, its list and
clean) and tests/measure/.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from attn_mt.data import checks
from attn_mt.errors import InputError
from attn_mt.files import OutputError, check_outputs  # every output checked before any work
from attn_mt.rundir import RunDir

from .training import Config, configure, override_list


def average(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *,
            force: bool = False) -> Path:
    """Average the weights of several checkpoints of one run into `out` (`force`: of different runs
    too)."""
    from attn_mt.training.averaging import average_files

    if isinstance(paths, str | os.PathLike) or not isinstance(paths, Iterable):
        raise InputError(f"expected a list of checkpoint files, not {type(paths).__name__}",
                         "paths")
    paths = [checks.path(p, "paths") for p in paths]
    checks.path(out, "out")
    checks.boolean(force, "force")
    average_files([Path(p) for p in paths], Path(out), force=force)
    return Path(out)


def download(dataset: str = "multi30k", out: str | os.PathLike = "data/multi30k") -> list[Path]:
    """Fetch a corpus (its URL, else the Hugging Face hub) into line-aligned `{split}.{lang}` files
    in `out`."""
    from attn_mt.data.download import download as fetch

    checks.text(dataset, "dataset")
    checks.path(out, "out")
    check_outputs([("out", out, None)])
    return fetch(dataset, Path(out))


def export_model(checkpoint: str | os.PathLike, out: str | os.PathLike, *,
                 format: str = "ctranslate2", quantization: str = "float32") -> list[Path]:
    """Write a Transformer checkpoint as a CTranslate2 model folder (`attn_mt.load` opens it) or,
    with format="transformers", as a Hugging Face model folder with a model card; returns the files
    written."""
    from attn_mt.export import export_model as write

    checks.path(checkpoint, "checkpoint")
    checks.path(out, "out")
    check_outputs([("out", out, None)], [checkpoint])  # the folder's own rules: export/folder.py
    return write(Path(checkpoint), Path(out), format, quantization)


def prepare(config: Config | None = None, overrides: Sequence[str] = ()):
    """Train the tokenizer and tokenize the training split into the data cache (an `Entry`,
    `.describe()`)."""
    from attn_mt.data import cache

    return cache.prepare(configure(config, overrides))


def cache_survey(config: Config | None = None, overrides: Sequence[str] = (), *,
                 clean: bool = False) -> list[str]:
    """The data cache's entries and leftovers, a line each; with `clean`, remove the damaged ones
    and leftovers of stopped builds first."""
    from attn_mt.data import cache, tidy

    checks.boolean(clean, "clean")
    return (tidy.clean if clean else tidy.survey)(
        cache.cache_root(configure(config, overrides).data))


def compare_rnn(config: str | os.PathLike, overrides: Sequence[str] = (), *,
                out: str | os.PathLike | None = None, quick: bool = False):
    """Train the Transformer and the RNN on the same data and clock, then time both against sentence
    length; writes the report into `out` (runs/compare) and returns it."""
    from attn_mt.analysis.history import Recorder
    from attn_mt.config.compare_rnn import load_compare_config
    from attn_mt.measure.compare import compare_rnn as run_compare
    from attn_mt.training.memory import reuse_freed_memory

    checks.path(config, "config")
    checks.boolean(quick, "quick")
    overrides = override_list(overrides)
    if out is not None:
        checks.path(out, "out")
    folder = Path(out) if out else Path("runs") / ("compare_quick" if quick else "compare")
    check_outputs([("out", folder, None)], [config])
    setup = load_compare_config(Path(config), list(overrides), quick=quick)
    # out/transformer/attention_history.npz ... must not serve a run's checkpoint
    for name in setup.configs:
        if RunDir(folder / name).holds_run():
            raise OutputError(f"out {folder}: {folder / name} holds a run's files, whose attention "
                              "history this comparison would replace; choose another `out`", "out")
    reuse_freed_memory()  # both models train as `train` trains them (training/memory.py)
    # each model's attention history in a folder of its own: out/transformer/attention_history.npz,
    # out/rnn/...
    observers = {name: Recorder(folder / name) for name, cfg in setup.configs.items()
                 if cfg.train.record_attention}
    return run_compare(setup, folder, observers)


def bench(config: Config | None = None, overrides: Sequence[str] = (), *,
          checkpoint: str | os.PathLike | None = None, repeats: int = 5, steps: int = 2,
          sentences: int = 100, compile: bool = False,
          json_out: str | os.PathLike | None = None) -> dict:
    """Training tokens/s of ours against torch.nn.Transformer, MFU, and (with `checkpoint`)
    translation speed."""
    from attn_mt.measure.bench import run_bench
    from attn_mt.training.memory import reuse_freed_memory

    for value, name in ((repeats, "repeats"), (steps, "steps"), (sentences, "sentences")):
        checks.integer(value, name)
    checks.boolean(compile, "compile")
    for value, name in ((checkpoint, "checkpoint"), (json_out, "json_out")):
        if value is not None:
            checks.path(value, name)
    check_outputs([("json_out", json_out, (".json",))],
                  # before any work
                  [checkpoint, config if isinstance(config, str | os.PathLike) else None])
    cfg = configure(config, overrides)
    # the step timed as `train` runs it: without, freed blocks fault in again every step
    reuse_freed_memory()
    return run_bench(cfg, checkpoint=Path(checkpoint) if checkpoint else None,
                     repeats=repeats, steps=steps, compile=compile, sentences=sentences,
                     json_out=Path(json_out) if json_out else None)

