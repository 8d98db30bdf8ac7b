"""Export a Transformer checkpoint as a Hugging Face `transformers` model folder (its card:
model_card.py).

Two routes, by where the LayerNorm sits (docs/export.md says why):
    post-norm   MarianMTModel, built into transformers: the same layers, tied embeddings and fixed
                sinusoids; only Marian's position table puts sin in the first and cos in the second
                half of the model dimension where ours interleaves them, so every weight that reads
                or writes the residual stream is permuted (`PERM`), and the network computes the
                same function.
    pre-norm    no built-in class fits (a LayerNorm before each sublayer and one after each stack),
                so the folder ships `modeling_attn_mt.py`, our model written against transformers
                alone, loaded with `trust_remote_code=True`; its weights are ours under the names it
                gives them.
Both: `model.safetensors`, `config.json`, `generation_config.json` (the checkpoint's decode section
as GENERATION maps it: beam, length penalty; max length), a MarianTokenizer over our SentencePiece
model(s) (it adds eos to a source as we do; pieces in id order, so pad 0, unk 1, bos 2 = decoder
start, eos 3), README.md.

One job: a checkpoint as a transformers folder. Tested in tests/export/test_transformers.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import torch

from attn_mt.config import DecodeConfig, ExperimentConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.export.checkpoint_reader import ExportError, read_transformer
from attn_mt.export.folder import FolderError, publish
from attn_mt.export.model_card import model_card
from attn_mt.rundir import RunDir

INSTALL = "pip install 'attn-mt[hf]'"


def require_transformers():
    """The transformers module (with safetensors), or one line saying how to install them."""
    try:
        import safetensors  # noqa: F401
        import transformers
    except ImportError:
        raise ExportError("transformers and safetensors are not installed; install them with: "
                          f"{INSTALL}") from None
    return transformers


def perm(d_model: int) -> torch.Tensor:
    """Marian's dim m holds our dim PERM[m]: sin dims 0, 2, 4, ... first, then the cos dims 1, 3, 5,
    ..."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_weights(w: dict, cfg) -> dict[str, torch.Tensor]:
    """Our state_dict -> MarianMTModel's, the model dimension permuted (see the module docstring).

    A Linear that reads the residual stream has its input columns permuted, one that writes it its
    output rows and bias; embeddings, LayerNorms and the output layer likewise.
    """
    p = perm(cfg.d_model)
    out: dict[str, torch.Tensor] = {}

    def reads(name: str, ours: str) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = w[f"{ours}.weight"][:, p], w[f"{ours}.bias"]

    def writes(name: str, ours: str) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = w[f"{ours}.weight"][p], w[f"{ours}.bias"][p]

    def norm(name: str, ours: str) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = w[f"{ours}.weight"][p], w[f"{ours}.bias"][p]

    # a fused projection -> one Linear per part
    def split(name: str, ours: str, parts: str) -> None:
        for part, wt, b in zip(parts, w[f"{ours}.weight"].chunk(len(parts)),
                               w[f"{ours}.bias"].chunk(len(parts)), strict=True):
            out[f"{name}.{part}_proj.weight"], out[f"{name}.{part}_proj.bias"] = wt[:, p], b

    for side in ("encoder", "decoder"):
        for i in range(cfg.n_layers):
            ours, m = f"{side}.{i}", f"model.{side}.layers.{i}"
            split(f"{m}.self_attn", f"{ours}.self_attn.qkv_proj", "qkv")
            writes(f"{m}.self_attn.out_proj", f"{ours}.self_attn.out_proj")
            norm(f"{m}.self_attn_layer_norm", f"{ours}.sub.0.norm")
            reads(f"{m}.fc1", f"{ours}.ff.0")
            writes(f"{m}.fc2", f"{ours}.ff.3")
            norm(f"{m}.final_layer_norm", f"{ours}.sub.{1 if side == 'encoder' else 2}.norm")
            if side == "decoder":
                reads(f"{m}.encoder_attn.q_proj", f"{ours}.cross_attn.q_proj")
                split(f"{m}.encoder_attn", f"{ours}.cross_attn.kv_proj", "kv")
                writes(f"{m}.encoder_attn.out_proj", f"{ours}.cross_attn.out_proj")
                norm(f"{m}.encoder_attn_layer_norm", f"{ours}.sub.1.norm")
    out["model.encoder.embed_tokens.weight"] = w["src_embed.weight"][:, p]
    out["model.decoder.embed_tokens.weight"] = w["tgt_embed.weight"][:, p]
    out["model.shared.weight"] = w["src_embed.weight"][:, p]
    out["lm_head.weight"] = w["out_proj.weight"][:, p]
    return out


