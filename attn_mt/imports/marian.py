"""Read a MarianMT model folder (Helsinki-NLP's opus-mt, or our own transformers export) as our
checkpoint state: the inverse of export/transformers.py's post-norm route.

A MarianMT model is our post-norm Transformer in Marian's layout (`model.kind: marian`,
config/marian.py; models/imported.py builds it): swish feed-forward layers (`model.activation`),
the sinusoid table in halves (sin in the first half of the dimensions, cos in the second; its
weights then need no permutation), a fixed `final_logits_bias`, and the pad token as decoder
start, which is never generated (`model.banned_ids`). Its tokenizer is SentencePiece models whose
pieces vocab.json numbers (target_vocab.json too where the vocabularies are separate):
data/pieces.py's `MappedPieces`. generation_config.json's beam and length penalty become the
decode defaults (`decode.length_norm=power`: log P / |Y| ** alpha).

    >>> state = marian_state("opus-mt-en-de")  # a folder, or a hub name where the hub is reachable
    >>> model, cfg, tok = checkpoint.model_from_state(state)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attn_mt.checkpoint import CheckpointError, model_state, tokenizer_from_protos
from attn_mt.config import ConfigError, DataConfig, DecodeConfig, ExperimentConfig, TokenizerConfig
from attn_mt.config.marian import MarianConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.files import mark_model
from attn_mt.imports.folder_files import WEIGHTS, present, read_json, read_regular, read_weights
from attn_mt.imports.marian_fields import (
    check_embeddings,
    check_ids,
    check_pieces,
    config_fields,
    vocab_ids,
)

FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "source.spm",
         "target.spm", "vocab.json", "target_vocab.json")  # what is read (besides the weights)
FILE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".json", ".yaml", ".yml", ".model",
                 ".spm", ".txt", ".gz", ".zip", ".tar", ".onnx"}  # a file's name, never a hub model
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu"}


def is_marian(path: Path | str) -> bool:
    """A local folder whose config.json says model_type marian, or an `owner/name` that names
    nothing here (a hub name: whether it is a MarianMT model shows when it is read)."""
    p = Path(path)
    if p.is_dir():
        try:
            config = json.loads(read_regular(p / "config.json"))
        except (OSError, ValueError, RecursionError, CheckpointError):  # damaged, a FIFO, a device:
            return present(p / "config.json")  # the Marian reader says what is wrong
        return not isinstance(config, dict) or config.get("model_type") in ("marian", "attn_mt")
    # owner/name, where no folder `owner` is here (runs/missing.pt is a missing file), and not a
    # file name (nosuchdir/checkpoint_best.pt is a missing file, not a hub name to retry for long)
    text = str(path)
    return (not p.exists() and text.count("/") == 1 and not text.startswith((".", "/", "~"))
            and " " not in text and not Path(text.split("/")[0]).is_dir()
            and p.suffix.lower() not in FILE_SUFFIXES)


def local_folder(path: Path | str) -> Path:
    """`path` itself when it is a folder, else the hub model's files downloaded (hub's cache)."""
    if Path(path).is_dir():
        return Path(path)
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import EntryNotFoundError
    except ImportError:
        raise CheckpointError(f"{path}: not a local folder; to download it from the Hugging Face "
                              "hub install huggingface_hub (pip install 'attn-mt[hf]')") from None
    got = None
    try:
        for name in FILES:
            try:
                got = Path(hf_hub_download(str(path), name)).parent
            except EntryNotFoundError:
                pass
        for name in WEIGHTS:
            try:
                hf_hub_download(str(path), name)
                break
            except EntryNotFoundError:
                continue
    except Exception as e:  # offline, unknown repository, no permission: one line
        raise CheckpointError(f"{path}: not a local folder, and the Hugging Face hub did not give "
                              f"it ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    if got is None:
        raise CheckpointError(f"{path}: the hub holds no MarianMT files under this name")
    return got


def marian_tokenizer(folder: Path, hf: dict) -> Tokenizer:
    """source.spm and target.spm, their pieces numbered by vocab.json (and target_vocab.json); `hf`
    checked (marian_fields.config_fields and check_embeddings)."""
    separate = read_json(folder, "tokenizer_config.json", False).get("separate_vocabs", False)
    if not isinstance(separate, bool):
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: separate_vocabs="
                              f"{separate!r:.40}: expected bool")
    vocab = read_json(folder, "vocab.json")
    if "<unk>" not in vocab:
        raise CheckpointError(f"{folder / 'vocab.json'}: has no <unk> piece")
    protos = [read_regular(folder / name) if present(folder / name) else None
              for name in ("source.spm", "target.spm")]
    if protos[0] is None:
        raise CheckpointError(f"{folder}: a MarianMT folder without source.spm")
    src_proto, tgt_proto = protos[0], protos[1] or protos[0]
    src = vocab_ids(vocab, hf["vocab_size"], folder / "vocab.json")
    tgt_size, shared = hf["decoder_vocab_size"], hf["share_encoder_decoder_embeddings"]
    target = folder / "target_vocab.json"
    tgt = vocab_ids(read_json(folder, "target_vocab.json"), tgt_size, target) if separate \
        else None if shared else vocab_ids(vocab, tgt_size, folder / "vocab.json")
    check_pieces(src, [src_proto] if separate else [src_proto, tgt_proto], folder / "vocab.json")
    if separate:
        check_pieces(tgt, [tgt_proto], folder / "target_vocab.json")
    pad = len(src) - 1 if hf["pad_token_id"] is None else hf["pad_token_id"]
    if vocab.get("<pad>", pad) != pad:
        raise CheckpointError(f"{folder / 'vocab.json'}: <pad> is {vocab['<pad>']}, the model's "
                              f"pad_token_id {pad}; "
                              "attn-mt reads models whose vocabularies share the pad id")
    start = pad if hf["decoder_start_token_id"] is None else hf["decoder_start_token_id"]
    specials = {"pad": pad, "unk": vocab["<unk>"], "eos": hf["eos_token_id"], "bos": start}
    return tokenizer_from_protos(src_proto, tgt_proto, f"{folder}: tokenizer",
                                 {"src": src, "tgt": tgt, "specials": specials})


def _same(hf: dict, a: str, b: str) -> int:
    if hf[b] != hf[a]:
        raise CheckpointError(f"config.json: {a}={hf[a]} but {b}={hf[b]}; attn-mt's encoder and "
                              "decoder have the "
                              "same shape")
    return hf[a]


def check_layout(folder: Path, hf: dict) -> None:
    """The MarianMT layout attn-mt reads: its activations, scaled embeddings, post-norm layers."""
    if hf["activation_function"] not in ACTIVATIONS:
        raise CheckpointError(f"{folder / 'config.json'}: activation_function="
                              f"{hf['activation_function']!r:.40}; "
                              f"attn-mt runs {', '.join(ACTIVATIONS)}")
    for key, want in (("scale_embedding", True), ("normalize_before", False),
                      ("add_final_layer_norm", False)):
        if hf[key] != want:
            raise CheckpointError(f"{folder / 'config.json'}: {key}={hf[key]}: not the MarianMT "
                                  "layout attn-mt reads "
                                  "(scaled embeddings, post-norm layers without a final LayerNorm)")


def marian_config(folder: Path, hf: dict, tok: Tokenizer) -> ExperimentConfig:
    """config.json and generation_config.json as our config (model, tokenizer, decode sections)."""
    act = hf["activation_function"]
    gen = hf["generation"]
    banned = {w[0] for w in gen["bad_words_ids"] or [] if len(w) == 1}
    if tok.bos_id == tok.pad_id:
        banned.add(tok.pad_id)  # Marian's decoder start: never an output
    names = folder.resolve().name.split("-")  # opus-mt-en-de -> en, de
    pair = len(names) >= 2 and names[-2] != names[-1]
    src_lang, tgt_lang = (names[-2], names[-1]) if pair else ("src", "tgt")
    try:
        model = MarianConfig(
            d_model=hf["d_model"],
            n_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
            n_layers=_same(hf, "encoder_layers", "decoder_layers"),
            d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
            dropout=hf["dropout"], attention_dropout=hf["attention_dropout"],
            activation_dropout=hf["activation_dropout"], norm_first=False,
            tie_embeddings=hf["tie_word_embeddings"], max_positions=hf["max_position_embeddings"],
            activation=ACTIVATIONS[act], banned_ids=tuple(sorted(banned)))
        decode = DecodeConfig(beam_size=gen["num_beams"], alpha=gen["length_penalty"],
                              length_norm="power")
        return ExperimentConfig(name=folder.resolve().name, model=model, decode=decode,
                                tokenizer=TokenizerConfig(joint=tok.joint,
                                                          vocab_size=max(16, tok.src_vocab_size)),
                                data=DataConfig(src_lang=src_lang, tgt_lang=tgt_lang))
    except (KeyError, ConfigError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: cannot be read as an attn-mt model "
                              f"({e})") from None


def our_weights(w: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """MarianMTModel's weights by our names (transformers.marian_weights, without permutation)."""
    out: dict[str, torch.Tensor] = {}

    def take(ours: str, name: str) -> None:
        out[f"{ours}.weight"], out[f"{ours}.bias"] = w[f"{name}.weight"], w[f"{name}.bias"]

    def fuse(ours: str, name: str, parts: str) -> None:  # a Linear per part -> our fused one
        out[f"{ours}.weight"] = torch.cat([w[f"{name}.{p}_proj.weight"] for p in parts])
        out[f"{ours}.bias"] = torch.cat([w[f"{name}.{p}_proj.bias"] for p in parts])

    for side in ("encoder", "decoder"):
        for i in range(n_layers):
            ours, m = f"{side}.{i}", f"model.{side}.layers.{i}"
            fuse(f"{ours}.self_attn.qkv_proj", f"{m}.self_attn", "qkv")
            take(f"{ours}.self_attn.out_proj", f"{m}.self_attn.out_proj")
            take(f"{ours}.sub.0.norm", f"{m}.self_attn_layer_norm")
            take(f"{ours}.ff.0", f"{m}.fc1")
            take(f"{ours}.ff.3", f"{m}.fc2")
            take(f"{ours}.sub.{1 if side == 'encoder' else 2}.norm", f"{m}.final_layer_norm")
            if side == "decoder":
                take(f"{ours}.cross_attn.q_proj", f"{m}.encoder_attn.q_proj")
                fuse(f"{ours}.cross_attn.kv_proj", f"{m}.encoder_attn", "kv")
                take(f"{ours}.cross_attn.out_proj", f"{m}.encoder_attn.out_proj")
                take(f"{ours}.sub.1.norm", f"{m}.encoder_attn_layer_norm")

    def first(*names: str) -> torch.Tensor:  # tied tables are saved once, under one of their names
        return next(w[n] for n in names if n in w)

    out["src_embed.weight"] = first("model.encoder.embed_tokens.weight", "model.shared.weight")
    out["tgt_embed.weight"] = first("model.decoder.embed_tokens.weight", "model.shared.weight")
    out["out_proj.weight"] = first("lm_head.weight", "model.decoder.embed_tokens.weight",
                                   "model.shared.weight")
    bias = w.get("final_logits_bias")
    vocab = out["out_proj.weight"].size(0)
    out["out_bias"] = torch.zeros(vocab) if bias is None else bias.reshape(-1)
    return {k: v.float().contiguous() for k, v in out.items()}


