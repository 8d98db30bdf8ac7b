"""attn-mt's Transformer for Hugging Face `transformers`, shipped inside an exported model folder.

Loaded with `AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)` by people who do
not have attn-mt: this file needs only torch and transformers. It is the model of attn-mt's
`models/transformer.py` (pre- or post-norm, fused Q/K/V projection, sinusoidal positions with sin in
the even and cos in the odd dims, added to embeddings times sqrt(D)), with the `generate()`
interface: greedy and beam search keep keys and values in transformers' `EncoderDecoderCache`.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dh head dim, V vocabulary.

One job: the model a transformers user loads from the folder (attn-mt never imports it).

Tested in tests/export/test_transformers.py (the pre-norm route's outputs equal ours).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

# transformers 5 renamed the cache field `past_key_values` to `cache`; write whichever this version
# has
_CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


class AttnMtConfig(PretrainedConfig):
    model_type = "attn_mt"
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "n_heads",
                     "num_hidden_layers": "n_layers", "vocab_size": "tgt_vocab_size"}

    def __init__(self, src_vocab_size: int = 8000, tgt_vocab_size: int = 8000, d_model: int = 256,
                 n_heads: int = 4, n_layers: int = 3, d_ff: int = 1024, norm_first: bool = True,
                 max_positions: int = 256, share_embeddings: bool = True,
                 tie_word_embeddings: bool = True, pad_token_id: int = 0, bos_token_id: int = 2,
                 eos_token_id: int = 3, decoder_start_token_id: int = 2, **kwargs) -> None:
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.d_model, self.n_heads, self.n_layers, self.d_ff = d_model, n_heads, n_layers, d_ff
        self.norm_first, self.max_positions = norm_first, max_positions
        # one table for source and target (a joint vocabulary)
        self.share_embeddings = share_embeddings
        kwargs.setdefault("is_encoder_decoder", True)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, decoder_start_token_id=decoder_start_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


def sinusoids(max_positions: int, d_model: int) -> Tensor:
    """(L, D) table: sin(pos * f_i) in dim 2i, cos(pos * f_i) in dim 2i+1, f_i = 10000^(-2i/D)."""
    pos = torch.arange(max_positions).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_positions, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return pe


class Attention(nn.Module):
    """Multi-head attention; self-attention projects Q, K, V at once, cross-attention Q and [K;
    V]."""

    def __init__(self, config: AttnMtConfig, layer_idx: int, cross: bool) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads, self.layer_idx, self.cross = config.n_heads, layer_idx, cross
        if cross:
            self.q_proj, self.kv_proj = nn.Linear(d, d), nn.Linear(d, 2 * d)
        else:
            self.qkv_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)

    def _heads(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, T, Dh)

    def forward(self, x: Tensor, context: Tensor | None, mask: Tensor | None,
                cache: EncoderDecoderCache | None = None) -> Tensor:
        """x: (B, T, D); context: (B, S, D) memory for cross-attention; mask: bool, True = may
        attend."""
        if self.cross:
            q = self._heads(self.q_proj(x))
            # memory projected at the first step
            if cache is not None and cache.is_updated.get(self.layer_idx):
                layer = cache.cross_attention_cache.layers[self.layer_idx]
                k, v = layer.keys, layer.values
            else:
                # (B, H, S, Dh)
                k, v = (self._heads(y) for y in self.kv_proj(context).chunk(2, dim=-1))
                if cache is not None:
                    k, v = cache.cross_attention_cache.update(k, v, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        else:
            q, k, v = (self._heads(y) for y in self.qkv_proj(x).chunk(3, dim=-1))
            if cache is not None:  # append the new positions' keys and values to the earlier ones
                k, v = cache.self_attention_cache.update(k, v, self.layer_idx)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
        b, _, t, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class Sublayer(nn.Module):
    """Residual around a sublayer, LayerNorm before it (pre-norm) or after the sum (post-norm)."""

    def __init__(self, config: AttnMtConfig) -> None:
        super().__init__()
        self.norm, self.norm_first = nn.LayerNorm(config.d_model), config.norm_first

    def forward(self, x: Tensor, fn) -> Tensor:
        return x + fn(self.norm(x)) if self.norm_first else self.norm(x + fn(x))


class FeedForward(nn.Sequential):
    # indices 0 and 3 as in attn-mt (Dropout at 2)
    def __init__(self, config: AttnMtConfig) -> None:
        super().__init__(nn.Linear(config.d_model, config.d_ff), nn.ReLU(), nn.Identity(),
                         nn.Linear(config.d_ff, config.d_model))


class EncoderLayer(nn.Module):
    def __init__(self, config: AttnMtConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn, self.ff = Attention(config, layer_idx, cross=False), FeedForward(config)
        self.sub = nn.ModuleList(Sublayer(config) for _ in range(2))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.sub[0](x, lambda y: self.self_attn(y, None, mask))
        return self.sub[1](x, self.ff)


class DecoderLayer(nn.Module):
    def __init__(self, config: AttnMtConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx, cross=False)
        self.cross_attn = Attention(config, layer_idx, cross=True)
        self.ff = FeedForward(config)
        self.sub = nn.ModuleList(Sublayer(config) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor, src_mask: Tensor,
                cache: EncoderDecoderCache | None) -> Tensor:
        x = self.sub[0](x, lambda y: self.self_attn(y, None, self_mask, cache))
        x = self.sub[1](x, lambda y: self.cross_attn(y, memory, src_mask, cache))
        return self.sub[2](x, self.ff)


class Stack(nn.Module):
    """Embeddings (times sqrt(D)) plus positions, the layers, and a final LayerNorm with
    pre-norm."""

    def __init__(self, config: AttnMtConfig, vocab: int, layer: type) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, config.d_model, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(layer(config, i) for i in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()
        self.register_buffer("pe", sinusoids(config.max_positions, config.d_model),
                             persistent=False)
        self.scale = math.sqrt(config.d_model)

    def embed_at(self, ids: Tensor, offset: int = 0) -> Tensor:
        return self.embed(ids) * self.scale + self.pe[offset : offset + ids.size(1)]  # (B, T, D)


class Encoder(Stack):
    main_input_name = "input_ids"

    def __init__(self, config: AttnMtConfig) -> None:
        super().__init__(config, config.src_vocab_size, EncoderLayer)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                **kwargs) -> BaseModelOutput:
        # (B, 1, 1, S)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        x = self.embed_at(input_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return BaseModelOutput(last_hidden_state=self.norm(x))


class Decoder(Stack):
    def __init__(self, config: AttnMtConfig) -> None:
        super().__init__(config, config.tgt_vocab_size, DecoderLayer)

    def forward(self, ids: Tensor, memory: Tensor, src_mask: Tensor | None,
                cache: EncoderDecoderCache | None) -> Tensor:
        """ids: (B, T) new positions (all of them without a cache) -> hidden states (B, T, D)."""
        past = 0 if cache is None else cache.get_seq_length()
        t = ids.size(1)
        # causal
        self_mask = torch.ones(t, past + t, dtype=torch.bool, device=ids.device).tril(past)
        x = self.embed_at(ids, past)
        for layer in self.layers:
            x = layer(x, memory, self_mask, src_mask, cache)
        return self.norm(x)


class AttnMtForConditionalGeneration(PreTrainedModel, GenerationMixin):
    config_class = AttnMtConfig
    base_model_prefix = "attn_mt"
    main_input_name = "input_ids"
    _supports_cache_class = True

    def __init__(self, config: AttnMtConfig) -> None:
        super().__init__(config)
        self.encoder, self.decoder = Encoder(config), Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        tied = {"lm_head.weight": "decoder.embed.weight"} if config.tie_word_embeddings else {}
        if config.share_embeddings:
            tied["encoder.embed.weight"] = "decoder.embed.weight"
        self._tied_weights_keys = tied
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, Stack):  # the position table is a buffer, not in the weights file
            module.pe.copy_(sinusoids(*module.pe.shape))

    def get_encoder(self) -> Encoder:
        return self.encoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                decoder_input_ids: Tensor | None = None, encoder_outputs=None, cache=None,
                past_key_values=None, labels: Tensor | None = None, use_cache: bool | None = None,
                **kwargs) -> Seq2SeqLMOutput:
        """Teacher-forced or incremental logits (B, T, V); `labels` (B, T) give the cross-entropy
        loss."""
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        elif isinstance(encoder_outputs, tuple):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        if decoder_input_ids is None and labels is not None:  # bos, then the labels shifted right
            start = torch.full_like(labels[:, :1], self.config.decoder_start_token_id)
            shifted = torch.cat([start, labels[:, :-1]], dim=1)
            decoder_input_ids = shifted.masked_fill(shifted == -100, self.config.pad_token_id)
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        src_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        hidden = self.decoder(decoder_input_ids, encoder_outputs.last_hidden_state, src_mask, cache)
        logits = self.lm_head(hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return Seq2SeqLMOutput(loss=loss, logits=logits,
                               encoder_last_hidden_state=encoder_outputs.last_hidden_state,
                               **{_CACHE_FIELD: cache})
