"""Word alignment from cross-attention: which source word gave each target word (Pharaoh links).

A sentence pair is run through the model teacher-forced (forced decoding on the given target),
keeping every layer's cross-attention, (L, H, T + 1, S): row t is the query that *predicts* target
piece t (it reads piece t - 1). A `Method` names which weights to read:

    layer2          the head average of layer 2, read at the row that predicts each target piece
    head2.1         layer 2's head 1 alone (heads named as `attn-mt heads` names them: cross 2.1)
    shift-layer2    Shift-Att (Chen et al. 2020): the row where the piece is the decoder's *input*
                    (row t + 1)
    gdf:layer2      with a reverse-direction model (target -> source): grow-diag-final of both
                    directions' links (Koehn et al. 2003); also union: and intersect:

Pieces to words: the source pieces of a word add their weights (the attention mass the word gets;
the attention on </s> is left out), the target pieces of a word average theirs, then each target
word links to the source word with the most mass: one link per target word, as Garg et al. (2019)
and Chen et al. (2020) score attention. A word starts at a piece that begins with "▁".

One job: attention to word links (methods, pieces to words, two directions joined); pharaoh.py reads
and writes them, analysis/aer.py scores them. Tested in tests/decoding/test_alignment.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.data.batching import pad
from attn_mt.data.checks import clean
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import InputError
from attn_mt.models import AttentionWeights, Seq2Seq

from .pharaoh import Link, format_links

COMBINE = ("union", "intersect", "gdf")
METHOD = re.compile(r"(?:(union|intersect|gdf):)?(shift-)?(?:layer(\d+)|head(\d+)\.(\d+))")


@dataclass(frozen=True)
class Method:
    """Which attention aligns: a layer's head average or one head, at the predicting row or shifted
    (Shift-Att), alone or combined with the reverse model's links."""

    layer: int  # from 1
    head: int | None = None  # from 1; None: the layer's head average
    shift: bool = False
    combine: str | None = None  # one of COMBINE: needs the reverse-direction model

    @property
    def name(self) -> str:
        base = ("shift-" if self.shift else "") + (f"layer{self.layer}" if self.head is None
                                                   else f"head{self.layer}.{self.head}")
        return f"{self.combine}:{base}" if self.combine else base

    @property
    def base(self) -> Method:
        """This method for one direction (no combination)."""
        return Method(self.layer, self.head, self.shift)


def parse_method(name: str, n_layers: int, n_heads: int) -> Method:
    """A method by name (see the module's docstring), checked against the model's layers and
    heads."""
    found = METHOD.fullmatch(name.strip()) if isinstance(name, str) else None
    if found is None:
        raise InputError(f"{name!r} is not a method: expected layerL, headL.H, shift-layerL, "
                         "shift-headL.H, or one of them after union:, intersect: or gdf: (e.g. "
                         "layer2, gdf:shift-head2.1)", "method")
    combine, shift, layer, head_layer, head = found.groups()
    m = Method(int(layer or head_layer), int(head) if head else None, bool(shift), combine)
    if not 1 <= m.layer <= n_layers or not 1 <= (m.head or 1) <= n_heads:
        raise InputError(f"{name}: the model has {n_layers} layer(s) of {n_heads} cross-attention "
                         "head(s), "
                         "counted from 1", "method")
    return m


def all_methods(n_layers: int, n_heads: int, combined: bool = False) -> list[Method]:
    """Every layer's average and every head, each at the predicting row and shifted; with
    `combined`, each also joined with the reverse model's links in every way."""
    bases = [Method(layer, head, shift) for shift in (False, True)
             for layer in range(1, n_layers + 1) for head in (None, *range(1, n_heads + 1))]
    return bases + [Method(m.layer, m.head, m.shift, c) for c in COMBINE for m in bases] * combined


@dataclass(frozen=True)
class Attended:
    """One sentence pair's cross-attention and the word of each piece."""

    weights: Tensor  # (L, H, T + 1, S) float32 on the CPU; row t predicts piece t, the last </s>
    src_words: Tensor  # (S,) the word of each source piece; -1 for </s>
    tgt_words: Tensor  # (T,) the word of each target piece
    n_src: int  # words in the source text
    n_tgt: int  # words in the target text


