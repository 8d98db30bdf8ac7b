"""The head that resolves "it": how each head's attention from a pronoun splits between its
antecedent and the other noun, on the items of a contrastive set that give word positions (ours:
data/pronoun.py writes them), and what masking heads does to the contrastive accuracy.

The query and keys of each kind of head, on the teacher-forced reference:
    encoder   query: the source pronoun; keys: the source antecedent and the other source noun;
    cross     query: the decoder position that predicts the target pronoun (its input is the word
              before); keys: as the encoder's, in the source;
    decoder   query: as cross; keys: the target antecedent and the other target noun (both come
              earlier).
A word's weight is the sum over its subword pieces (the query: the pronoun's first piece). A head
resolves an item when the antecedent's weight exceeds the other noun's; its resolution accuracy is
the share of the items it resolves ("always the nearer noun" or "always the subject" gets about
half, by construction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.data.batching import collate
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.contrastive import ContrastiveReport, Item, evaluate_contrastive
from attn_mt.decoding.scoring import score_texts
from attn_mt.models import AttentionWeights
from attn_mt.models.transformer import Transformer

BATCH = 50  # items per teacher-forced batch
TOP = (1, 2, 4)  # the top resolving heads of a kind masked together


def word_pieces(sp, text: str) -> list[list[int]]:
    """The piece positions of each space-separated word of `text` (`sp`: one side's SentencePiece
    processor); [] where the pieces do not split into as many words (a piece that starts with "▁"
    starts a word)."""
    words: list[list[int]] = []
    for j, piece in enumerate(sp.encode(text, out_type=str)):
        if piece.startswith("\u2581") or not words:
            words.append([])
        words[-1].append(j)
    # positions count words between single spaces
    return words if len(words) == len(text.split(" ")) else []


@dataclass(frozen=True)
class Located:
    """An item's pieces: the source pronoun's first piece, the antecedent's and the other noun's
    pieces in the source and in the decoder input (bos first), and the decoder position that
    predicts the target pronoun."""

    src_ids: list[int]
    tgt_ids: list[int]
    src_pronoun: int
    src_antecedent: list[int]
    src_other: list[int]
    tgt_query: int
    tgt_antecedent: list[int]
    tgt_other: list[int]


def locate(item: Item, tok: Tokenizer, limit: int) -> Located | None:
    """Where the item's words are among its pieces, or None (no positions; pieces that do not map to
    words; a word beyond the model's `limit` positions)."""
    sp, tp = item.src_positions, item.tgt_positions
    if not sp or not tp or not {"pronoun", "antecedent", "other"} <= set(sp) & set(tp):
        return None
    src_words, tgt_words = word_pieces(tok.src, item.src), word_pieces(tok.tgt, item.ref)
    if max(sp.values()) >= len(src_words) or max(tp.values()) >= len(tgt_words):
        return None
    src_ids, tgt_ids = tok.encode_src([item.src])[0], tok.encode_tgt([item.ref])[0]
    if max(len(src_ids), len(tgt_ids)) >= limit:  # collate adds eos (and bos)
        return None
    # the decoder input is [bos, t0, t1, ...]: position j predicts t_j, and t_j itself sits at j + 1
    return Located(src_ids, tgt_ids, src_words[sp["pronoun"]][0], src_words[sp["antecedent"]],
                   src_words[sp["other"]], tgt_words[tp["pronoun"]][0],
                   [j + 1 for j in tgt_words[tp["antecedent"]]],
                   [j + 1 for j in tgt_words[tp["other"]]])


@dataclass
class Resolution:
    """Per head (a kind's layers x heads): how many items it resolved and its summed weights."""

    resolved: Tensor  # (L, H)
    antecedent: Tensor  # (L, H)
    other: Tensor  # (L, H)
    items: int = 0

    def row(self, layer: int, head: int) -> dict[str, float]:
        n = max(self.items, 1)
        return {"resolved": round(float(self.resolved[layer, head]) / n, 4),
                "antecedent": round(float(self.antecedent[layer, head]) / n, 4),
                "other": round(float(self.other[layer, head]) / n, 4)}


@torch.inference_mode()
def resolution(model: Transformer, tok: Tokenizer, items: Sequence[Item], device: torch.device,
               ) -> tuple[dict[str, Resolution], int]:
    """Each kind's Resolution over the items that can be located; and how many could."""
    located = [x for x in (locate(i, tok, model.max_positions) for i in items) if x is not None]
    layers, heads = len(model.encoder), model.cfg.n_heads
    out = {k: Resolution(*(torch.zeros(layers, heads, dtype=torch.float64) for _ in range(3)),
                         len(located))
           for k in ("encoder", "decoder", "cross")}
    model.eval()
    for start in range(0, len(located), BATCH):
        chunk = located[start : start + BATCH]
        batch = collate([x.src_ids for x in chunk], [x.tgt_ids for x in chunk], tok.pad_id,
                        tok.bos_id, tok.eos_id)
        weights = AttentionWeights()
        src, tgt_in = batch.src.to(device), batch.tgt_in.to(device)
        src_mask = model.src_mask(src)
        model.decode(tgt_in, model.encode(src, src_mask, weights), src_mask, weights=weights)
        tally(out, chunk, {"encoder": weights.encoder_self, "decoder": weights.decoder_self,
                           "cross": weights.cross})
    return out, len(located)


def tally(out: dict[str, Resolution], located: Sequence[Located],
          maps: dict[str, Sequence[Tensor]]) -> None:
    """Add each head's weights from the pronoun to `out`: `maps` holds a kind's weights, per layer
    (B, H, Tq, Tk), row b the teacher-forced `located[b]` (the attention history records its probes'
    maps with it)."""
    for kind, layers in maps.items():
        for layer, w in enumerate(layers):  # (B, H, Tq, Tk)
            w = w.float().cpu()
            for b, x in enumerate(located):
                q, ante, other = ((x.src_pronoun, x.src_antecedent, x.src_other)
                                  if kind == "encoder"
                                  else (x.tgt_query, x.tgt_antecedent, x.tgt_other) if kind
                                  == "decoder" else (x.tgt_query, x.src_antecedent, x.src_other))
                a, o = w[b, :, q, ante].sum(-1).double(), w[b, :, q, other].sum(-1).double()  # (H,)
                r = out[kind]
                r.resolved[layer] += (a > o).double()
                r.antecedent[layer] += a
                r.other[layer] += o


def accuracy(model: Transformer, tok: Tokenizer, items: Sequence[Item],
             device: torch.device) -> ContrastiveReport:
    """The contrastive accuracy of the model as it is now (masked heads included)."""
    return evaluate_contrastive(lambda s, t: score_texts(model, tok, s, t, device=device), items)
