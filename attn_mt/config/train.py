"""The `train:` section: optimiser, schedule, batches, budget, evaluation and checkpoints of a run.

Tested in tests/config/test_config.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from attn_mt.config.yamlconf import ConfigError, check_limits

# upper bounds far above any sensible value (lower bounds: __post_init__)
MOST = {"lr": 10.0, "warmup_steps": 1e9, "weight_decay": 10.0, "z_loss": 10.0,
        "guided_weight": 1000.0, "batch_tokens": 10_000_000, "accum_steps": 100_000,
        "clip_norm": 1e6,
        "max_epochs": 1_000_000, "max_steps": 1e12, "max_tokens": 1e15, "max_minutes": 1e7,
        "eval_every": 1e12, "bleu_sentences": 10_000_000, "patience": 1e6, "checkpoint_every": 1e12,
        "keep_last": 1000, "max_bad_steps": 1e6, "log_every": 1e12, "threads": 4096,
        "seed": 2**32 - 1, "length_buckets": 1_000_000}


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 1000
    # after warmup: lr * sqrt(warmup / step);
    schedule: Literal["inverse_sqrt", "linear", "wsd"] = "inverse_sqrt"
    #     linear decay to 0 at the end of the budget (max_steps, max_tokens, max_minutes or
    #     max_epochs, the first to
    #     end); or wsd (warmup-stable-decay): the peak rate, then linear decay to 0 over the last
    #     decay_fraction
    decay_fraction: float = 0.3  # wsd: the share of the budget over which the rate decays to 0
    # linear: warmup ends after warmup_steps or this fraction of the budget,
    warmup_fraction: float = 0.1
    #     whichever comes first, so a short budget still gets a whole schedule; 0: warmup_steps
    #     alone
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    # muon: the 2-D weights of the layers are updated with Muon
    optimizer: Literal["adamw", "muon"] = "adamw"
    #     (momentum orthogonalised by Newton-Schulz, attn_mt/training/muon.py), the rest
    #     (embeddings, norms,
    #     biases) with AdamW; both at the scheduled rate
    muon_momentum: float = 0.95
    # Newton-Schulz iterations per step (their cost is per step, not per token)
    muon_ns_steps: int = 5
    # their coefficients: Jordan et al.'s quintic at every
    muon_ns_schedule: Literal["fixed", "polar"] = "fixed"
    #     iteration, or the Polar Express sequence, one per iteration (at most 5;
    #     attn_mt/training/muon.py)
    # orthogonalise each attention head's slice of the Q/K/V and output projections
    muon_per_head: bool = False
    #     on its own: a fifth of those projections' Newton-Schulz time in fp32 (docs/speedrun.md)
    label_smoothing: float = 0.1
    # subword regularisation: each training source sentence split anew each time it
    subword_sampling: float = 0.0
    #     is batched (data/sampling.py, drawn from (seed, epoch, batch) alone: the BPE-dropout rate
    #     of a bpe
    #     model, a unigram model's alpha); 0: off.
    #     Targets keep their one segmentation (what the model learns to write, and the tokens the
    #     budget counts)
    # add z_loss * log(Z)^2 per target token to the training loss (1e-4 in PaLM); 0: off
    z_loss: float = 0.0
    # guided alignment (Garg et al. 2019; attn_mt/training/guided.py): a Pharaoh file of word links
    # of the training pairs (`i-j`, line i for pair i, words the whitespace tokens) that one
    # cross-attention head learns to match; "": off
    guided_alignment: str = ""
    guided_weight: float = 0.05  # the alignment loss's weight beside the token loss (lambda)
    guided_head: str = ""  # headL.H (from 1) that is guided; "": the last layer's head 1
    batch_tokens: int = 4096  # target tokens per optimizer step (before accumulation)
    accum_steps: int = 1
    clip_norm: float = 1.0  # 0 disables clipping
    # evaluate and save a moving average of the weights (0.99: about the last 100 steps;
    # attn_mt/training/ema.py); 0: the trained weights themselves
    ema_decay: float = 0.0
    max_epochs: int = 20
    max_steps: int = 0  # 0: no limit
    # target tokens to train on (the run stops after the step that reaches it); 0: no limit
    max_tokens: int = 0
    max_minutes: float = 0.0  # wall-clock budget; 0: no limit
    seed: int = 1
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    eval_every: int = 0  # steps between evaluations; 0: once per epoch
    bleu_sentences: int = 500  # validation sentences decoded for BLEU at each evaluation
    patience: int = 0  # stop after this many evaluations without a better BLEU; 0: off
    checkpoint_every: int = 0  # also save checkpoint_last.pt every N steps; 0: only at evals
    # keep the weights of the last N evaluations (checkpoint_step*.pt); N >= 2 also averages them at
    # the end and tests the average if it wins on valid
    keep_last: int = 0
    max_bad_steps: int = 5  # non-finite losses are skipped; this many in a row stop the run
    log_every: int = 20  # steps between progress-bar updates (each one syncs the device)
    # where a step's non-finite check and the run's
    skip_check: Literal["auto", "device", "host"] = "auto"
    #     counters live. host: the loss and gradient norm are read after every step (one device sync
    #     per step).
    #     device: a non-finite step's update (optimizer, Muon, EMA) is undone on the device, and the
    #     loss sum,
    #     steps, tokens and skipped steps are read only to log, evaluate, checkpoint or stop (every
    #     log_every
    #     steps at most): no sync per step. The schedule then counts attempted steps, a skipped one
    #     included
    #     (host: a skipped step is retried at the same rate); max_bad_steps is checked at those
    #     reads, so a run
    #     of bad steps stops up to log_every steps later (attn_mt/training/deferred.py). auto:
    #     device on CUDA,
    #     host elsewhere (both give the same weights, bit for bit, while every step is finite)
    threads: int = 0  # torch intra-op threads on CPU; 0: torch's default
    # TensorBoard events under <run_dir>/tensorboard (needs the `tb` extra)
    tensorboard: bool = False
    # at step 0 (a fresh run's untrained model) and every evaluation, every head's
    record_attention: bool = True
    #     attention on a few fixed sentences (validation pairs, the pronoun variant's contrastive
    #     items, the classic
    #     "it was too tired"), with its role statistics, entropy and coreference score, into
    #     <run_dir>/attention_history.npz (attn_mt.history(run_dir); attn_mt/analysis/history.py);
    #     the trained
    #     weights are the same either way. Only `attn_mt.train` and `attn-mt train`/`compare-rnn`
    #     record
    # fine-tune: start from this model's weights (a checkpoint, or a MarianMT folder or hub
    init_from: str = ""
    #     name), with its tokenizer and shape (model and tokenizer sections are taken from it), a
    #     fresh optimizer
    #     and schedule; "": from scratch
    # parts not trained: the embedding tables (and the
    freeze: tuple[Literal["embeddings", "encoder"], ...] = ()
    #     output layer tied to them), the encoder layers
    # torch.compile the training forward/backward (bench's `compile` argument measures whether it
    # pays: on the 2-core CPU it did not, README Performance)
    compile: bool = False
    # with compile on CUDA: mode "reduce-overhead", each step's kernels replayed as one
    cuda_graphs: bool = False
    #     CUDA graph per batch shape (length_buckets: one graph per bucket); ignored on CPU
    # pad each training batch to the first of these widths (tokens, eos/bos
    length_buckets: tuple[int, ...] = ()
    #     included, at most model.max_positions) that holds it, and to the most rows batch_tokens
    #     hold at that
    #     width: one static shape per bucket, compiled or captured once. The epoch's plan counts
    #     each batch at its
    #     bucket's width, so a padded batch stays within batch_tokens; the loss is that of the
    #     plan's batches
    #     (added rows and columns predict nothing; dropout draws differ; attn_mt/data/arrays.py's
    #     to_bucket)
    #     (): each batch as wide as its longest sentence

    def __post_init__(self) -> None:
        check_limits("train", self, MOST)
        positive = ("lr", "batch_tokens", "accum_steps", "max_epochs", "bleu_sentences")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key}={getattr(self, key)}: must be > 0", f"train.{key}")
        nonneg = ("warmup_steps", "weight_decay", "z_loss", "guided_weight", "clip_norm",
                  "max_steps", "max_tokens", "max_minutes", "eval_every", "patience",
                  "checkpoint_every", "keep_last", "threads", "seed")
        for key in nonneg:
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}={getattr(self, key)}: must be >= 0", f"train.{key}")
        if not 0.0 <= self.warmup_fraction <= 1.0:
            raise ConfigError(f"train.warmup_fraction={self.warmup_fraction}: must be in [0, 1]",
                              "train.warmup_fraction")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"train.decay_fraction={self.decay_fraction}: must be in (0, 1]",
                              "train.decay_fraction")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(f"train.muon_momentum={self.muon_momentum}: must be in [0, 1)",
                              "train.muon_momentum")
        if not 1 <= self.muon_ns_steps <= 20:
            raise ConfigError(f"train.muon_ns_steps={self.muon_ns_steps}: must be in [1, 20]",
                              "train.muon_ns_steps")
        if self.muon_ns_schedule == "polar" and self.muon_ns_steps > 5:
            raise ConfigError(f"train.muon_ns_steps={self.muon_ns_steps}: the polar schedule has "
                              "at most 5", "train.muon_ns_steps")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay={self.ema_decay}: must be in [0, 1)",
                              "train.ema_decay")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing}: must be in [0, 1)",
                              "train.label_smoothing")
        if not 0.0 <= self.subword_sampling < 1.0:
            raise ConfigError(f"train.subword_sampling={self.subword_sampling}: must be in [0, 1)",
                              "train.subword_sampling")
        if self.log_every < 1:
            raise ConfigError(f"train.log_every={self.log_every}: must be >= 1", "train.log_every")
        if self.max_bad_steps < 1:
            raise ConfigError(f"train.max_bad_steps={self.max_bad_steps}: must be >= 1",
                              "train.max_bad_steps")
        if (any(w < 2 for w in self.length_buckets)
            or list(self.length_buckets) != sorted(set(self.length_buckets))):
            raise ConfigError(f"train.length_buckets={list(self.length_buckets)}: must be "
                              "increasing widths >= 2", "train.length_buckets")
        if self.guided_head and not re.fullmatch(r"head[1-9]\d*\.[1-9]\d*", self.guided_head):
            raise ConfigError(f"train.guided_head={self.guided_head!r}: expected headL.H, layer "
                              "L's head H counted from 1 (e.g. head2.1), or \"\"",
                              "train.guided_head")
        if len(set(self.freeze)) != len(self.freeze):
            raise ConfigError(f"train.freeze={list(self.freeze)}: names a part twice",
                              "train.freeze")
