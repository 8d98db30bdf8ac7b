"""The fields of a MarianMT folder's files, read as a hostile user may have written them: each JSON
file must hold an object, each field its type and a value in range, the vocabulary ids must be
distinct and fit the weights' embeddings, and the pieces must be the SentencePiece models' own. A
folder that fails is refused in one line (CheckpointError) naming the file and the field, before
anything is sized by it.

Used by imports/marian.py. Tested in tests/marian/test_marian_hostile.py (with a fuzz test over
the fields)."""

from __future__ import annotations

import math
from pathlib import Path

import sentencepiece as spm
import torch

from attn_mt.checkpoint import CheckpointError
from attn_mt.config.model import MOST as MODEL_MOST
from attn_mt.config.tokenizer import MOST as TOKENIZER_MOST
from attn_mt.imports.folder_files import read_json

REQUIRED = object()
SIZE, ID = (1, None), (0, None)  # (least, most) of a size and of a token id; None: the limits below
# config.json's fields attn-mt reads: (type, default, (least, most)); decoder_*: the encoder's
CONFIG: dict[str, tuple[type, object, tuple | None]] = {
    "model_type": (str, REQUIRED, None), "vocab_size": (int, REQUIRED, SIZE),
    "decoder_vocab_size": (int, None, SIZE), "d_model": (int, REQUIRED, SIZE),
    "encoder_layers": (int, REQUIRED, SIZE), "decoder_layers": (int, None, SIZE),
    "encoder_attention_heads": (int, REQUIRED, SIZE), "decoder_attention_heads": (int, None, SIZE),
    "encoder_ffn_dim": (int, REQUIRED, SIZE), "decoder_ffn_dim": (int, None, SIZE),
    "max_position_embeddings": (int, 512, SIZE), "dropout": (float, 0.1, (0.0, 1.0)),
    "attention_dropout": (float, 0.0, (0.0, 1.0)), "activation_dropout": (float, 0.0, (0.0, 1.0)),
    "pad_token_id": (int, None, ID), "eos_token_id": (int, 0, ID),
    "decoder_start_token_id": (int, None, ID),
    "activation_function": (str, "swish", None), "scale_embedding": (bool, False, None),
    "normalize_before": (bool, False, None), "add_final_layer_norm": (bool, False, None),
    "share_encoder_decoder_embeddings": (bool, True, None),
    "tie_word_embeddings": (bool, True, None),
}
GENERATION = {"num_beams": (int, 1, (1, 1024)), "length_penalty": (float, 1.0, (-100.0, 100.0)),
              "bad_words_ids": (list, None, None)}
MOST = {"vocab_size": TOKENIZER_MOST["vocab_size"],
        "decoder_vocab_size": TOKENIZER_MOST["vocab_size"],
        "d_model": MODEL_MOST["d_model"], "max_position_embeddings": MODEL_MOST["max_positions"],
        **{f"{side}_{k}": MODEL_MOST[ours] for side in ("encoder", "decoder") for k, ours in
           (("layers", "n_layers"), ("attention_heads", "n_heads"), ("ffn_dim", "d_ff"))}}
SPECIAL = ("</s>", "<unk>", "<s>", "<pad>")


def read_fields(raw: dict, schema: dict, path: Path) -> dict:
    """`raw`'s fields of `schema`, typed and in range (defaults filled in); CheckpointError names
    the field."""
    out = {}
    for key, (kind, default, bounds) in schema.items():
        value = raw.get(key)
        if value is None:
            if default is REQUIRED:
                raise CheckpointError(f"{path}: {key} is missing")
            out[key] = default
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CheckpointError(f"{path}: {key}={value!r:.60}: expected {kind.__name__}, got "
                                  f"{type(value).__name__}")
        if kind is float and not math.isfinite(value):
            raise CheckpointError(f"{path}: {key}={value}: must be a finite number")
        if bounds is not None:
            least, most = bounds[0], MOST.get(key, bounds[1])
            above = most is not None and (value >= most if kind is float else value > most)
            if value < least or above:
                limit = f"in [{least}, {most})" if kind is float else \
                    f">= {least}" + (f" and <= {most}" if most else "")
                raise CheckpointError(f"{path}: {key}={value}: must be {limit}")
        out[key] = value
    return out


