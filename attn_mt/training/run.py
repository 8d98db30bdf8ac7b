"""Training: data -> tokenizer -> model -> steps, evaluations and checkpoints -> test scores.

`train(cfg, run_dir)` is the whole job: `setup`, the loop over epochs and steps (`after_step`: progress,
limits, `validation_round` and checkpoints on the configured schedule), and `finish`. It writes into
`run_dir` the files rundir.py lists.

checkpoint_last.pt is saved at every evaluation, every `train.checkpoint_every` steps and on
Ctrl-C. `train(..., resume=True)` continues from it, also in the middle of an epoch: the batch
order is a function of (seed, epoch), the learning rate a function of the step, and the RNG,
optimizer and loss-window state travel in the checkpoint, so on CPU a resumed run ends with
the same parameters, bit for bit, as one that was never stopped.

One job: a training job from set-up to test scores; the step is trainer.py's, resuming resume.py's.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from attn_mt import checkpoint
from attn_mt.config import ExperimentConfig
from attn_mt.config.yamlconf import OptionError
from attn_mt.data.cache import Resumed, open_entry
from attn_mt.data.corpus import Corpus, read_corpus
from attn_mt.data.sources import source
from attn_mt.device import pick_device, pick_precision, rng_state
from attn_mt.models import build_model, count_params
from attn_mt.rundir import RunDir
from attn_mt.training.progress import Progress, time_left, write
from attn_mt.training.resume import optimizer_state, restore, resumed_config
from attn_mt.training.schedule import Stop, budget_spent, limit_reached
from attn_mt.training.trainer import Step, Trainer, TrainError, TrainInterrupted, TrainState, World
from attn_mt.training.validation import SHOWN, Observer, score_test_split, validate

if TYPE_CHECKING:
    from attn_mt.training.board import Board

__all__ = ["TrainError", "TrainInterrupted", "train"]
log = logging.getLogger(__name__)


class StopOnInterrupt:
    """While training, Ctrl-C sets `requested`: the loop saves after the current step and stops.

    A second Ctrl-C interrupts at once (the last saved checkpoint stays as it was).
    """

    def __enter__(self) -> StopOnInterrupt:
        self.requested, self.previous = False, None
        main = threading.current_thread() is threading.main_thread()  # only it receives signals
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self.previous = signal.signal(signal.SIGINT, self._handle) or signal.default_int_handler
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)
        log.warning("interrupted: saving after this step (Ctrl-C again to stop without saving)")

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


@dataclass
class Training:
    """A training run in progress: what `setup` built, and the clock (the public API's `attn_mt.Run`
    is a run's directory)."""

    cfg: ExperimentConfig
    files: RunDir
    world: World
    corpus: Corpus
    trainer: Trainer
    board: Board | None  # TensorBoard's writer (train.tensorboard, rank 0), else None
    finished: str | None = None  # why a resumed run had already finished (resume.finished), or None
    observers: tuple[Observer, ...] = ()  # called at every evaluation on rank 0 (the attention recorder)
    start: float = field(default_factory=time.perf_counter)  # the clock's zero (earlier when resumed)
    tokens_per_s: float = 0.0
    window_t0: float = field(default_factory=time.perf_counter)

    @property
    def state(self) -> TrainState:
        return self.trainer.state

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def train(cfg: ExperimentConfig, run_dir: Path, resume: bool = False, overwrite: bool = False,
          init: dict | None = None, observers: tuple[Observer, ...] = ()) -> Path:
    """Train the configured model; returns the path of the checkpoint that was tested.

    A fresh run refuses a directory that holds an earlier run unless `overwrite`; `resume`
    continues one, and a run that had already finished is not trained further. `init`: the checkpoint
    state of the model `train.init_from` names (the run fine-tunes it: its shape, tokenizer and weights).
    `observers` watch every evaluation (validation.Observer), rewound to where the run starts.
    """
    if resume and overwrite:
        raise OptionError("give one of resume and overwrite, not both", "overwrite")
    run = setup(cfg, RunDir(run_dir), resume, overwrite, init)
    tr, st, tc = run.trainer, run.state, run.cfg.train
    if run.world.main:
        run.observers = tuple(observers)
        for o in run.observers:  # as files.rewind: what was recorded after the checkpoint goes
            o.rewind(st.step, run.corpus, run.cfg, tr.model)
    done = run.finished
    tested = bool(done) and run.files.results.exists()  # finished and tested before: nothing to do
    if not done:  # the loop: epochs, their steps, and after each what its place in the schedule asks for
        tr.model.train()
        with StopOnInterrupt() as interrupt, tr.prefetch:  # its batch thread ends with the loop
            while not done and st.epoch < tc.max_epochs:
                groups = -(-len(tr.epoch_batches()) // tc.accum_steps)
                with Progress(st.epoch + 1, groups, st.batch_in_epoch // tc.accum_steps, run.world.main) as bar:
                    while not done and not tr.epoch_done:
                        out = tr.step(run.elapsed, lambda: interrupt.requested)
                        bar.update()
                        if out.number is not None:  # host checks: a skipped step changes no count
                            done = after_step(run, bar, out)
                        if out.interrupted:
                            save_last(run)
                            raise TrainInterrupted(f"stopped at step {st.step}; {run.files.last} saved, "
                                                   "continue with `resume`")
                if not done:
                    tr.next_epoch()
                    last = Stop.max_epochs(tc) if st.epoch == tc.max_epochs else None
                    if not tc.eval_every or last:
                        done = validation_round(run, last)
            done = done or Stop.max_epochs(tc)
    log.info("the run had already finished (%s): nothing to do" if tested else "stopped: %s", done)
    return wind_up(run, tested)


def wind_up(run: Training, tested: bool) -> Path:
    """After the loop: the writers and processes closed, then rank 0 tests (unless a finished run was tested)."""
    if run.board is not None:
        run.board.close()
    run.trainer.unwrap()  # the DistributedDataParallel wrapper goes before its process group
    run.world.close()  # every rank is past its last collective; rank 0 tests alone, nothing to time out
    if tested:
        if run.world.main:
            write_test_texts(run, missing=True)
        return run.files.tested(run.files.read_results())
    return finish(run) if run.world.main else run.files.best


def join(device: torch.device) -> tuple[World, torch.device]:
    """The processes of this run, and this one's device: one process, or under torchrun (WORLD_SIZE > 1) its
    rank in the process group (training/distributed.py, loaded only then)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return World(), device
    from attn_mt.training import distributed

    return distributed.init(device)


def setup(cfg: ExperimentConfig, files: RunDir, resume: bool, overwrite: bool = False,
          init: dict | None = None) -> Training:
    """Set-up, in order: the processes and the run directory; the config, resolved once (fine-tuning and resuming
    here, the automatic size once the data is open: it measures on it); the data; the model; the trainer, with a
    resumed run's state. What each step is given comes from the final config."""
    world, device = join(pick_device(cfg.train.device))
    precision = pick_precision(cfg.train.precision, device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if world.main:  # rank 0 reports and writes (distributed.init quiets the others)
        files.claim(resume, overwrite)
        files.check_writable()
    resumed = checkpoint.load(files.last) if resume else None
    if cfg.train.init_from and (init is None or resumed is not None):  # a resumed run reads only itself (what
        init = resumed or checkpoint.load(cfg.train.init_from)  # it took from init_from); the API reads Marian
    tok = None  # the data's tokenizer: trained with the data, or else the fine-tuned model's, whose shape it takes
    if init is not None:
        from attn_mt.training import finetune  # the extras below load where the config asks for them

        cfg, tok = finetune.adopt(cfg, init), finetune.init_tokenizer(cfg, init)
    if resumed is not None:
        cfg = resumed_config(resumed, files.last, cfg)  # the settings the resumed run keeps
    # the data cache entry, found or built (rank 0 first, the others wait and then find it), recorded in the run
    used = Resumed.of(files.entry_key(), resumed["tokenizer"]) if resumed is not None else None
    if not world.main:
        world.barrier()
    entry = open_entry(cfg, used, tok)
    if world.main:
        files.record_entry(entry)  # which entry the run uses (tokenizer.json), a copy of its tokenizer
        world.barrier()
    corpus = read_corpus(cfg, entry, cfg.model.max_positions)
    choice = None  # model.size: auto, a fresh run: the size chosen by measuring (training/autosize.py)
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
    if world.main:  # what was written after the checkpoint will be written again; a fresh run starts a fresh log
        files.rewind(trainer.state.step, trainer.state.epoch, tc.keep_last, finished=bool(done))
    log.info("model %s: %.2fM parameters; device %s, precision %s", cfg.model.kind, count_params(model) / 1e6,
             device, precision)
    board = None
    if tc.tensorboard and world.main:
        from attn_mt.training.board import Board

        board = Board(files.tensorboard, True, trainer.state.step)
    return Training(cfg, files, world, corpus, trainer, board, done,
               start=time.perf_counter() - trainer.state.elapsed_s - (choice.measure_s if choice else 0.0))


def build_net(cfg: ExperimentConfig, corpus: Corpus, init: dict | None, world: World,
              device: torch.device) -> tuple[nn.Module, nn.Module]:
    """(the model on `device`: seeded, started from `init` when fine-tuning a fresh run, train.freeze applied;
    what runs its training forward/backward: under torchrun DistributedDataParallel, compiled if asked)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, **corpus.tok.sizes())
    if tc.freeze or init is not None:
        from attn_mt.training import finetune  # an extra: loaded where the config asks for it

        finetune.freeze(model, tc.freeze)
        if init is not None:
            finetune.start_from(model, init, tc.init_from)
    model = net = model.to(device)
    if world.enabled:
        torch.manual_seed(tc.seed + world.rank)  # same initial weights, different dropout per rank
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        log.info("%d processes; train.batch_tokens=%d is the global batch", world.size, tc.batch_tokens)
    if tc.compile:  # the training forward/backward only: evaluation and decoding stay eager
        from attn_mt.training.compiled import compiled

        net = compiled(net, tc, device)
    return model, net


def after_step(run: Training, bar: Progress, out: Step) -> str | None:
    """What step number `out.number` asks for: a progress report, an evaluation (with a limit reached, the
    last one) or a checkpoint. Returns why the run stops, or None."""
    tc, st, n = run.cfg.train, run.state, out.number
    if n % tc.log_every == 0:
        report_progress(run, bar, out.lr)
    reason = limit_reached(tc, st.step, out.elapsed, st.tokens)  # exact counts (deferred.py: read at a limit)
    if reason or (tc.eval_every and n % tc.eval_every == 0):
        return validation_round(run, reason)
    if tc.checkpoint_every and n % tc.checkpoint_every == 0:
        save_last(run)
    return None


def report_progress(run: Training, bar: Progress, lr: float) -> None:
    """Mean loss and tokens/s over the steps since the last report, on the progress bar and TensorBoard."""
    run.trainer.read()
    st, now = run.state, time.perf_counter()
    if not st.window_tokens:  # deferred checks: every step since the last report was skipped
        return
    st.train_loss = st.window_loss / st.window_tokens
    run.tokens_per_s = st.window_tokens / max(now - run.window_t0, 1e-9)
    spent = budget_spent(run.cfg.train, st.step, run.elapsed(), st.epoch + bar.done / max(bar.total, 1), st.tokens)
    bar.report(st.step, st.train_loss, lr, run.tokens_per_s, time_left(run.elapsed(), spent))
    if run.board is not None:
        run.board.scalars(st.step, "train", {"loss": st.train_loss, "lr": lr, "tokens_per_s": run.tokens_per_s,
                                             "grad_norm": run.trainer.grad_norm})
    st.window_loss, st.window_tokens, run.window_t0 = 0.0, 0, now


def checkpoint_state(run: Training, rngs: list[dict]) -> dict:
    """What checkpoint_last.pt holds: weights, optimizer, config, tokenizer, every rank's RNG, TrainState."""
    st, tr = run.state, run.trainer
    st.elapsed_s = run.elapsed()
    weights, trained = tr.model.state_dict(), {}
    if tr.ema is not None:  # the average is the model; a resumed run continues from the trained weights
        weights, trained = tr.ema.state_dict(tr.model), {"trained_model": weights}
    return {**checkpoint.model_state(weights, run.cfg, run.corpus.tok), **trained,
            "optimizer": optimizer_state(tr.opt, tr.model), "rng": rngs[0],
            "rng_ranks": rngs if run.world.enabled else None,
            "scaler": tr.scaler.state_dict() if tr.scaler.is_enabled() else None, **asdict(st)}


def save_last(run: Training) -> None:
    """checkpoint_last.pt; every rank calls it (the RNG states are gathered), rank 0 writes."""
    run.trainer.read()  # the counters it saves, exact
    rngs = run.world.gather(rng_state(run.trainer.device))
    if run.world.main:
        checkpoint.save(checkpoint_state(run, rngs), run.files.last)


def validation_round(run: Training, reason: str | None = None) -> str | None:
    """Every rank calls it; rank 0 validates, logs and saves. Returns `reason`, or early stopping's."""
    run.trainer.read()
    st = run.state
    if not run.tokens_per_s:  # no progress report yet: the run's rate so far, before validating
        run.tokens_per_s = st.tokens / max(run.elapsed(), 1e-9)
    rngs = run.world.gather(rng_state(run.trainer.device))
    if run.world.main:
        reason = validate_and_save(run, rngs, reason)
    reason, st.best_bleu, st.bad_evals, st.stopped = run.world.broadcast(
        (reason, st.best_bleu, st.bad_evals, st.stopped))
    return reason


def validate_and_save(run: Training, rngs: list[dict], reason: str | None) -> str | None:
    """Validation into metrics.jsonl, the log and TensorBoard; checkpoint_best/last and the kept snapshots.
    Returns `reason` or early stopping's, recorded in the checkpoints (`TrainState.stopped`)."""
    st, tc, tr = run.state, run.cfg.train, run.trainer
    with tr.evaluated():
        metrics = validate(tr.model, run.corpus, run.cfg, tr.device, tr.precision)
        if run.board is not None:
            run.board.attention(st.step, tr.model, run.corpus.tok,
                                run.corpus.text[run.cfg.data.splits.valid][0][0], run.cfg.decode, tr.device)
        record = write_metrics(run, metrics)
        for o in run.observers:  # after the metrics record, before the checkpoints (rundir.py: the order)
            o.on_evaluation(st.step, tr.model, run.corpus.tok, record)
    if metrics["valid_bleu"] > st.best_bleu:
        st.best_bleu, st.bad_evals = metrics["valid_bleu"], 0
    else:
        st.bad_evals += 1
    if tc.patience and st.bad_evals >= tc.patience:
        reason = Stop.patience(tc)
    st.stopped = reason or ""
    state = checkpoint_state(run, rngs)
    if st.bad_evals == 0:
        checkpoint.save(state, run.files.best)  # before last: a kill in between loses nothing
    if tc.keep_last:
        run.files.keep_weights(state)  # before last too; the oldest goes after it (a resumed run rewinds to last)
    checkpoint.save(state, run.files.last)
    if tc.keep_last:
        run.files.trim_snapshots(st.step, tc.keep_last)
    return reason


def write_metrics(run: Training, metrics: dict[str, float]) -> dict:
    """The one writer of an evaluation's `metrics` (validation.SHOWN says how each shows): its metrics.jsonl
    record (returned), its log line and its TensorBoard scalars (valid/<name>)."""
    st, shown = run.state, {name: SHOWN[name] for name in metrics}
    loss = st.train_loss  # the last progress report's; before one, this window's
    if math.isnan(loss) and st.window_tokens:
        loss = st.window_loss / st.window_tokens
    record = {"step": st.step, "epoch": st.epoch, "train_loss": round(loss, 4),
              **{name: value if digits is None else round(value, digits)
                 for (name, value), (_, _, digits) in zip(metrics.items(), shown.values(), strict=True)},
              "lr": run.trainer.opt.param_groups[0]["lr"], "skipped_steps": st.skipped_steps,
              "tokens_per_s": round(run.tokens_per_s, 1), "elapsed_s": round(run.elapsed(), 1)}
    run.files.append_metrics(record)
    write(f"step {st.step} epoch {st.epoch}: " + ", ".join(f"{label} {metrics[name]:{form}}"
                                                           for name, (label, form, _) in shown.items()))
    if run.board is not None:
        run.board.scalars(st.step, "valid", {name.removeprefix("valid_"): value for name, value in metrics.items()})
    return record


def finish(run: Training) -> Path:
    """Rank 0: average the kept snapshots (if any), score the better checkpoint on test, write results.json."""
    st, tc, tr, files = run.state, run.cfg.train, run.trainer, run.files
    train_seconds = run.elapsed()
    test_path, extra = files.best, {}
    if tc.keep_last >= 2 and len(files.snapshots()) >= 2:  # test the average of the last ones where it wins
        from attn_mt.training import averaging  # an extra: loaded only where a run averages

        test_path, extra = averaging.average_snapshots(files, tr.model, st.best_bleu, lambda: validate(
            tr.model, run.corpus, run.cfg, tr.device, tr.precision)["valid_bleu"])
    best = checkpoint.load(test_path, map_location=tr.device)
    tr.model.load_state_dict(best["model"])
    hyps, scores = score_test_split(tr.model, run.corpus, run.cfg, tr.device, tr.precision)
    results = {"test_split": run.cfg.data.splits.test, "test_bleu": scores["bleu"], "test_chrf": scores["chrf"],
               "sacrebleu_signature": scores["bleu_signature"], "chrf_signature": scores["chrf_signature"],
               "best_step": best["step"], **extra, "tested": test_path.name, "best_valid_bleu": st.best_bleu,
               "train_seconds": round(train_seconds, 1), "steps": st.step, "tokens": st.tokens,
               "skipped_steps": st.skipped_steps, "params": count_params(tr.model), "device": str(tr.device),
               "precision": tr.precision,
               "threads": torch.get_num_threads(), "torch": torch.__version__}
    if tc.init_from:
        results["init_from"] = tc.init_from
    if (size := files.read_size()) is not None:
        results["size"] = size
    write_test_texts(run)
    files.write_results(results, hyps)  # results.json last of all: a run directory that has it is finished
    return test_path


def write_test_texts(run: Training, missing: bool = False) -> None:
    """The test split's sources and references as `{split}.{lang}` in the run directory, line-aligned with
    test_hyps.txt: the evaluate command works on these files (sources, references) for any data source.
    `missing`: only where one is missing (a run finished by an attn-mt that wrote them after results.json)."""
    data = run.cfg.data
    langs = (data.src_lang, data.tgt_lang)
    if missing and all(run.files.test_text(data.splits.test, lang).exists() for lang in langs):
        return
    run.files.write_test_texts(data.splits.test, dict(zip(langs, run.corpus.text[data.splits.test], strict=True)))
    # the score command's contrastive mode reads these
    if (records := source(data).contrastive(data.splits.test)) is not None:
        run.files.write_contrastive(data.splits.test, records)

