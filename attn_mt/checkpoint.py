"""Checkpoint files: their format, atomic saves (through attn_mt.files), safe loads, and rebuilding
a model from what a checkpoint holds (averaging checkpoints is training/averaging.py's).

A checkpoint is a dict of tensors and plain data only (it loads with
`torch.load(..., weights_only=True)`, so a crafted file cannot run code):
    format_version, attn_mt_version (the writer's), model (state_dict), optimizer, step, epoch,
    batch_in_epoch, config (nested dict), tokenizer (SentencePiece model bytes), rng, best_bleu, ...
Format 2 (this one) names the optimizer's parameters (`param_groups[i]["param_names"]`); format 1
did not, and its files still load (translate, evaluate, and resume through training/resume.py).
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import torch

from attn_mt.config import ConfigError, DecodeConfig, ExperimentConfig, from_dict, to_dict
from attn_mt.config.yamlconf import first_line, show
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import ModelError
from attn_mt.files import remove_orphans, write_atomic
from attn_mt.models import Seq2Seq, build_model, empty_model

FORMAT_VERSION = 2
READABLE = (1, 2)  # formats this attn-mt loads
# what a model's weights are saved as
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
log = logging.getLogger(__name__)
try:  # attn_mt.__version__, from the install (this module may not import the package)
    VERSION = metadata.version("attn-mt")
except metadata.PackageNotFoundError:  # a checkout run without an install
    VERSION = "(not installed)"


class CheckpointError(ModelError):
    """A checkpoint that is missing, damaged or from an incompatible version."""


def save(state: dict, path: Path) -> None:
    """Write `state` to `path` atomically (files.write_atomic: a temporary file in the same
    directory, fsync, rename). A crash or SIGKILL at any moment leaves either the old file or the
    new one, never a mix. Raises CheckpointError when the file cannot be written (e.g. a full disk).
    """
    path = Path(path)
    try:
        write_atomic(path, lambda f: torch.save({"format_version": FORMAT_VERSION,
                                                     "attn_mt_version": VERSION, **state}, f))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write checkpoint ({e.strerror or e})") from None
    remove_orphans(path)  # temp files of savers of this machine killed while saving


def load(path: Path | str, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint dict, or raise CheckpointError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # weights_only met a class or function: a pickle that could run code
            raise CheckpointError(f"{path}: refused: holds objects other than tensors and plain "
                                  "data (loading it could run code)") from None
        raise CheckpointError(f"{path}: not a readable checkpoint (corrupt pickle data)") from None
    except Exception as e:  # truncated or damaged files fail in many ways (zip, pickle, utf-8, ...)
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt: "
                              f"{first_line(e)})") from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{path}: not an attn-mt checkpoint")
    version = state.get("format_version")
    if version not in READABLE:
        raise CheckpointError(f"{path}: written by checkpoint format {version}, this attn-mt reads "
                              f"formats {', '.join(map(str, READABLE))}")
    return state


def model_state(weights: dict, cfg: ExperimentConfig, tok: Tokenizer) -> dict:
    """What rebuilds a model (`model_from_state`): its weights, its config as plain data and its
    tokenizer."""
    return {"model": weights, "config": to_dict(cfg), "tokenizer": tok.state()}


def model_from_state(state: dict, device: torch.device | str = "cpu",
                     ) -> tuple[Seq2Seq, ExperimentConfig, Tokenizer]:
    """Rebuild (model in eval mode, config, tokenizer) from a loaded checkpoint dict."""
    cfg, tok, weights = checked_state(state)
    model = build_model(cfg.model, **tok.sizes())
    model.load_state_dict(weights)
    return model.to(device).eval(), cfg, tok


def checked_state(state: dict) -> tuple[ExperimentConfig, Tokenizer, dict]:
    """(config, tokenizer, weights) of a loaded checkpoint dict, each checked as `model_from_state`
    needs them (CheckpointError saying what is wrong), without building the model."""
    cfg = config_from_state(state)
    tok = tokenizer_from_state(state.get("tokenizer"))
    banned = [i for i in getattr(cfg.model, "banned_ids", ()) if i >= tok.tgt_vocab_size]
    if banned:
        raise CheckpointError(f"checkpoint config: model.banned_ids holds {banned[0]}, outside the "
                              f"target vocabulary of {tok.tgt_vocab_size}")
    # nothing allocated: a crafted config may ask for terabytes
    shapes = empty_model(cfg.model, **tok.sizes())
    weights = check_weights(state["model"], shapes.state_dict())
    _check_size(shapes, weights, cfg.model.max_positions)
    broken = next((k for k, v in weights.items() if v.is_floating_point()
                   and not torch.isfinite(v).all()), None)
    if broken:
        raise CheckpointError(f"checkpoint weights are not finite ({broken} holds NaN or inf)")
    return cfg, tok, weights


def config_from_state(state: dict) -> ExperimentConfig:
    """The checkpoint's config. A decoding key this attn-mt does not know is dropped with a warning
    (it decodes as without it); any other unknown or invalid key is a CheckpointError naming the key
    and the version that wrote the checkpoint."""
    raw, known = state["config"], {f.name for f in fields(DecodeConfig)}
    writer = state.get("attn_mt_version")
    writer = (f"attn-mt {writer}" if isinstance(writer, str)
              else "an attn-mt that did not record its version")
    decode = raw.get("decode") if isinstance(raw, dict) else None
    if isinstance(decode, dict) and (unknown := sorted(map(str, decode.keys() - known))):
        log.warning("checkpoint config: %s unknown to attn-mt %s (written by %s): ignored",
                    ", ".join(f"decode.{k}" for k in unknown), VERSION, writer)
        raw = {**raw, "decode": {k: v for k, v in decode.items() if k in known}}
    try:
        return from_dict(raw)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint config is not valid for attn-mt {VERSION} "
                              f"(written by {writer}): {e}") from None


def tokenizer_from_state(tok: object) -> Tokenizer:
    """The checkpoint's SentencePiece model(s), or CheckpointError saying what is wrong with
    them."""
    if not isinstance(tok, dict):
        raise CheckpointError("checkpoint holds no tokenizer" if tok is None else
                              f"checkpoint tokenizer is a {type(tok).__name__}, not SentencePiece "
                              "models")
    protos = tok.get("src_proto"), tok.get("tgt_proto")
    if not isinstance(protos[0], bytes) or not isinstance(protos[1], bytes | None):
        raise CheckpointError("checkpoint tokenizer lacks its SentencePiece model bytes")
    return tokenizer_from_protos(*protos, what="checkpoint tokenizer", vocab=tok.get("vocab"))


def tokenizer_from_protos(src: bytes, tgt: bytes | None, what: str,
                          vocab: object = None) -> Tokenizer:
    """A Tokenizer of SentencePiece model bytes (and a vocabulary numbering their pieces:
    MarianMT's), or CheckpointError naming `what` holds damaged ones."""
    if not src or tgt == b"":
        raise CheckpointError(f"{what}: empty SentencePiece model")
    if vocab is not None and not _vocab_ok(vocab):
        raise CheckpointError(f"{what}: its vocabulary is not lists of pieces with the special ids "
                              "among them")
    try:
        tok = Tokenizer(src, tgt, vocab)
    except (RuntimeError, TypeError) as e:
        raise CheckpointError(f"{what}: not a SentencePiece model ({first_line(e)[:80]})") from None
    if vocab is None and min(tok.src_vocab_size, tok.tgt_vocab_size) <= tok.eos_id:
        raise CheckpointError(f"{what}: SentencePiece model without the special pieces (pad, unk, "
                              "bos, eos)")
    return tok


def _vocab_ok(vocab: object) -> bool:
    """{"src": [str], "tgt": [str] or None, "specials": {pad, unk, bos, eos: id within both}}."""
    if not isinstance(vocab, dict) or not isinstance(vocab.get("specials"), dict):
        return False
    sides = [v for v in (vocab.get("src"), vocab.get("tgt")) if v is not None]
    if not sides or not all(isinstance(v, list) and v and all(isinstance(p, str) for p in v)
                            for v in sides):
        return False
    size = min(map(len, sides))
    return all(isinstance(vocab["specials"].get(k), int) and 0 <= vocab["specials"][k] < size
               for k in ("pad", "unk", "bos", "eos"))


def check_weights(weights: object, expected: dict | None = None) -> dict:
    """`weights` when it is a dict of dense floating-point tensors (of the dtypes attn-mt saves, in
    memory) that fits `expected` (a model's state_dict), else CheckpointError naming the first odd
    weight, or the missing, unexpected or misshapen ones."""
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor)
                                                for v in weights.values()):
        raise CheckpointError(f"checkpoint weights are a {type(weights).__name__}, not a dict of "
                              "tensors")
    for key, v in weights.items():
        odd = (f"has the {str(v.layout).removeprefix('torch.')} layout, not a dense one"
               if v.layout != torch.strided else "is on the meta device (a shape without values)"
               if v.is_meta else f"is {v.dtype}, not float32, bfloat16 or float16"
               if v.dtype not in WEIGHT_DTYPES else None)
        if odd:
            raise CheckpointError(f"checkpoint weight {show(key)} {odd}")
    if expected is None:
        return weights
    missing, unexpected = expected.keys() - weights.keys(), weights.keys() - expected.keys()
    misshapen = [f"{k} {tuple(weights[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
                 if k in weights and weights[k].shape != v.shape]
    problems = [f"{label}: {', '.join(sorted(keys)[:4])}{' ...' if len(keys) > 4 else ''}"
                for label, keys in (("missing", missing), ("unexpected", unexpected),
                                    ("shapes differ", misshapen))
                if keys]
    if problems:
        raise CheckpointError(f"checkpoint weights do not fit the model ({'; '.join(problems)})")
    return weights


def _check_size(shapes: Seq2Seq, weights: dict, max_positions: int) -> None:
    """Refuse a config whose model needs far more memory than its weights hold: with the shapes
    checked, only buffers outside the weights (positions: model.max_positions x d_model) can make up
    the difference."""
    # float32 once built
    need = sum(t.numel() * 4 for t in [*shapes.parameters(), *shapes.buffers()])
    have = sum(v.numel() * v.element_size() for v in weights.values())
    if need > 4 * have + (1 << 30):
        raise CheckpointError(f"checkpoint config asks for a model of {need / 2**30:.1f} GiB, its "
                              f"weights hold {have / 2**20:.1f} MiB "
                              f"(model.max_positions={max_positions}?)")


def load_model(path: Path | str, device: torch.device | str = "cpu",
               ) -> tuple[Seq2Seq, ExperimentConfig, Tokenizer]:
    """(model, config, tokenizer) from a checkpoint file."""
    try:
        return model_from_state(load(path), device)
    except CheckpointError as e:
        if str(e).startswith(str(path)):
            raise
        raise CheckpointError(f"{path}: {e}") from None
