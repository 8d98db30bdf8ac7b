"""The `model:` section: a Transformer's or the RNN baseline's shape (which one: `kind`).

Tested in tests/config/test_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attn_mt.config.yamlconf import ConfigError, check_limits

# upper bounds far above any sensible value, of either kind (lower bounds: __post_init__)
MOST = {"d_model": 16_384, "n_heads": 1024, "n_layers": 256, "d_ff": 131_072,
        "max_positions": 1_000_000, "d_embed": 16_384, "d_hidden": 16_384, "d_attn": 16_384}


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
    size: Literal["fixed", "auto"] = "fixed"  # auto: with train.max_minutes (else ignored), the
    #     run times a ladder of shapes on this machine and trains the one the budget trains best
    #     (d_model, n_heads, n_layers, d_ff, train.batch_tokens, warmup_steps; autosize.py)
    activation: Literal["relu", "swish", "gelu", "relu2", "swiglu"] = "relu"  # the feed-forward's
    #     (swish = SiLU, relu2 = relu(x)^2, swiglu = a gated layer with 2/3 d_ff hidden features)
    zero_init: bool = False  # attention and feed-forward output projections start at zero
    qk_norm: bool = False  # RMS-normalise each head's queries and keys before q . k (QK-norm)
    norm: Literal["layer", "rms"] = "layer"  # LayerNorm or RMSNorm around the sublayers
    positions: Literal["interleaved", "rotary", "learned"] = "interleaved"  # interleaved:
    #     sinusoids, sin and cos in alternating dimensions; rotary: no table, self-attention turns
    #     queries and keys by their positions (RoPE); learned: a trained table per side, as in BERT

    def __post_init__(self) -> None:
        check_limits("model", self, MOST)
        for key in ("d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1", f"model.{key}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by "
                              f"model.n_heads={self.n_heads}", "model.d_model")
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            p = getattr(self, key)
            if p is not None and not 0.0 <= p < 1.0:
                raise ConfigError(f"model.{key}={p}: must be in [0, 1)", f"model.{key}")
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"model.d_model / model.n_heads={self.d_model // self.n_heads}: must "
                              "be even with model.positions=rotary", "model.d_model")

    @property
    def dropouts(self) -> tuple[float, float, float]:
        """(residual and embedding, attention weights, feed-forward activation) dropout rates."""
        attn, act = self.attention_dropout, self.activation_dropout
        p = self.dropout
        return p, p if attn is None else attn, p if act is None else act


@dataclass(frozen=True)
class RNNConfig:
    """Encoder-decoder RNN with additive attention (Bahdanau et al. 2015): compare-rnn's."""

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
        check_limits("model", self, MOST)
        for key in ("d_embed", "d_hidden", "d_attn", "n_layers", "max_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1", f"model.{key}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: must be in [0, 1)", "model.dropout")


ModelConfig = TransformerConfig | RNNConfig