def marian_state(path: Path | str) -> dict:
    """A MarianMT folder (or hub name) as a checkpoint state: {"model", "config", "tokenizer"} (what
    `checkpoint.model_from_state` rebuilds), plus where it came from ("init_path")."""
    folder = local_folder(path)
    mark_model(folder)  # no report is written into it (files.check_report)
    raw = read_json(folder, "config.json")
    if raw.get("model_type") == "attn_mt":  # our own pre-norm transformers export
        from attn_mt.imports.attn_mt_folder import attn_mt_state

        return attn_mt_state(folder, raw)
    hf = config_fields(folder, raw)  # every field typed and in range before anything is sized
    if hf["model_type"] != "marian":
        raise CheckpointError(f"{folder / 'config.json'}: model_type is {hf['model_type']!r:.40}, "
                              "not 'marian'")
    check_ids(hf, folder / "config.json")
    check_layout(folder, hf)
    weights = read_weights(folder)
    check_embeddings(hf, weights, folder)  # vocab_size and d_model are the weights' own
    tok = marian_tokenizer(folder, hf)
    cfg = marian_config(folder, hf, tok)
    try:
        weights = our_weights(weights, cfg.model.n_layers)
    except (KeyError, StopIteration) as e:
        raise CheckpointError(f"{folder}: weights missing for {e}") from None
    except RuntimeError as e:  # the parts of one projection do not fit together
        raise CheckpointError(f"{folder}: weights of mismatched shapes "
                              f"({str(e).splitlines()[0][:120]})") from None
    return {**model_state(weights, cfg, tok), "step": 0, "source": str(path)}
