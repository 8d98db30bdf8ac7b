"""Read our own transformers-format export of a pre-norm model (model_type attn_mt: the model of
export/modeling_attn_mt.py, shipped in the folder) back as our checkpoint state; the post-norm route
writes a MarianMT folder, which imports/marian.py reads. The inverse of export/transformers.py's
`custom_weights`: the same modules under our names; the tokenizer is our SentencePiece model(s),
whose ids the folder's vocab.json keeps.

    >>> state = attn_mt_state(folder, json.loads((folder / "config.json").read_text()))
    >>> model, cfg, tok = checkpoint.model_from_state(state)

Tested in tests/marian/test_marian.py (an export of either route reads back the same model).
"""

from __future__ import annotations

import re
from pathlib import Path

from attn_mt.checkpoint import CheckpointError, model_state, tokenizer_from_protos
from attn_mt.config import (
    ConfigError,
    DataConfig,
    DecodeConfig,
    ExperimentConfig,
    TokenizerConfig,
    TransformerConfig,
)
from attn_mt.config.model import MOST
from attn_mt.config.tokenizer import MOST as TOKENIZER_MOST
from attn_mt.imports.folder_files import present, read_json, read_regular, read_weights
from attn_mt.imports.marian_fields import GENERATION, REQUIRED, read_fields

VOCAB = (1, TOKENIZER_MOST["vocab_size"])
CONFIG = {"model_type": (str, REQUIRED, None), "src_vocab_size": (int, REQUIRED, VOCAB),
          "tgt_vocab_size": (int, REQUIRED, VOCAB), "norm_first": (bool, True, None),
          "tie_word_embeddings": (bool, True, None), "share_embeddings": (bool, True, None),
          **{k: (int, REQUIRED, (1, MOST[k])) for k in ("d_model", "n_heads", "n_layers", "d_ff",
                                                        "max_positions")}}
# modeling_attn_mt's names -> ours (export/transformers.py's _RENAMES the other way)
RENAMES = [(r"^encoder\.embed\.", "src_embed."), (r"^decoder\.embed\.", "tgt_embed."),
           (r"^(encoder|decoder)\.layers\.(\d+)\.", r"\1.\2."), (r"^encoder\.norm\.", "enc_norm."),
           (r"^decoder\.norm\.", "dec_norm."), (r"^lm_head\.", "out_proj.")]


def _ours(name: str) -> str:
    for pattern, repl in RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def attn_mt_state(folder: Path, raw: dict) -> dict:
    """The folder (its config.json already read as `raw`) as {"model", "config", "tokenizer",
    "step", "source"}."""
    hf = read_fields(raw, CONFIG, folder / "config.json")
    gen_raw = read_json(folder, "generation_config.json", False)
    gen = read_fields(gen_raw, GENERATION, folder / "generation_config.json")
    tok_config = read_json(folder, "tokenizer_config.json", False)
    separate = tok_config.get("separate_vocabs") is True
    spm = {n: read_regular(folder / n) for n in ("source.spm", "target.spm") if present(folder / n)}
    if "source.spm" not in spm or (separate and "target.spm" not in spm):
        raise CheckpointError(f"{folder}: an attn-mt export without its SentencePiece model(s) "
                              "(source.spm, target.spm)")
    tok = tokenizer_from_protos(spm["source.spm"], spm["target.spm"] if separate else None,
                                f"{folder}: tokenizer")
    for key, size in (("src_vocab_size", tok.src_vocab_size),
                      ("tgt_vocab_size", tok.tgt_vocab_size)):
        if hf[key] != size:
            raise CheckpointError(f"{folder / 'config.json'}: {key}={hf[key]}, but its "
                                  f"SentencePiece model has {size} pieces")
    weights = {_ours(k): v.float().contiguous() for k, v in read_weights(folder).items()}
    tied = [("tgt_embed.weight", "src_embed.weight"), ("src_embed.weight", "tgt_embed.weight"),
            ("out_proj.weight", "tgt_embed.weight"), ("tgt_embed.weight", "out_proj.weight"),
            # a tied table is saved once, under one of its names
            ("src_embed.weight", "out_proj.weight")]
    for name, other in tied:
        if name not in weights and other in weights:
            weights[name] = weights[other]
    langs = [tok_config.get(k) for k in ("source_lang", "target_lang")]
    src_lang, tgt_lang = (langs if all(isinstance(x, str) and x for x in langs)
                          and langs[0] != langs[1] else ("src", "tgt"))
    try:
        model = TransformerConfig(d_model=hf["d_model"], n_heads=hf["n_heads"],
                                  n_layers=hf["n_layers"], d_ff=hf["d_ff"], dropout=0.0,
                                  norm_first=hf["norm_first"], max_positions=hf["max_positions"],
                                  tie_embeddings=hf["tie_word_embeddings"])
        decode = DecodeConfig(beam_size=gen["num_beams"], alpha=gen["length_penalty"],
                              length_norm="power")
        cfg = ExperimentConfig(name=folder.resolve().name, model=model, decode=decode,
                               tokenizer=TokenizerConfig(joint=tok.joint,
                                                         vocab_size=max(16, tok.src_vocab_size)),
                               data=DataConfig(src_lang=src_lang, tgt_lang=tgt_lang))
    except ConfigError as e:
        raise CheckpointError(f"{folder / 'config.json'}: cannot be read as an attn-mt model "
                              f"({e})") from None
    # positions are computed, not read
    weights = {k: v for k, v in weights.items() if not k.endswith(".pe")}
    return {**model_state(weights, cfg, tok), "step": 0, "source": str(folder)}
