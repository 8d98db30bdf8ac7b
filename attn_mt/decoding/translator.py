"""A loaded model behind one interface, `Translator`, for `translate`, `evaluate` and `serve`; here the PyTorch
checkpoint kind (export/ct2_translator.py makes the CTranslate2 kind and chooses between the two)."""

from __future__ import annotations

import functools
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


def checkpoint_translator(path: Path | str, device: str = "auto") -> Translator:
    """A PyTorch checkpoint file written by `attn-mt train`, ready to translate (an export folder: export's
    `open_translator`, which chooses between the two)."""
    from attn_mt import checkpoint
    from attn_mt.decoding.search import translate_nbest
    from attn_mt.device import pick_device

    path, dev = Path(path), pick_device(device)
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
