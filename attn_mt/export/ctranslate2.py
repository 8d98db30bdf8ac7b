"""Export a Transformer checkpoint to CTranslate2: its weights in CTranslate2's layout, the
SentencePiece model(s), and our decode defaults, in one directory that `translate` and `evaluate`
read.

What maps onto what (ours -> CTranslate2's `TransformerSpec`):
    src_embed, tgt_embed            encoder.embeddings[0], decoder.embeddings (times sqrt(D):
                                    scale_embeddings)
    Sinusoidal.pe                 {encoder,decoder}.position_encodings, passed explicitly: ours puts
                                  sin in
                                    the even and cos in the odd dims; CTranslate2's built-in table
                                    differs
    self_attn.qkv_proj [Wq; Wk; Wv] self_attention.linear[0] (the same fused layout), out_proj ->
    linear[1]
    cross_attn.q_proj, kv_proj      attention.linear[0], attention.linear[1] ([Wk; Wv]), out_proj ->
                                    linear[2]
    sub.{j}.norm                    the LayerNorm of sublayer j (self_attention, attention, ffn):
                                    before the sublayer with pre-norm, after the residual sum with
                                    post-norm
    ff.0, ff.3                      ffn.linear_0, ffn.linear_1 (ReLU between)
    enc_norm, dec_norm              {encoder,decoder}.layer_norm (pre-norm only)
    out_proj                        decoder.projection (no bias; tied weights are stored once)
Token ids become token strings: the vocabularies are the SentencePiece pieces in id order, so the
ids agree (pad 0, unk 1, bos 2, eos 3), and the special tokens are configured by their pieces.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from attn_mt.config.yamlconf import OptionError
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.export.checkpoint_reader import ExportError, read_transformer
from attn_mt.export.folder import FolderError, publish
from attn_mt.models.positions import Sinusoidal

META = "attn_mt.json"  # our decode defaults and what the directory holds
QUANTIZATIONS = ("float32", "int8", "int8_float32", "bfloat16")
INSTALL = "pip install 'attn-mt[export]'"


def require_ctranslate2():
    """The ctranslate2 module, or one line saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ExportError(f"CTranslate2 is not installed; install it with: {INSTALL}") from None
    return ctranslate2


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().contiguous().numpy()


def _linear(spec, weights: dict, name: str) -> None:
    spec.weight = _np(weights[f"{name}.weight"])
    if f"{name}.bias" in weights:
        spec.bias = _np(weights[f"{name}.bias"])


def _norm(spec, weights: dict, name: str) -> None:
    spec.gamma, spec.beta = _np(weights[f"{name}.weight"]), _np(weights[f"{name}.bias"])


def _self_attention_and_ffn(spec, w: dict, p: str, ffn_sub: int) -> None:
    """What encoder and decoder layers share: fused-QKV self-attention in sublayer 0, the FFN in
    `ffn_sub`."""
    _linear(spec.self_attention.linear[0], w, f"{p}.self_attn.qkv_proj")
    _linear(spec.self_attention.linear[1], w, f"{p}.self_attn.out_proj")
    _norm(spec.self_attention.layer_norm, w, f"{p}.sub.0.norm")
    _linear(spec.ffn.linear_0, w, f"{p}.ff.0")
    _linear(spec.ffn.linear_1, w, f"{p}.ff.3")
    _norm(spec.ffn.layer_norm, w, f"{p}.sub.{ffn_sub}.norm")


def _encoder_layer(spec, w: dict, p: str) -> None:
    _self_attention_and_ffn(spec, w, p, ffn_sub=1)


def _decoder_layer(spec, w: dict, p: str) -> None:
    _self_attention_and_ffn(spec, w, p, ffn_sub=2)
    _linear(spec.attention.linear[0], w, f"{p}.cross_attn.q_proj")
    _linear(spec.attention.linear[1], w, f"{p}.cross_attn.kv_proj")
    _linear(spec.attention.linear[2], w, f"{p}.cross_attn.out_proj")
    _norm(spec.attention.layer_norm, w, f"{p}.sub.1.norm")