@dataclass(frozen=True)
class Alignment:
    """A sentence pair's words and links (source word i, target word j), from 0."""

    source_words: list[str]
    target_words: list[str]
    links: list[Link]

    @property
    def pharaoh(self) -> str:
        return format_links(set(self.links))


def word_of_pieces(pieces: list[str], n_words: int) -> list[int]:
    """The word each piece belongs to: a new word at each piece that starts with "▁" (within
    `n_words`)."""
    out, word = [], -1
    for piece in pieces:
        if piece.startswith("▁") or word < 0:
            word += 1
        out.append(min(word, n_words - 1))
    return out


@torch.inference_mode()
def cross_attention(model: Seq2Seq, src: Tensor, tgt_in: Tensor) -> Tensor:
    """Every layer's cross-attention of a teacher-forced batch, (B, L, H, T, S) float32 on the
    CPU."""
    weights = AttentionWeights()
    src_mask = model.src_mask(src)
    model.decode(tgt_in, model.encode(src, src_mask), src_mask, weights=weights)
    return torch.stack(weights.cross, 1).float().cpu()


@torch.inference_mode()
def attend(model: Seq2Seq, tok: Tokenizer, sources: list[str], targets: list[str],
           device: torch.device | str, batch_size: int = 64) -> list[Attended]:
    """Each pair's cross-attention, teacher-forced on the given target, in input order; pieces past
    the model's positions are cut (their words get no links)."""
    limit = model.max_positions - 1
    src_ids = [ids[:limit] for ids in tok.encode_src([clean(s) for s in sources])]
    tgt_ids = [ids[:limit] for ids in tok.encode_tgt([clean(t) for t in targets])]
    order = sorted(range(len(sources)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    out: list[Attended | None] = [None] * len(sources)
    model.eval()
    for k in range(0, len(order), batch_size):
        rows = order[k : k + batch_size]
        src = pad([src_ids[i] + [tok.eos_id] for i in rows], tok.pad_id).to(device)  # (B, S)
        tgt_in = pad([[tok.bos_id, *tgt_ids[i]] for i in rows], tok.pad_id).to(device)  # (B, T + 1)
        cross = cross_attention(model, src, tgt_in)  # (B, L, H, T + 1, S)
        for b, i in enumerate(rows):
            s, t = len(src_ids[i]), len(tgt_ids[i])
            n_src, n_tgt = len(sources[i].split()), len(targets[i].split())
            src_words = word_of_pieces([tok.src.id_to_piece(p) for p in src_ids[i]], n_src) + [-1]
            tgt_words = word_of_pieces(tok.tgt_pieces(tgt_ids[i]), n_tgt)
            out[i] = Attended(cross[b, :, :, : t + 1, : s + 1].clone(), torch.tensor(src_words),
                              torch.tensor(tgt_words, dtype=torch.long), n_src, n_tgt)
    return out  # type: ignore[return-value]


def word_weights(pair: Attended, method: Method) -> Tensor:
    """(target words, source words): the attention `method` reads, summed over each source word's
    pieces and averaged over each target word's."""
    w = pair.weights[method.layer - 1]  # (H, T + 1, S)
    w = w.mean(0) if method.head is None else w[method.head - 1]  # (T + 1, S)
    w = w[1:] if method.shift else w[:-1]  # (T, S): the row of each target piece
    keep = pair.src_words >= 0  # </s> gets no link
    by_src = torch.zeros(w.shape[0], pair.n_src)  # (T, n_src)
    by_src.index_add_(1, pair.src_words[keep], w[:, keep])
    sums = torch.zeros(pair.n_tgt, pair.n_src)  # (n_tgt, n_src)
    sums.index_add_(0, pair.tgt_words, by_src)
    counts = torch.zeros(pair.n_tgt).index_add_(0, pair.tgt_words, torch.ones(len(pair.tgt_words)))
    return sums / counts.clamp(min=1)[:, None]


def links(pair: Attended, method: Method) -> set[Link]:
    """One link per target word that has pieces: to the source word with the most attention."""
    if pair.n_src == 0 or pair.n_tgt == 0 or len(pair.tgt_words) == 0:
        return set()
    best = word_weights(pair, method).argmax(1).tolist()  # (n_tgt,)
    return {(i, j) for j, i in enumerate(best) if j in set(pair.tgt_words.tolist())}


def combine(forward: set[Link], backward: set[Link], how: str) -> set[Link]:
    """Two directions' links (both as (source, target)) joined: union, intersect or gdf
    (grow-diag-final)."""
    if how == "union":
        return forward | backward
    if how == "intersect":
        return forward & backward
    return grow_diag_final(forward, backward)


def grow_diag_final(forward: set[Link], backward: set[Link]) -> set[Link]:
    """Koehn et al. (2003): start from the intersection, add neighbouring links of the union
    (diagonals too) that align a word not yet aligned, until none is added; then each direction's
    links of a word still unaligned (final)."""
    union, out = forward | backward, forward & backward
    src_done, tgt_done = {i for i, _ in out}, {j for _, j in out}

    def add(link: Link) -> None:
        out.add(link)
        src_done.add(link[0])
        tgt_done.add(link[1])

    grown = True
    while grown:
        grown = False
        for i, j in sorted(out):
            for di, dj in ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)):
                n = (i + di, j + dj)
                if n in union and n not in out and (n[0] not in src_done or n[1] not in tgt_done):
                    add(n)
                    grown = True
    for link in [*sorted(forward), *sorted(backward)]:
        if link not in out and (link[0] not in src_done or link[1] not in tgt_done):
            add(link)
    return out


