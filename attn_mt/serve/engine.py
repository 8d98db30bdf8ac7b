"""What the model worker does: translate batches, draw attention maps, and describe the checkpoint."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import torch

from attn_mt import checkpoint
from attn_mt.config import ConfigError, DecodeConfig
from attn_mt.decoding.attention_maps import attention_maps
from attn_mt.decoding.search import translate_nbest
from attn_mt.device import pick_device
from attn_mt.models import count_params

from .api import ApiError

KINDS = ("encoder_self", "decoder_self", "cross")


class Engine:
    """One model with its tokenizer and config; every method but `decode_config` runs in the worker thread."""

    def __init__(self, path: Path, device: str = "auto") -> None:
        self.path, self.device = Path(path), pick_device(device)
        self.model, self.cfg, self.tok = checkpoint.load_model(path, self.device)
        self.state = {k: v for k, v in checkpoint.load(path).items() if k in ("step", "epoch", "best_bleu")}

    def decode_config(self, beam: int | None, alpha: float | None = None, nbest: int | None = None,
                      ) -> DecodeConfig:
        """The checkpoint's decode section with the request's values; nbest defaults to 1."""
        beam = beam or self.cfg.decode.beam_size
        try:
            return replace(self.cfg.decode, beam_size=beam, nbest=nbest or 1,
                           alpha=self.cfg.decode.alpha if alpha is None else alpha)
        except ConfigError:
            raise ApiError(422, "nbest", f"{nbest} exceeds the beam size {beam}") from None

    def translate(self, dcfg: DecodeConfig, texts: list[str]) -> list[dict]:
        """The objects of `attn-mt translate --format jsonl`, one per text, in order."""
        nbests = translate_nbest(self.model, self.tok, texts, dcfg, self.device)
        return [{"source": s, "hypotheses": [{"text": h.text, "score": round(h.score, 4),
                                              "log_prob": round(h.log_prob, 4)} for h in n]}
                for s, n in zip(texts, nbests, strict=True)]

    def attention(self, item: tuple[str, DecodeConfig]) -> dict:
        """Translation, subword tokens and every attention map, weights as [layer][head][query][key]."""
        text, dcfg = item
        translation, maps = attention_maps(self.model, self.tok, text, dcfg, self.device)
        out: dict = {"translation": translation, **{kind: [] for kind in KINDS}}
        for m in sorted(maps, key=lambda m: m.layer):
            out[m.kind].append((torch.round(m.weights.float().cpu() * 1e4) / 1e4).tolist())  # (H, Tq, Tk)
        cross = next(m for m in maps if m.kind == "cross")
        bos = self.tok.tgt_pieces([self.tok.bos_id])
        return {**out, "source_tokens": cross.keys, "target_tokens": cross.queries,
                "target_input_tokens": bos + cross.queries[:-1]}

    def info(self) -> dict:
        """Model facts for the page and /api/info."""
        cfg, tok = self.cfg, self.tok
        bleu = self.state.get("best_bleu")
        return {
            "checkpoint": self.path.name,
            "architecture": asdict(cfg.model),
            "parameters": count_params(self.model),
            "languages": {"source": cfg.data.src_lang, "target": cfg.data.tgt_lang},
            "vocabulary": {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size, "joint": tok.joint},
            "step": self.state.get("step"),
            "epoch": self.state.get("epoch"),
            "valid_bleu": round(bleu, 2) if bleu is not None and bleu >= 0 else None,
            "decode": {"beam": cfg.decode.beam_size, "alpha": cfg.decode.alpha},
            "attention": list(KINDS) if cfg.model.kind == "transformer" else ["cross"],
            "device": str(self.device),
        }
