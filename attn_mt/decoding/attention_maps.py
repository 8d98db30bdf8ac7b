"""Pictures of attention: every head of every layer for one sentence and its translation, as PNGs.

The sentence is translated first (greedy or beam, as configured); then source and output are run
through the model once more, teacher-forced, asking every attention module for its weights
(`AttentionWeights`). A Transformer gives encoder self-, decoder self- and cross-attention; the
RNN has only its additive cross-attention (one layer, one head).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.translate import max_lengths, prepare_sources, search
from attn_mt.models import AttentionWeights, Seq2Seq


@dataclass(frozen=True)
class AttentionMap:
    """One layer's attention of one kind: weights (H, queries, keys) and the tokens on each axis."""

    kind: str  # "encoder_self", "decoder_self" or "cross"
    layer: int  # from 1
    weights: Tensor  # (H, Tq, Tk)
    queries: list[str]
    keys: list[str]


@dataclass(frozen=True)
class Forced:
    """One sentence translated, then run through the model again teacher-forced: its ids and
    tokens."""

    src: Tensor  # (1, S) the source ids, </s> last
    out: list[int]  # (T - 1) the translation's ids, without <s> and </s>
    translation: str
    source_tokens: list[str]  # (S)
    target_in: list[str]  # (T) <s> and the translation: what the decoder reads
    predicted: list[str]  # (T) the translation and </s>: what query t predicts


@torch.inference_mode()
def translate_then_force(model: Seq2Seq, tok: Tokenizer, text: str, cfg: DecodeConfig,
                         device: torch.device | str = "cpu", *,
                         weights: AttentionWeights | None = None, stepwise: bool = False,
                         watch: AbstractContextManager = nullcontext(), target: str | None = None,
                         target_ids: list[int] | None = None) -> Forced:
    """Translate `text` with `cfg` (or take the given `target` as its translation, or the token ids
    `target_ids` a decode gave it: never re-tokenized), then run source and translation through
    `model` once more, teacher-forced, inside `watch` (e.g. a hook recording a module): the decoder
    at once, `weights` collecting every attention map, or with `stepwise` a token at a time with its
    cache, as translation runs it (the encoder's maps only)."""
    model.eval()
    src_ids = prepare_sources(tok, [text.strip()], model.max_positions)[0]
    src = torch.tensor([src_ids], device=device)  # (1, S)
    if target_ids is not None:
        out = list(target_ids)[: model.max_positions - 1]
    elif target is None:
        max_len = max_lengths(torch.tensor([len(src_ids)]), cfg, model.max_positions)
        out = search(model, tok, src, max_len, cfg)[0][0].tokens
    else:  # pieces as `score` reads them: truncated so that they, <s> and </s> fit the positions
        out = tok.encode_tgt([target.strip()])[0][: model.max_positions - 1]
    tgt_in = [tok.bos_id, *out]  # (T)
    with watch:
        src_mask = model.src_mask(src)  # (1, 1, 1, S)
        memory = model.encode(src, src_mask, weights)  # (1, S, D)
        if stepwise:
            cache = model.new_cache()
            for y in tgt_in:
                model.decode(torch.tensor([[y]], device=device), memory, src_mask, cache)
        else:
            model.decode(torch.tensor([tgt_in], device=device), memory, src_mask, weights=weights)
    return Forced(src, out, tok.decode_tgt([out])[0], [tok.src.id_to_piece(i) for i in src_ids],
                  tok.tgt_pieces(tgt_in), tok.tgt_pieces([*out, tok.eos_id]))


def attention_maps(model: Seq2Seq, tok: Tokenizer, text: str, cfg: DecodeConfig,
                   device: torch.device | str = "cpu", target: str | None = None,
                   target_ids: list[int] | None = None) -> tuple[str, list[AttentionMap]]:
    """Translate `text` (or take `target`, or the ids `target_ids`, as its translation,
    teacher-forced) and return the translation with every attention map of the model."""
    weights = AttentionWeights()
    f = translate_then_force(model, tok, text, cfg, device, weights=weights, target=target,
                             target_ids=target_ids)
    maps = [AttentionMap("encoder_self", i, w[0], f.source_tokens, f.source_tokens)
            for i, w in enumerate(weights.encoder_self, 1)]
    maps += [AttentionMap("decoder_self", i, w[0], f.predicted, f.target_in)
             for i, w in enumerate(weights.decoder_self, 1)]
    maps += [AttentionMap("cross", i, w[0], f.predicted, f.source_tokens) for i,
             w in enumerate(weights.cross, 1)]
    return f.translation, maps


def plot(m: AttentionMap, path: Path) -> Path:
    """One PNG with a panel per head: queries down the side, keys along the bottom."""
    # matplotlib loads when drawing (0.75 s)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
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