def config_fields(folder: Path, raw: dict) -> dict:
    """config.json's fields (`raw`: the file as `read_json` gives it; decoder sizes default to the
    encoder's), and generation_config.json's where it exists (else config.json's) under
    "generation"."""
    path = folder / "config.json"
    hf = read_fields(raw, CONFIG, path)
    for side in ("layers", "attention_heads", "ffn_dim"):
        if hf[f"decoder_{side}"] is None:
            hf[f"decoder_{side}"] = hf[f"encoder_{side}"]
    hf["decoder_vocab_size"] = hf["decoder_vocab_size"] or hf["vocab_size"]
    if hf["d_model"] % hf["encoder_attention_heads"] or hf["d_model"] % 2:
        raise CheckpointError(f"{path}: d_model={hf['d_model']}: must be even and divisible by "
                              f"encoder_attention_heads={hf['encoder_attention_heads']}")
    gen_path = folder / "generation_config.json"
    gen_raw = read_json(folder, "generation_config.json", False)
    hf["generation"] = read_fields(gen_raw or raw, GENERATION, gen_path if gen_raw else path)
    hf["generation"]["path"] = gen_path if gen_raw else path
    return hf


def check_ids(hf: dict, path: Path) -> None:
    """The special ids and bad_words_ids within the vocabularies config.json gives."""
    size = min(hf["vocab_size"], hf["decoder_vocab_size"])
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        if hf[key] is not None and hf[key] >= size:
            raise CheckpointError(f"{path}: {key}={hf[key]}: outside the vocabulary of {size}")
    gen = hf["generation"]
    for words in gen["bad_words_ids"] or []:
        most = hf["decoder_vocab_size"]
        if not isinstance(words, list) or not all(type(i) is int and 0 <= i < most for i in words):
            raise CheckpointError(f"{gen['path']}: bad_words_ids holds {words!r:.60}: expected "
                                  f"lists of token ids below decoder_vocab_size={most}")


def check_embeddings(hf: dict, weights: dict[str, torch.Tensor], folder: Path) -> None:
    """vocab_size, decoder_vocab_size and d_model equal to the weights' embedding tables (before
    anything is sized by them)."""
    def table(*names: str) -> torch.Tensor:
        found = next((weights[n] for n in names if n in weights), None)
        if found is None or found.dim() != 2:
            raise CheckpointError(f"{folder}: weights missing for {names[0]} (or not a matrix)")
        return found

    src = table("model.encoder.embed_tokens.weight", "model.shared.weight")
    tgt = table("model.decoder.embed_tokens.weight", "model.shared.weight")
    sizes = (("vocab_size", src.size(0)), ("decoder_vocab_size", tgt.size(0)),
             ("d_model", src.size(1)))
    for key, rows in sizes:
        if hf[key] != rows:
            what = "columns" if key == "d_model" else "rows"
            raise CheckpointError(f"{folder / 'config.json'}: {key}={hf[key]}, but the weights' "
                                  f"embeddings have {rows} {what}")


def vocab_ids(vocab: dict, size: int, path: Path) -> list[str]:
    """vocab.json's {piece: id} as pieces by id, `size` of them (an id without a piece gets a
    placeholder); the ids distinct and below `size` (checked against the weights first: nothing
    is sized by the file)."""
    pieces: list[str | None] = [None] * size
    for piece, i in vocab.items():
        if type(i) is not int or not 0 <= i < size:
            raise CheckpointError(f"{path}: {piece!r:.40} has id {i!r:.20}, outside the model's "
                                  f"{size} embeddings")
        if pieces[i] is not None:
            raise CheckpointError(f"{path}: id {i} is given to both {pieces[i]!r:.40} and "
                                  f"{piece!r:.40}")
        pieces[i] = piece
    return [p if p is not None else f"<unused{i}>" for i, p in enumerate(pieces)]


def check_pieces(pieces: list[str], protos: list[bytes], path: Path) -> None:
    """Every piece of the SentencePiece models `protos` in the vocabulary, and every piece of the
    vocabulary one of theirs (or a special, placeholder or `>>xx<<` language code): else their
    ids and pieces disagree."""
    theirs: set[str] = set()
    for proto in protos:
        try:
            sp = spm.SentencePieceProcessor(model_proto=proto)
        except (RuntimeError, TypeError) as e:
            raise CheckpointError(f"{path.parent}: not a SentencePiece model "
                                  f"({str(e)[:80]})") from None
        theirs |= {sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))}
    ours = set(pieces)
    missing = sorted(theirs - ours)
    extra = sorted(p for p in ours - theirs if p not in SPECIAL
                   and not (p.startswith("<") and p.endswith(">"))
                   and not (p.startswith(">>") and p.endswith("<<")))
    if missing or extra:
        what = (f"lacks {len(missing)} pieces of the SentencePiece models (e.g. {missing[0]!r:.30})"
                if missing else
                f"holds {len(extra)} pieces the SentencePiece models do not "
                f"(e.g. {extra[0]!r:.30})")
        raise CheckpointError(f"{path}: {what}: not the vocabulary of this folder's .spm files")