# our state_dict names -> modeling_attn_mt's (the same modules, grouped per stack)
_RENAMES = [(r"^src_embed\.", "encoder.embed."), (r"^tgt_embed\.", "decoder.embed."),
            (r"^(encoder|decoder)\.(\d+)\.", r"\1.layers.\2."), (r"^enc_norm\.", "encoder.norm."),
            (r"^dec_norm\.", "decoder.norm."), (r"^out_proj\.", "lm_head.")]


def custom_weights(w: dict) -> dict[str, torch.Tensor]:
    def rename(k: str) -> str:
        for pattern, repl in _RENAMES:
            k = re.sub(pattern, repl, k)
        return k

    return {rename(k): v for k, v in w.items()}


def _special_ids(tok: Tokenizer) -> dict:
    return dict(pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
                decoder_start_token_id=tok.bos_id)


def build_model(w: dict, cfg: ExperimentConfig, tok: Tokenizer):
    """(transformers model with our weights, route) for a Transformer state_dict."""
    require_transformers()
    m, share = cfg.model, tok.joint and cfg.model.tie_embeddings
    if m.norm_first:
        from attn_mt.export.modeling_attn_mt import AttnMtConfig, AttnMtForConditionalGeneration

        AttnMtConfig.register_for_auto_class()
        AttnMtForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
        config = AttnMtConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                              d_model=m.d_model, n_heads=m.n_heads, n_layers=m.n_layers,
                              d_ff=m.d_ff, norm_first=True, max_positions=m.max_positions,
                              share_embeddings=share, tie_word_embeddings=m.tie_embeddings,
                              **_special_ids(tok))
        model, weights, route = AttnMtForConditionalGeneration(config), custom_weights(w), "attn_mt"
    else:
        from transformers import MarianConfig, MarianMTModel

        config = MarianConfig(vocab_size=tok.src_vocab_size, decoder_vocab_size=tok.tgt_vocab_size,
                              share_encoder_decoder_embeddings=share,
                              tie_word_embeddings=m.tie_embeddings, d_model=m.d_model,
                              encoder_layers=m.n_layers, decoder_layers=m.n_layers,
                              encoder_attention_heads=m.n_heads, decoder_attention_heads=m.n_heads,
                              encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff,
                              activation_function="relu", max_position_embeddings=m.max_positions,
                              scale_embedding=True, dropout=m.dropout,
                              forced_eos_token_id=tok.eos_id, **_special_ids(tok))
        model, weights, route = MarianMTModel(config), marian_weights(w, m), "marian"
    own = model.state_dict()
    missing = [k for k in own if k not in weights and "embed_positions" not in k
               and k != "final_logits_bias"]
    if missing:
        raise ExportError(f"weights missing for {', '.join(missing[:3])}")
    with torch.no_grad():
        for k, v in weights.items():
            if k in own:
                own[k].copy_(v)
    return model.eval(), route


def mapped_length_penalty(alpha: float, mean_len: float | None) -> float:
    """transformers' exponent b whose |Y|^b grows with |Y| as GNMT's ((5 + |Y|) / 6)^alpha does at
    the mean output length L (equal d/dL of the logs: b / L = alpha / (5 + L)); alpha itself when L
    is unknown."""
    return alpha if not mean_len else round(alpha * mean_len / (5 + mean_len), 3)


def mean_output_length(files: RunDir, tok: Tokenizer) -> float | None:
    """Mean length in tokens, eos included, of the run's test translations (test_hyps.txt), if it
    has them."""
    lines = files.read_hyps()
    return sum(len(ids) + 1 for ids in tok.encode_tgt(lines)) / len(lines) if lines else None


