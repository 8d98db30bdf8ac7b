"""What a run does at an evaluation, and the checkpoint it saves between them.

`validation_round` (every process calls it; rank 0 works): validation loss and BLEU, recorded
once (metrics.jsonl, the log, TensorBoard, the observers), early stopping, then
checkpoint_best.pt, the kept snapshots and checkpoint_last.pt. `save_last` writes
checkpoint_last.pt alone (train.checkpoint_every, Ctrl-C). A checkpoint holds all a resumed run
needs: weights, optimizer, config, tokenizer, every process's RNG state and the `TrainState`.

Tested in tests/training/test_run.py, test_resume.py and test_kill_points.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING

from attn_mt import checkpoint
from attn_mt.device import rng_state
from attn_mt.training.progress import write
from attn_mt.training.resume import optimizer_state
from attn_mt.training.stops import Stop
from attn_mt.training.validation import SHOWN, validate

if TYPE_CHECKING:
    from attn_mt.training.start import Training


def checkpoint_state(run: Training, rngs: list[dict]) -> dict:
    """What checkpoint_last.pt holds: weights, optimizer, config, tokenizer, every rank's RNG,
    TrainState."""
    st, tr = run.state, run.trainer
    st.elapsed_s = run.elapsed()
    weights, trained = tr.model.state_dict(), {}
    if tr.ema is not None:  # the average is the model; a resumed run goes on from the trained ones
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
    """Every rank calls it; rank 0 validates, logs and saves. Returns `reason`, or early
    stopping's."""
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
    """Validation into metrics.jsonl, the log and TensorBoard; checkpoint_best/last and the kept
    snapshots. Returns `reason` or early stopping's, recorded in the checkpoints
    (`TrainState.stopped`)."""
    st, tc, tr = run.state, run.cfg.train, run.trainer
    with tr.evaluated():
        metrics = validate(tr.model, run.corpus, run.cfg, tr.device, tr.precision)
        if run.board is not None:
            run.board.attention(st.step, tr.model, run.corpus.tok,
                                run.corpus.text[run.cfg.data.splits.valid][0][0], run.cfg.decode,
                                tr.device)
        record = write_metrics(run, metrics)
        for o in run.observers:  # after the metrics record, before the checkpoints (rundir.py)
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
        run.files.keep_weights(state)  # before last too; the oldest goes after it
    checkpoint.save(state, run.files.last)
    if tc.keep_last:
        run.files.trim_snapshots(st.step, tc.keep_last)
    return reason


def write_metrics(run: Training, metrics: dict[str, float]) -> dict:
    """The one writer of an evaluation's `metrics` (validation.SHOWN says how each shows): its
    metrics.jsonl record (returned), its log line and its TensorBoard scalars (valid/<name>)."""
    st, shown = run.state, {name: SHOWN[name] for name in metrics}
    loss = st.train_loss  # the last progress report's; before one, this window's
    if math.isnan(loss) and st.window_tokens:
        loss = st.window_loss / st.window_tokens
    record = {"step": st.step, "epoch": st.epoch, "train_loss": round(loss, 4),
              **{name: value if digits is None else round(value, digits)
                 for (name, value), (_, _, digits) in zip(metrics.items(), shown.values(),
                                                          strict=True)},
              "lr": run.trainer.opt.param_groups[0]["lr"], "skipped_steps": st.skipped_steps,
              "tokens_per_s": round(run.tokens_per_s, 1), "elapsed_s": round(run.elapsed(), 1)}
    run.files.append_metrics(record)
    write(f"step {st.step} epoch {st.epoch}: " + ", ".join(
        f"{label} {metrics[name]:{form}}" for name, (label, form, _) in shown.items()))
    if run.board is not None:
        run.board.scalars(st.step, "valid", {name.removeprefix("valid_"): value
                                             for name, value in metrics.items()})
    return record
