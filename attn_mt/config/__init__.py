"""Typed, frozen experiment configs: YAML -> dotted overrides -> validated dataclasses.

Defaults live here; a YAML file only overrides them. Every key a user can write is a
field below, and every field is checked for its type and range when the config is built.
yamlconf.py reads YAML and builds dataclasses (nothing attn-mt specific); compare_rnn.py reads
compare-rnn's file of shared and per-model sections. May import nothing of attn_mt.

One job: the experiment config's schema and checks (YAML is yamlconf.py's, files files.py's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml

from attn_mt.config.yamlconf import ConfigError, build, read_yaml, set_overrides

# Upper bounds far above any sensible value: an impossible size fails when the config is built,
# before any data is read, not later as a traceback or out of memory. (Lower bounds: __post_init__.)
MOST: dict[str, dict[str, float]] = {
    "data": {"max_len": 100_000, "toy_size": 100_000_000, "toy_seed": 2**32 - 1},
    "tokenizer": {"vocab_size": 1_000_000},
    "model": {"d_model": 16_384, "n_heads": 1024, "n_layers": 256, "d_ff": 131_072, "max_positions": 1_000_000,
              "d_embed": 16_384, "d_hidden": 16_384, "d_attn": 16_384},
    "train": {"lr": 10.0, "warmup_steps": 1e9, "weight_decay": 10.0, "z_loss": 10.0, "batch_tokens": 10_000_000,
              "accum_steps": 100_000, "clip_norm": 1e6, "max_epochs": 1_000_000, "max_steps": 1e12, "max_tokens": 1e15,
              "max_minutes": 1e7, "eval_every": 1e12, "bleu_sentences": 10_000_000, "patience": 1e6,
              "checkpoint_every": 1e12, "keep_last": 1000, "max_bad_steps": 1e6, "log_every": 1e12,
              "threads": 4096, "seed": 2**32 - 1},
    "decode": {"beam_size": 1000, "nbest": 1000, "alpha": 100.0, "max_len_a": 1000.0, "max_len_b": 1_000_000,
               "batch_size": 1_000_000},
    "compare": {"budget_minutes": 1e6, "eval_every_minutes": 1e6, "lengths": 1_000_000,
                "length_batch_tokens": 10_000_000, "repeats": 10_000, "decode_sentences": 10_000_000,
                "decode_repeats": 10_000, "beam_size": 1000},
}


def check_limits(section: str, cfg: Any) -> None:
    """Every number of a section finite and at most its bound in MOST."""
    most = MOST.get(section, {})
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        numbers = value if isinstance(value, tuple) else (value,)
        for x in numbers:
            if isinstance(x, float) and not math.isfinite(x):
                raise ConfigError(f"{section}.{f.name}={x}: must be a finite number")
            if f.name in most and isinstance(x, (int, float)) and x > most[f.name]:
                raise ConfigError(f"{section}.{f.name}={x}: must be at most {most[f.name]:g}")


@dataclass(frozen=True)
class SplitsConfig:
    train: str = "train"
    valid: str = "valid"
    test: str = "test"


@dataclass(frozen=True)
class DataConfig:
    source: Literal["files", "jsonl", "hf", "toy"] = "toy"
    dir: str = ""  # files: {dir}/{split}.{lang}; jsonl: {dir}/{split}.jsonl; hf: local dataset dir
    name: str = ""  # hf: hub name (used when dir is empty)
    hf_config: str = ""  # hf: dataset config name, e.g. "de-en"
    src_lang: str = "de"
    tgt_lang: str = "en"
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    max_len: int = 100  # training pairs with more tokens on either side are dropped
    toy_size: int = 12000  # toy: number of training pairs
    toy_seed: int = 0
    toy_variant: Literal["", "pronoun"] = ""  # toy: "" the default corpus, or the pronoun task (data/pronoun.py)
    cache_dir: str = ""  # tokenized training data, keyed by a fingerprint of data and tokenizer, shared by runs
    #                      and `attn-mt prepare`; "": $ATTN_MT_CACHE, else ~/.cache/attn_mt (docs/data.md)
    num_proc: int = 0  # processes that tokenize the training split into the cache; 0: one per core

    def __post_init__(self) -> None:
        check_limits("data", self)
        if not 0 <= self.num_proc <= 1024:
            raise ConfigError(f"data.num_proc={self.num_proc}: must be in [0, 1024]")
        if self.max_len < 1:
            raise ConfigError(f"data.max_len={self.max_len}: must be >= 1")
        if self.source in ("files", "jsonl") and not self.dir:
            raise ConfigError(f"data.dir: required when data.source={self.source}")
        if self.source == "hf" and not (self.dir or self.name):
            raise ConfigError("data.name or data.dir: one is required when data.source=hf")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
        if self.toy_seed < 0:
            raise ConfigError(f"data.toy_seed={self.toy_seed}: must be >= 0")
        if self.toy_size < 10:
            raise ConfigError(f"data.toy_size={self.toy_size}: must be >= 10")


@dataclass(frozen=True)
class TokenizerConfig:
    type: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages (allows full embedding tying)
    character_coverage: float = 1.0
    sample_sentences: int = 1_000_000  # SentencePiece trains on at most this many sentences per model (a fixed
    #                                    random sample of the training pairs; all of them in a smaller corpus)

    def __post_init__(self) -> None:
        check_limits("tokenizer", self)
        if not 1_000 <= self.sample_sentences <= 100_000_000:
            raise ConfigError(f"tokenizer.sample_sentences={self.sample_sentences}: must be in [1000, 1e8]")
        if self.vocab_size < 16:
            raise ConfigError(f"tokenizer.vocab_size={self.vocab_size}: must be >= 16")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise ConfigError("tokenizer.character_coverage must be in [0.9, 1.0]")


@dataclass(frozen=True)
class TransformerConfig:
    kind: Literal["transformer"] = "transformer"
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 3  # encoder and decoder layers each
    d_ff: int = 1024
    dropout: float = 0.1  # on embeddings and on each sublayer's output before the residual sum
    attention_dropout: float | None = None  # on attention weights; None: same as dropout
    activation_dropout: float | None = None  # after the feed-forward ReLU; None: same as dropout
    norm_first: bool = True  # pre-norm (True) or post-norm as in the original paper
    tie_embeddings: bool = True
    max_positions: int = 256
    attention: Literal["sdpa", "reference"] = "sdpa"
    size: Literal["fixed", "auto"] = "fixed"  # auto: with train.max_minutes (else ignored), the run times a
    #     ladder of shapes on this machine and trains the one the budget trains best (d_model, n_heads, n_layers,
    #     d_ff, train.batch_tokens and warmup_steps are then chosen; attn_mt/training/autosize.py)
    activation: Literal["relu", "swish", "gelu", "relu2", "swiglu"] = "relu"  # of the feed-forward layers (swish =
    #     SiLU, relu2 = relu(x)^2, swiglu = a gated layer with 2/3 d_ff hidden features); MarianMT models use swish
    zero_init: bool = False  # start the output projections of attention and feed-forward layers at zero
    qk_norm: bool = False  # RMS-normalise each head's queries and keys before q . k (QK-norm)
    norm: Literal["layer", "rms"] = "layer"  # LayerNorm or RMSNorm around the sublayers
    # what MarianMT (opus-mt) models need (export/marian.py sets them; the defaults are our own models):
    positions: Literal["interleaved", "halves", "rotary", "learned"] = "interleaved"  # the sinusoid table: sin
    #     and cos alternating dimensions (ours), or sin in the first half and cos in the second (Marian's); rotary:
    #     no table, self-attention turns queries and keys by their positions (RoPE); learned: a trained table
    #     per side (source, target), as in convolutional seq2seq and BERT
    output_bias: bool = False  # a fixed bias added to the logits (Marian's final_logits_bias), not trained
    banned_ids: tuple[int, ...] = ()  # target ids never generated (Marian's pad, its decoder start)

    def __post_init__(self) -> None:
        check_limits("model", self)
        for key in ("d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}"
            )
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            p = getattr(self, key)
            if p is not None and not 0.0 <= p < 1.0:
                raise ConfigError(f"model.{key}={p}: must be in [0, 1)")
        if self.positions == "halves" and self.d_model % 2:
            raise ConfigError(f"model.d_model={self.d_model}: must be even with model.positions=halves")
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"model.d_model / model.n_heads={self.d_model // self.n_heads}: must be even with "
                              "model.positions=rotary")
        if any(i < 0 for i in self.banned_ids):
            raise ConfigError(f"model.banned_ids={list(self.banned_ids)}: must be token ids >= 0")

    @property
    def dropouts(self) -> tuple[float, float, float]:
        """(residual and embedding, attention weights, feed-forward activation) dropout rates."""
        attn, act = self.attention_dropout, self.activation_dropout
        return self.dropout, self.dropout if attn is None else attn, self.dropout if act is None else act


@dataclass(frozen=True)
class RNNConfig:
    """Encoder-decoder RNN with additive attention (Bahdanau et al. 2015), the baseline of compare-rnn."""

    kind: Literal["rnn"] = "rnn"
    d_embed: int = 256  # embeddings, and the pre-output layer (so the output can be tied)
    d_hidden: int = 256  # encoder state per direction, and the decoder state
    d_attn: int = 256  # hidden size of the additive attention
    cell: Literal["gru", "lstm"] = "gru"  # encoder cell; the decoder is a GRU
    n_layers: int = 1  # encoder and decoder layers each
    dropout: float = 0.1
    tie_embeddings: bool = True
    max_positions: int = 256  # longest source / output in tokens (the RNN itself has no limit)

    def __post_init__(self) -> None:
        check_limits("model", self)
        for key in ("d_embed", "d_hidden", "d_attn", "n_layers", "max_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: must be in [0, 1)")


ModelConfig = TransformerConfig | RNNConfig


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 1000
    schedule: Literal["inverse_sqrt", "linear", "wsd"] = "inverse_sqrt"  # after warmup: lr * sqrt(warmup / step);
    #     linear decay to 0 at the end of the budget (max_steps, max_tokens, max_minutes or max_epochs, the first to
    #     end); or wsd (warmup-stable-decay): the peak rate, then linear decay to 0 over the last decay_fraction
    decay_fraction: float = 0.3  # wsd: the share of the budget over which the rate decays to 0
    warmup_fraction: float = 0.1  # linear: warmup ends after warmup_steps or this fraction of the budget,
    #     whichever comes first, so a short budget still gets a whole schedule; 0: warmup_steps alone
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    optimizer: Literal["adamw", "muon"] = "adamw"  # muon: the 2-D weights of the layers are updated with Muon
    #     (momentum orthogonalised by Newton-Schulz, attn_mt/training/muon.py), the rest (embeddings, norms,
    #     biases) with AdamW; both at the scheduled rate
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5  # Newton-Schulz iterations per step (their cost is per step, not per token)
    muon_ns_schedule: Literal["fixed", "polar"] = "fixed"  # their coefficients: Jordan et al.'s quintic at every
    #     iteration, or the Polar Express sequence, one per iteration (at most 5; attn_mt/training/muon.py)
    muon_per_head: bool = False  # orthogonalise each attention head's slice of the Q/K/V and output projections
    #     on its own: a fifth of those projections' Newton-Schulz time in fp32 (docs/speedrun.md)
    label_smoothing: float = 0.1
    subword_sampling: float = 0.0  # subword regularisation: each training source sentence split anew each time it
    #     is batched (SentencePiece sampling: the BPE-dropout rate of a bpe model, a unigram model's alpha); 0: off.
    #     Targets keep their one segmentation (what the model learns to write, and the tokens the budget counts)
    z_loss: float = 0.0  # add z_loss * log(Z)^2 per target token to the training loss (1e-4 in PaLM); 0: off
    batch_tokens: int = 4096  # target tokens per optimizer step (before accumulation)
    accum_steps: int = 1
    clip_norm: float = 1.0  # 0 disables clipping
    ema_decay: float = 0.0  # evaluate and save a moving average of the weights (0.99: about the last 100
    #                         steps; attn_mt/training/ema.py); 0: the trained weights themselves
    max_epochs: int = 20
    max_steps: int = 0  # 0: no limit
    max_tokens: int = 0  # target tokens to train on (the run stops after the step that reaches it); 0: no limit
    max_minutes: float = 0.0  # wall-clock budget; 0: no limit
    seed: int = 1
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    eval_every: int = 0  # steps between evaluations; 0: once per epoch
    bleu_sentences: int = 500  # validation sentences decoded for BLEU at each evaluation
    patience: int = 0  # stop after this many evaluations without a better BLEU; 0: off
    checkpoint_every: int = 0  # also save checkpoint_last.pt every N steps; 0: only at evals
    keep_last: int = 0  # keep the weights of the last N evaluations (checkpoint_step*.pt); N >= 2 also
    #                     averages them at the end and tests the average if it wins on valid
    max_bad_steps: int = 5  # non-finite losses are skipped; this many in a row stop the run
    log_every: int = 20  # steps between progress-bar updates (each one syncs the device)
    threads: int = 0  # torch intra-op threads on CPU; 0: torch's default
    tensorboard: bool = False  # TensorBoard events under <run_dir>/tensorboard (needs the `tb` extra)
    init_from: str = ""  # fine-tune: start from this model's weights (a checkpoint, or a MarianMT folder or hub
    #     name), with its tokenizer and shape (model and tokenizer sections are taken from it), a fresh optimizer
    #     and schedule; "": from scratch
    freeze: tuple[Literal["embeddings", "encoder"], ...] = ()  # parts not trained: the embedding tables (and the
    #     output layer tied to them), the encoder layers
    compile: bool = False  # torch.compile the training forward/backward (`attn-mt bench --compile`
    #                        measures whether it pays: on the 2-core CPU it did not, README Performance)

    def __post_init__(self) -> None:
        check_limits("train", self)
        positive = ("lr", "batch_tokens", "accum_steps", "max_epochs", "bleu_sentences")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key}={getattr(self, key)}: must be > 0")
        nonneg = ("warmup_steps", "weight_decay", "z_loss", "clip_norm", "max_steps", "max_tokens", "max_minutes",
                  "eval_every", "patience", "checkpoint_every", "keep_last", "threads", "seed")
        for key in nonneg:
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}={getattr(self, key)}: must be >= 0")
        if not 0.0 <= self.warmup_fraction <= 1.0:
            raise ConfigError(f"train.warmup_fraction={self.warmup_fraction}: must be in [0, 1]")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"train.decay_fraction={self.decay_fraction}: must be in (0, 1]")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(f"train.muon_momentum={self.muon_momentum}: must be in [0, 1)")
        if not 1 <= self.muon_ns_steps <= 20:
            raise ConfigError(f"train.muon_ns_steps={self.muon_ns_steps}: must be in [1, 20]")
        if self.muon_ns_schedule == "polar" and self.muon_ns_steps > 5:
            raise ConfigError(f"train.muon_ns_steps={self.muon_ns_steps}: the polar schedule has at most 5")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay={self.ema_decay}: must be in [0, 1)")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing}: must be in [0, 1)")
        if not 0.0 <= self.subword_sampling < 1.0:
            raise ConfigError(f"train.subword_sampling={self.subword_sampling}: must be in [0, 1)")
        if self.log_every < 1:
            raise ConfigError(f"train.log_every={self.log_every}: must be >= 1")
        if self.max_bad_steps < 1:
            raise ConfigError(f"train.max_bad_steps={self.max_bad_steps}: must be >= 1")
        if len(set(self.freeze)) != len(self.freeze):
            raise ConfigError(f"train.freeze={list(self.freeze)}: names a part twice")


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 1  # 1: greedy
    alpha: float = 0.6  # length penalty exponent
    length_norm: Literal["gnmt", "power"] = "gnmt"  # beam scores are log P / ((5 + |Y|) / 6) ** alpha (GNMT), or
    #     log P / |Y| ** alpha (power: transformers' length_penalty, what MarianMT models are decoded with)
    nbest: int = 1
    max_len_a: float = 1.5  # maximum output length = a * source length + b
    max_len_b: int = 10
    batch_size: int = 64

    def __post_init__(self) -> None:
        check_limits("decode", self)
        for key in ("beam_size", "nbest", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"decode.{key}={getattr(self, key)}: must be >= 1")
        if self.nbest > self.beam_size:
            raise ConfigError(f"decode.nbest={self.nbest} exceeds decode.beam_size={self.beam_size}")
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ConfigError("decode.max_len_a must be >= 0 and decode.max_len_b >= 1")

    @property
    def penalty(self) -> float | Penalty:
        """What beam.length_penalty takes: alpha (GNMT) or a Penalty (another form)."""
        return self.alpha if self.length_norm == "gnmt" else Penalty(self.alpha, self.length_norm)


@dataclass(frozen=True)
class DecodeOption:
    """A decode setting a caller may give, defined once: its DecodeConfig field (`key`), its name as an argument
    of the API (`Model.options`, `Model.translate`) and as a field of serve's requests (`arg`), whether serve's
    requests take it, and what it means. The CLI's options, the API's
    arguments, serve's request fields and the page's controls are derived from or tested against this table
    (tests/decoding/test_decode_options.py); public as `attn_mt.DECODE_OPTIONS`."""

    key: str
    arg: str
    served: bool
    help: str


DECODE_OPTIONS = (
    DecodeOption("beam_size", "beam", True, "Beam size; 1 is greedy"),
    DecodeOption("alpha", "alpha", True, "Length penalty exponent"),
    DecodeOption("nbest", "nbest", True, "Hypotheses per sentence, at most the beam size"),
    DecodeOption("batch_size", "batch_size", False, "Sentences per batch"),
    DecodeOption("max_len_a", "max_len_a", False, "Output length limit a x source length + b: its a"),
    DecodeOption("max_len_b", "max_len_b", False, "Output length limit a x source length + b: its b"),
)
OPTION = {o.key: o for o in DECODE_OPTIONS}
ARGS = {o.key: o.arg for o in DECODE_OPTIONS}  # DecodeConfig field -> the API's argument


class Penalty(NamedTuple):
    """A length penalty exponent and its form (beam.length_penalty)."""

    alpha: float
    form: str


@dataclass(frozen=True)
class CompareConfig:
    """The `compare:` section of compare-rnn's config: budget and what is measured after training."""

    budget_minutes: float = 10.0  # training time per model, on its own clock
    eval_every_minutes: float = 1.0  # one validation-BLEU point per this much training time
    lengths: tuple[int, ...] = (8, 16, 32, 64, 128, 256)  # length-scaling benchmark
    length_batch_tokens: int = 4096  # tokens per batch there: batch size = tokens // length
    repeats: int = 5  # timed rounds per length (median reported)
    decode_sentences: int = 500  # test sentences decoded in the speed measurement
    decode_repeats: int = 3
    beam_size: int = 4  # beam of the decoding-speed measurement
    max_param_gap: float = 0.15  # refuse models whose parameter counts differ by more (fairness)

    def __post_init__(self) -> None:
        check_limits("compare", self)
        for key in ("budget_minutes", "eval_every_minutes", "length_batch_tokens", "repeats",
                    "decode_sentences", "decode_repeats", "beam_size", "max_param_gap"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"compare.{key}={getattr(self, key)!r}: must be a number > 0")
        if not self.lengths or not all(n > 0 for n in self.lengths):
            raise ConfigError(f"compare.lengths={list(self.lengths)}: must be positive integers")


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=TransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Plain nested dict (tuples as lists): what goes into config.yaml and checkpoints."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return plain(asdict(cfg))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    from attn_mt.config.files import write_atomic

    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """Build and validate a config from a nested dict (e.g. the one stored in a checkpoint)."""
    return build(ExperimentConfig, raw, "")


def load_config(path: Path | str | None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read YAML (safe loader), apply `section.key=value` overrides, build and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_yaml(Path(path))
        raw.setdefault("name", Path(path).stem)
    set_overrides(raw, overrides)
    try:
        return from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path is not None else str(e)) from None
