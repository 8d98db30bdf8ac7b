"""Opening "a checkpoint or an export folder" for translation: what `translate`, `evaluate` and `serve` share."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn_mt.checkpoint import CheckpointError
from attn_mt.config import DecodeConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.search import Translation


@dataclass(frozen=True)
class Translator:
    """A loaded model of either kind, with its decode defaults (`.decode`) and tokenizer.

    `model` and `cfg` are set for a PyTorch checkpoint (kind "checkpoint") and None for a
    CTranslate2 export (kind "export"), which has no attention maps to show.
    """

    kind: str
    path: Path
    decode: DecodeConfig
    tok: Tokenizer
    run: Callable[[list[str], DecodeConfig], list[list[Translation]]]
    device: str
    model: Any = None
    cfg: Any = None
    state: dict | None = None  # the checkpoint's step, epoch, best_bleu (or the export's step)

    def translate_nbest(self, texts: list[str], dcfg: DecodeConfig) -> list[list[Translation]]:
        """The `dcfg.nbest` best translations of each text, best first, in input order."""
        return self.run(texts, dcfg)


def open_translator(path: Path | str, device: str = "auto") -> Translator:
    """A checkpoint file (PyTorch) or a directory written by `attn-mt export` (CTranslate2)."""
    from attn_mt.export import ct2_translator as ct2
    from attn_mt.export.ctranslate2 import META

    path = Path(path)
    if ct2.is_export(path):
        dev = ct2.ct2_device(device)
        exported = ct2.load_exported(path, dev)
        step = json.loads((path / META).read_text()).get("step")  # load_exported has read it
        return Translator("export", path, exported.decode, exported.tok,
                          functools.partial(ct2.translate_nbest, exported), dev, state={"step": step})
    from attn_mt import checkpoint
    from attn_mt.decoding.search import translate_nbest
    from attn_mt.device import pick_device

    dev = pick_device(device)
    state = checkpoint.load(path)
    try:
        model, cfg, tok = checkpoint.model_from_state(state, dev)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return Translator("checkpoint", path, cfg.decode, tok, functools.partial(translate_nbest, model, tok, device=dev),
                      str(dev), model, cfg, {k: state.get(k) for k in ("step", "epoch", "best_bleu")})


def hypotheses_json(nbest: list[Translation]) -> list[dict]:
    """One n-best list as the objects of `attn-mt translate --format jsonl` and of `/api/translate`."""
    return [{"text": h.text, "score": round(h.score, 4), "log_prob": round(h.log_prob, 4)} for h in nbest]