def _pieces(sp) -> list[str]:
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def build_spec(weights: dict, mcfg, tok: Tokenizer):
    """A filled, validated `ctranslate2.specs.TransformerSpec` for our Transformer's state_dict."""
    specs = require_ctranslate2().specs
    spec = specs.TransformerSpec.from_config(mcfg.n_layers, mcfg.n_heads, pre_norm=mcfg.norm_first,
                                             activation=specs.Activation.RELU)
    pe = _np(Sinusoidal(mcfg.d_model, mcfg.max_positions).pe)  # (L, D), our sin/cos layout
    for stack in (spec.encoder, spec.decoder):
        # x * sqrt(D) before adding positions, as Transformer._embed does
        stack.scale_embeddings = True
        stack.position_encodings.encodings = pe
    spec.encoder.embeddings[0].weight = _np(weights["src_embed.weight"])
    spec.decoder.embeddings.weight = _np(weights["tgt_embed.weight"])
    spec.decoder.projection.weight = _np(weights["out_proj.weight"])
    for i, layer in enumerate(spec.encoder.layer):
        _encoder_layer(layer, weights, f"encoder.{i}")
    for i, layer in enumerate(spec.decoder.layer):
        _decoder_layer(layer, weights, f"decoder.{i}")
    if mcfg.norm_first:
        _norm(spec.encoder.layer_norm, weights, "enc_norm")
        _norm(spec.decoder.layer_norm, weights, "dec_norm")
    spec.register_source_vocabulary(_pieces(tok.src))
    spec.register_target_vocabulary(_pieces(tok.tgt))
    cfg = spec.config
    cfg.unk_token, cfg.bos_token, cfg.eos_token = (tok.tgt.id_to_piece(i)
                                                   for i in (tok.unk_id, tok.bos_id, tok.eos_id))
    # ours starts from bos; sources get eos from us (prepare_sources)
    cfg.decoder_start_token = cfg.bos_token
    cfg.layer_norm_epsilon = 1e-5  # nn.LayerNorm's default
    spec.validate()
    return spec


def check_quantization(quantization: str) -> None:
    """One of QUANTIZATIONS, else an OptionError naming `attn-mt export`'s flag."""
    if quantization not in QUANTIZATIONS:
        raise OptionError(f"{quantization!r} is not one of {', '.join(QUANTIZATIONS)}",
                          "quantization")


def export_ct2(checkpoint: Path, out: Path, quantization: str = "float32") -> list[Path]:
    """Write CTranslate2 model.bin, config.json, vocabularies, SentencePiece model(s) and META to
    `out`."""
    check_quantization(quantization)
    require_ctranslate2()
    state, cfg, tok = read_transformer(checkpoint, "CTranslate2")
    try:
        spec = build_spec(state["model"], cfg.model, tok)
    except ExportError:
        raise
    except (KeyError, ValueError) as e:
        raise ExportError(f"{checkpoint}: weights do not fit a CTranslate2 Transformer: "
                          f"{e}") from None
    spec.optimize(quantization=quantization)
    files = tok.files()  # the SentencePiece model(s) under the names every run directory uses
    meta = {"format": "attn-mt-ctranslate2", "version": 1, "quantization": quantization,
            "sentencepiece": list(files), "max_positions": cfg.model.max_positions,
            "decode": asdict(cfg.decode), "checkpoint": Path(checkpoint).name,
            "step": state.get("step", 0)}

    def write(folder: Path) -> None:
        spec.save(str(folder))
        for name, proto in files.items():
            (folder / name).write_bytes(proto)
        (folder / META).write_text(json.dumps(meta, indent=2) + "\n")

    try:
        out = publish(out, write, reads=[Path(checkpoint)])
    except FolderError as e:
        raise ExportError(str(e)) from None
    return sorted(out.iterdir())
