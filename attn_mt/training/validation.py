"""Evaluation while training, over a `Corpus`: validation loss, greedy validation BLEU (`validate`,
which leaves the RNG as it was) and the test split's scores at the end; the `Observer`s an
evaluation calls."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch

from attn_mt.config import ExperimentConfig
from attn_mt.data.batching import Batch, token_batches
from attn_mt.data.corpus import Corpus
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.metrics import bleu, score
from attn_mt.decoding.translate import translate
from attn_mt.device import autocast, rng_state, set_rng_state
from attn_mt.models import Seq2Seq, mean_loss


class Observer(Protocol):
    """What watches a run's evaluations, on rank 0 (`train(..., observers=...)`, compare-rnn's
    models): the API passes analysis/history.py's Recorder (RUN/attention_history.npz), which
    training may not import."""

    def rewind(self, step: int, corpus: Corpus, cfg: ExperimentConfig, model: Seq2Seq) -> None:
        """The run starts (step 0) or resumes from its checkpoint of `step`: what was observed after
        that step goes (it is observed again); `corpus` and `cfg` are the run's, final; `model`
        holds the weights the run goes on from (at step 0: before any training step), to be left as
        on_evaluation leaves them."""

    def on_evaluation(self, step: int, model: Seq2Seq, tokenizer: Tokenizer, metrics: dict) -> None:
        """Right after validation at `step` (before the checkpoints are written), the evaluated
        weights in `model` and the evaluation's record in `metrics` (valid_bleu, ...); it leaves the
        weights, the model's mode and every random stream as they were."""


def validation_loss(model: Seq2Seq, corpus: Corpus, split: str, batch_tokens: int,
                    device: torch.device, precision: str) -> float:
    """Mean per-token cross-entropy (no smoothing) on a split."""
    model.eval()
    index = token_batches(*corpus.lengths(split), batch_tokens, 0, 0, shuffle=False)
    pad_id = corpus.tok.pad_id
    # pairs longer than the model allows are cut, not a crash
    batches = (_fit(batch, model.max_positions, pad_id) for batch in corpus.batches(split, index))
    with autocast(device, precision):
        return mean_loss(model, batches, pad_id, device)


def _fit(batch: Batch, length: int, pad_id: int) -> Batch:
    """At most `length` positions per side (the model's position limit); n_tokens recounted."""
    if max(batch.src.size(1), batch.tgt_in.size(1)) <= length:
        return batch
    tgt_out = batch.tgt_out[:, :length]
    return Batch(batch.src[:, :length], batch.tgt_in[:, :length], tgt_out,
                 int((tgt_out != pad_id).sum()))


def valid_bleu(model: Seq2Seq, corpus: Corpus, cfg: ExperimentConfig, device: torch.device,
               precision: str) -> float:
    """Greedy BLEU on the first train.bleu_sentences sentences of the validation split."""
    src, ref = (x[: cfg.train.bleu_sentences] for x in corpus.text[cfg.data.splits.valid])
    with autocast(device, precision):
        hyps = translate(model, corpus.tok, src, replace(cfg.decode, beam_size=1, nbest=1), device)
    return bleu(hyps, ref)


# What validation measures, by metrics.jsonl key: (its name in the log line, its format there, the
# decimals metrics.jsonl keeps, None: all); TensorBoard shows each as valid/<key without valid_>. A
# new metric is a line here and its value in `validate`.
SHOWN: dict[str, tuple[str, str, int | None]] = {
    "valid_loss": ("valid loss", ".3f", 4),
    "valid_bleu": ("valid BLEU", ".2f", None),
}


def validate(model: Seq2Seq, corpus: Corpus, cfg: ExperimentConfig, device: torch.device,
             precision: str) -> dict[str, float]:
    """The metrics of `SHOWN` by name: validation loss and greedy BLEU on train.bleu_sentences
    sentences; leaves the RNG as it was."""
    rng = rng_state(device)
    metrics = {"valid_loss": validation_loss(model, corpus, cfg.data.splits.valid,
                                             cfg.train.batch_tokens, device, precision),
               "valid_bleu": valid_bleu(model, corpus, cfg, device, precision)}
    set_rng_state(rng, device)
    model.train()
    return metrics


def score_test_split(model: Seq2Seq, corpus: Corpus, cfg: ExperimentConfig, device: torch.device,
                precision: str) -> tuple[list[str], dict]:
    """Translate the test split with the configured decoding; (hypotheses, sacrebleu scores)."""
    test_src, test_ref = corpus.text[cfg.data.splits.test]
    with autocast(device, precision):
        hyps = translate(model, corpus.tok, test_src, cfg.decode, device)
    return hyps, score(hyps, test_ref)