def align(pairs: list[Attended], method: Method, reverse: list[Attended] | None = None,
          ) -> list[set[Link]]:
    """Each pair's links by `method`; a combined method joins them with the links of `reverse` (the
    same pairs' attention in a target -> source model, whose links are turned around)."""
    forward = [links(p, method.base) for p in pairs]
    if method.combine is None:
        return forward
    if reverse is None:
        raise InputError(f"{method.name}: {method.combine} joins two directions: give `reverse` "
                         "too", "method")
    backward = [{(i, j) for j, i in links(p, method.base)} for p in reverse]
    return [combine(f, b, method.combine) for f, b in zip(forward, backward, strict=True)]


def alignments(sources: list[str], targets: list[str], found: list[set[Link]]) -> list[Alignment]:
    """The links with their pairs' words, as `Model.align` gives them."""
    return [Alignment(s.split(), t.split(), sorted(f))
            for s, t, f in zip(sources, targets, found, strict=True)]


def cross_shape(model: Seq2Seq) -> tuple[int, int]:
    """(layers, heads) of a model's cross-attention: the RNN's additive attention is one layer of
    one head."""
    from attn_mt.models.transformer import Transformer

    if isinstance(model, Transformer):
        return len(model.decoder), model.decoder[0].cross_attn.n_heads
    return 1, 1


def default_method(n_layers: int) -> str:
    """The method used where none is named: see docs/alignment.md for the measurements behind it."""
    return f"layer{n_layers}"


def align_texts(model: Seq2Seq, tok: Tokenizer, sources: list[str], targets: list[str],
                method: str | None, device: torch.device | str, batch_size: int = 64,
                reverse: tuple[Seq2Seq, Tokenizer] | None = None) -> list[Alignment]:
    """Each pair's words and links by the method named (None: `default_method`); `reverse` (a target
    -> source model and its tokenizer) for a combined method."""
    layers, heads = cross_shape(model)
    m = parse_method(default_method(layers) if method is None else method, layers, heads)
    back = None
    if m.combine and reverse is not None:
        parse_method(m.base.name, *cross_shape(reverse[0]))  # the reverse model has it too
        back = attend(*reverse, targets, sources, device, batch_size)
    found = attend(model, tok, sources, targets, device, batch_size)
    return alignments(sources, targets, align(found, m, back))
