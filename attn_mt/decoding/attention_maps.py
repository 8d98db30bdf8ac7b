"""Pictures of attention: every head of every layer for one sentence and its translation, as PNGs.

The sentence is translated first (greedy or beam, as configured); then source and output are run
through the model once more, teacher-forced, asking every attention module for its weights
(`AttentionWeights`). A Transformer gives encoder self-, decoder self- and cross-attention; the
RNN has only its additive cross-attention (one layer, one head).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.search import max_lengths, prepare_sources, search
from attn_mt.models import AttentionWeights, Seq2Seq


@dataclass(frozen=True)
class AttentionMap:
    """One layer's attention of one kind: weights (H, queries, keys) and the tokens on each axis."""

    kind: str  # "encoder_self", "decoder_self" or "cross"
    layer: int  # from 1
    weights: Tensor  # (H, Tq, Tk)
    queries: list[str]
    keys: list[str]


@torch.inference_mode()
def attention_maps(model: Seq2Seq, tok: Tokenizer, text: str, cfg: DecodeConfig,
                   device: torch.device | str = "cpu") -> tuple[str, list[AttentionMap]]:
    """Translate `text` and return the translation with every attention map of the model."""
    model.eval()
    src_ids = prepare_sources(tok, [text.strip()], model.max_positions)[0]
    src = torch.tensor([src_ids], device=device)  # (1, S)
    max_len = max_lengths(torch.tensor([len(src_ids)]), cfg, model.max_positions)
    out = search(model, tok, src, max_len, cfg)[0][0].tokens
    tgt_in = torch.tensor([[tok.bos_id, *out]], device=device)  # (1, T)
    weights = AttentionWeights()
    src_mask = model.src_mask(src)
    model.decode(tgt_in, model.encode(src, src_mask, weights), src_mask, weights=weights)
    src_tokens = [tok.src.id_to_piece(i) for i in src_ids]
    tgt_in_tokens = tok.tgt_pieces([tok.bos_id, *out])
    predicted = tok.tgt_pieces([*out, tok.eos_id])  # query t predicts token t + 1
    maps = [AttentionMap("encoder_self", i, w[0], src_tokens, src_tokens)
            for i, w in enumerate(weights.encoder_self, 1)]
    maps += [AttentionMap("decoder_self", i, w[0], predicted, tgt_in_tokens)
             for i, w in enumerate(weights.decoder_self, 1)]
    maps += [AttentionMap("cross", i, w[0], predicted, src_tokens) for i, w in enumerate(weights.cross, 1)]
    return tok.decode_tgt([out])[0], maps


def plot(m: AttentionMap, path: Path) -> Path:
    """One PNG with a panel per head: queries down the side, keys along the bottom."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads when drawing (0.75 s)
    from matplotlib.figure import Figure

    h, tq, tk = m.weights.shape
    panel = max(2.0, 0.22 * max(tq, tk) + 1.0)  # inches; tokens stay readable
    fig = Figure(figsize=(h * panel, panel + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, h, squeeze=False)[0]
    weights = m.weights.float().cpu()
    for head, ax in enumerate(axes):  # one colour scale for all heads, so they compare
        img = ax.imshow(weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=float(weights.max()),
                        aspect="auto")
        ax.set_title(f"head {head + 1}", fontsize=9)
        ax.set_xticks(range(tk), m.keys, rotation=90, fontsize=7)
        ax.set_yticks(range(tq), m.queries if head == 0 else [""] * tq, fontsize=7)
    fig.colorbar(img, ax=list(axes), shrink=0.8)
    title = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
             "cross": "cross-attention (rows: predicted token)"}[m.kind]
    fig.suptitle(f"{title}, layer {m.layer}", fontsize=10)
    fig.savefig(path, dpi=100)
    return path
