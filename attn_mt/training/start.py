"""A training run's start (`setup`): processes, run directory, config, data, model and trainer, in
that order, each step given what the one before produced; a resumed run's state restored.

Tested in tests/training/test_run.py and test_resume.py.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from attn_mt import checkpoint
from attn_mt.config import ExperimentConfig
from attn_mt.data.cache import Resumed, open_entry
from attn_mt.data.corpus import Corpus, read_corpus
from attn_mt.device import pick_device, pick_precision
from attn_mt.models import count_params
from attn_mt.rundir import RunDir
from attn_mt.training.resume import restore, resumed_config
from attn_mt.training.schedule import TrainState
from attn_mt.training.trainer import Trainer
from attn_mt.training.validation import Observer
from attn_mt.training.variants import World, build_net

if TYPE_CHECKING:
    from attn_mt.training.board import Board

log = logging.getLogger(__name__)


@dataclass
class Training:
    """A training run in progress: what `setup` built, and the clock (the public API's
    `attn_mt.Run` is a run's directory)."""

    cfg: ExperimentConfig
    files: RunDir
    world: World
    corpus: Corpus
    trainer: Trainer
    board: Board | None  # TensorBoard's writer (train.tensorboard, rank 0), else None
    finished: str | None = None  # why a resumed run had already finished (resume.finished)
    observers: tuple[Observer, ...] = ()  # called at every evaluation on rank 0
    start: float = field(default_factory=time.perf_counter)  # the clock's zero (earlier: resumed)
    tokens_per_s: float = 0.0
    window_t0: float = field(default_factory=time.perf_counter)

    @property
    def state(self) -> TrainState:
        return self.trainer.state

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def join(device: torch.device) -> tuple[World, torch.device]:
    """The processes of this run, and this one's device: one process, or under torchrun
    (WORLD_SIZE > 1) its rank in the process group (training/distributed.py, loaded only then)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return World(), device
    from attn_mt.training import distributed

    return distributed.init(device)


def setup(cfg: ExperimentConfig, files: RunDir, resume: bool, overwrite: bool = False,
          init: dict | None = None, observers: tuple[Observer, ...] = ()) -> Training:
    """Set-up, in order: the processes and the run directory; the config, resolved once
    (fine-tuning and resuming here, the automatic size once the data is open: it measures on it);
    the data; the model; the trainer, with a resumed run's state; the `observers`, rewound to
    where the run starts. What each step is given comes from the final config."""
    world, device = join(pick_device(cfg.train.device))
    precision = pick_precision(cfg.train.precision, device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if world.main:  # rank 0 reports and writes (distributed.init quiets the others)
        files.claim(resume, overwrite)
        files.check_writable()
    resumed = checkpoint.load(files.last) if resume else None
    if cfg.train.init_from and (init is None or resumed is not None):  # a resumed run reads only
        init = resumed or checkpoint.load(cfg.train.init_from)  # itself; the API passes `init`
    tok = None  # the data's tokenizer: trained with the data, or the fine-tuned model's
    if init is not None:
        from attn_mt.training import finetune  # the extras below load where the config asks

        cfg, tok = finetune.adopt(cfg, init), finetune.init_tokenizer(cfg, init)
    if resumed is not None:
        cfg = resumed_config(resumed, files.last, cfg)  # the settings the resumed run keeps
    # the data cache entry, found or built (rank 0 first, the others wait and then find it)
    used = Resumed.of(files.entry_key(), resumed["tokenizer"]) if resumed is not None else None
    if not world.main:
        world.barrier()
    entry = open_entry(cfg, used, tok)
    if world.main:
        files.record_entry(entry)  # which entry the run uses (tokenizer.json)
        world.barrier()
    corpus = read_corpus(cfg, entry, cfg.model.max_positions)
    choice = None  # model.size: auto, a fresh run: the size chosen by measuring (autosize.py)
    if resumed is None and getattr(cfg.model, "size", "fixed") == "auto":
        from attn_mt.training import autosize

        cfg, choice = autosize.plan(cfg, corpus, device, precision, world.enabled)
    tc = cfg.train  # the config is final
    if world.main:
        files.write_config(cfg)
        if choice is not None:
            files.write_size(choice.to_json())
    model, net = build_net(cfg, corpus, init if resumed is None else None, world, device)
    if world.main:
        files.check_space(model, tc.keep_last, averaged=bool(tc.ema_decay))
    trainer = Trainer(model, cfg, corpus, device, precision, net=net, world=world)
    done = None  # why a resumed run had already finished
    if resumed is not None:
        trainer.state, done = restore(resumed, trainer, corpus.tok, cfg, world)
    st = trainer.state
    if world.main:  # what was written after the checkpoint is written again
        files.rewind(st.step, st.epoch, tc.keep_last, finished=bool(done))
    log.info("model %s: %.2fM parameters; device %s, precision %s", cfg.model.kind,
             count_params(model) / 1e6, device, precision)
    board = open_board(files, st.step) if tc.tensorboard and world.main else None
    start = time.perf_counter() - st.elapsed_s - (choice.measure_s if choice else 0.0)
    run = Training(cfg, files, world, corpus, trainer, board, done, start=start)
    if world.main:
        run.observers = rewound(observers, run)
    return run


def open_board(files: RunDir, step: int) -> Board:
    """TensorBoard's writer (train.tensorboard), what it had after `step` dropped."""
    from attn_mt.training.board import Board

    return Board(files.tensorboard, True, step)


def rewound(observers: tuple[Observer, ...], run: Training) -> tuple[Observer, ...]:
    """The `observers`, each rewound to where the run starts: as the run directory's files, what was
    recorded after the checkpoint goes."""
    for o in observers:
        o.rewind(run.state.step, run.corpus, run.cfg, run.trainer.model)
    return tuple(observers)