# How generate() decodes with each decode option (DECODE_OPTIONS' key): its GenerationConfig values,
# from the decode section and the mapped length penalty, or why generation_config.json cannot hold
# it (the model card says so, with our value). tests/decoding/test_decode_options.py fails for a
# row without an entry.
GENERATION: dict[str, Callable[[DecodeConfig, float], dict] | str] = {
    "beam_size": lambda d, lp: {"num_beams": d.beam_size},
    # transformers refuses beam settings with num_beams=1 (greedy)
    "alpha": lambda d, lp: (dict(length_penalty=lp, early_stopping="never") if d.beam_size > 1
                            else {}),
    "nbest": "a call asks for its hypotheses (`num_return_sequences`)",
    "batch_size": "a call decodes the batch it is given",
    "max_len_a": "generate() has one length limit per call (`max_new_tokens`)",
    "max_len_b": "generate() has one length limit per call (`max_new_tokens`)",
}


def generation_config(cfg: ExperimentConfig, tok: Tokenizer, length_penalty: float):
    """Our decode defaults in transformers' terms (GENERATION: beam, length penalty), the length
    cap and eos forced there."""
    from transformers import GenerationConfig

    mapped = [how(cfg.decode, length_penalty) for how in GENERATION.values() if callable(how)]
    return GenerationConfig(**{k: v for m in mapped for k, v in m.items()},
                            max_length=cfg.model.max_positions + 1,
                            forced_eos_token_id=tok.eos_id, **_special_ids(tok))


def save_tokenizer(tok: Tokenizer, folder: Path, cfg: ExperimentConfig) -> None:
    """A MarianTokenizer over our SentencePiece model(s): source.spm, target.spm, vocab.json (+
    target_vocab.json)."""
    from transformers import MarianTokenizer

    (folder / "source.spm").write_bytes(tok.src_proto)
    (folder / "target.spm").write_bytes(tok.tgt_proto or tok.src_proto)
    vocab = {tok.src.id_to_piece(i): i for i in range(tok.src_vocab_size)}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    extra = {}
    if not tok.joint:
        target = {tok.tgt.id_to_piece(i): i for i in range(tok.tgt_vocab_size)}
        (folder / "target_vocab.json").write_text(json.dumps(target, ensure_ascii=False))
        extra = {"target_vocab_file": str(folder / "target_vocab.json"), "separate_vocabs": True}
    hf_tok = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                             str(folder / "vocab.json"), source_lang=cfg.data.src_lang,
                             target_lang=cfg.data.tgt_lang, bos_token="<s>",
                             additional_special_tokens=[], model_max_length=cfg.model.max_positions,
                             **extra)
    hf_tok.save_pretrained(folder)


def export_hf(checkpoint: Path, out: Path) -> list[Path]:
    """Write a Transformer checkpoint as a transformers model folder (weights, configs, tokenizer,
    card)."""
    require_transformers()
    # an RNN is refused: transformers has no GRU encoder-decoder with additive attention
    state, cfg, tok = read_transformer(checkpoint, "transformers")
    try:
        model, route = build_model(state["model"], cfg, tok)
    except (KeyError, RuntimeError) as e:
        raise ExportError(f"{checkpoint}: weights do not fit a transformers model: {e}") from None
    # the run that wrote the checkpoint: its test scores and texts
    files = RunDir(Path(checkpoint).parent)
    penalty = mapped_length_penalty(cfg.decode.alpha, mean_output_length(files, tok))
    model.generation_config = generation_config(cfg, tok, penalty)
    results = files.read_results()

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        save_tokenizer(tok, folder, cfg)
        # tied once
        params = sum(t.numel() for t in {t.data_ptr(): t for t in state["model"].values()}.values())
        card = model_card(cfg, tok, state, results, files, route=route, params=params,
                          length_penalty=penalty, not_held={k: why for k, why in GENERATION.items()
                                                            if isinstance(why, str)})
        (folder / "README.md").write_text(card, encoding="utf-8")

    try:
        publish(out, write, reads=[Path(checkpoint)])
    except FolderError as e:
        raise ExportError(str(e)) from None
    return sorted(out.iterdir())
