"""Subword sampling (train.subword_sampling) drawn by our own seeded generator over a SentencePiece
model's pieces, so that a draw depends only on its seed: BPE-dropout for a BPE model (Provilkov et
al. 2020: each merge, taken best score first as SentencePiece does, is skipped with probability
`alpha`), and for a unigram model a segmentation drawn from the lattice with probability
proportional to prod exp(alpha * score) (Kudo 2018, SentencePiece's sampling with nbest_size=-1).
SentencePiece's own sampling (0.2.x) draws from a generator its seed call does not reset, so its
draws differed from process to process and broke exact resume.

    >>> sampler = Sampler(tok.src)  # a SentencePieceProcessor, or data/pieces.py's MappedPieces
    >>> sampler.resample(ids, 0.1, random.Random(seed))  # new ids, the same text
    >>> resample_src(tok, batch_ids, 0.1, seed, limit)  # a Tokenizer's source sentences, as
                                                        corpus.py asks

Tested in tests/data/test_sampling.py (two processes draw the same).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_mt.data.tokenizer import Tokenizer


class Sampler:
    """The pieces of `model` (a SentencePieceProcessor, or MappedPieces: the ids are then its
    vocabulary's) with their scores, for drawing new segmentations of already tokenized sentences
    word by word."""

    def __init__(self, model) -> None:
        self.model = model
        sp = getattr(model, "sp", model)  # MappedPieces numbers the pieces of a SentencePiece model
        normal = [i for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i)
                                                                or sp.is_unused(i))]
        self.scores = {sp.id_to_piece(i): sp.get_score(i) for i in normal}
        self.longest = max(map(len, self.scores), default=1)
        # SentencePiece's, for a character it lacks
        self.unk_score = min(self.scores.values(), default=0.0) - 10.0
        self.bpe = _is_bpe(sp)
        # by id, looked up once
        self.pieces = [model.id_to_piece(i) for i in range(model.get_piece_size())]
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        # unigram: each word's lattice, by (word, alpha)
        self.lattices: dict[tuple[str, float], list] = {}

    def resample(self, ids: list[int], alpha: float, rnd: random.Random) -> list[int]:
        """`ids` segmented anew: each word (a run of the model's pieces from one starting with ▁)
        drawn again; other pieces (unknown, specials, a Marian language code) stay as they are."""
        out: list[int] = []
        word: list[int] = []
        for i in ids:
            piece = self.pieces[i]
            if piece in self.scores and not (piece.startswith("▁") and word):
                word.append(i)
                continue
            out += self._draw(word, alpha, rnd) if word else []
            word = [i] if piece in self.scores else []
            if piece not in self.scores:
                out.append(i)
        return out + (self._draw(word, alpha, rnd) if word else [])

    def _draw(self, ids: list[int], alpha: float, rnd: random.Random) -> list[int]:
        """One word's pieces `ids` drawn anew."""
        word = "".join(self.pieces[i] for i in ids)
        # BPE-dropout: the deterministic merges (as many as the word has characters less pieces)
        if self.bpe:
            # each kept unless < alpha
            draws = [rnd.random() for _ in range(len(word) - len(ids) if alpha else 0)]
            if all(d >= alpha for d in draws):
                return ids  # no merge skipped: SentencePiece's own segmentation, which `ids` is
            pieces = bpe_dropout(word, self.scores, alpha,
                                 itertools.chain(draws, iter(rnd.random, None)))
        else:
            pieces = unigram_sample(word, self.scores, alpha, rnd, self.longest, self.unk_score,
                                    self.lattices)
        return [self.ids[p] if p in self.ids else self.model.piece_to_id(p) for p in pieces]


_samplers: weakref.WeakKeyDictionary[Tokenizer, Sampler] = weakref.WeakKeyDictionary()


def resample_src(tok: Tokenizer, ids: list[list[int]], alpha: float, seed: int,
                 limit: int) -> list[list[int]]:
    """The source sentences `ids` split anew (BPE-dropout at rate `alpha`, or a unigram model's
    sampling with smoothing `alpha`), drawn from `seed` alone: the same in every process; a sentence
    whose sample is longer than `limit` pieces keeps its ids. The tokenizer's `Sampler` is made on
    first use and kept while the tokenizer lives."""
    sampler = _samplers.get(tok)
    if sampler is None:
        sampler = _samplers[tok] = Sampler(tok.src)
    rnd = random.Random(seed)
    new = [sampler.resample(x, alpha, rnd) for x in ids]
    return [n if len(n) <= limit else x for x, n in zip(ids, new, strict=True)]


def _is_bpe(sp) -> bool:
    """A BPE model (SentencePiece gives n-best segmentations of unigram models only)."""
    try:
        sp.nbest_encode("a", nbest_size=2)
    except RuntimeError:
        return True
    return False


def bpe_dropout(word: str, scores: dict[str, float], p: float, draws: Iterator[float]) -> list[str]:
    """BPE on the characters of `word`: the adjacent pair whose merge has the best score (the
    leftmost of equal ones) is merged, or skipped for good where the next of `draws` (uniform in [0,
    1)) is below `p`; until no pair is left. A skipped pair cannot come back: its symbols only ever
    grow into others."""
    spans = [(i, i + 1) for i in range(len(word))]  # symbols as [start, end) of word
    # merging symbol k and k + 1
    gain = [scores.get(word[i : i + 2], -math.inf) for i in range(len(word) - 1)]

    def pair(k: int) -> float:
        return scores.get(word[spans[k][0] : spans[k + 1][1]], -math.inf)

    while gain:
        at = max(range(len(gain)), key=gain.__getitem__)  # the first of the best
        if gain[at] == -math.inf:
            break
        if p and next(draws) < p:
            gain[at] = -math.inf
            continue
        spans[at : at + 2] = [(spans[at][0], spans[at + 1][1])]
        del gain[at]
        if at > 0:
            gain[at - 1] = pair(at - 1)
        if at < len(gain):
            gain[at] = pair(at)
    return [word[a:b] for a, b in spans]


def lattice(word: str, scores: dict[str, float], alpha: float, longest: int,
            unk_score: float) -> list[tuple[list[int], list[float]]]:
    """For each end j of `word`: the starts i of the pieces word[i:j] and the cumulative
    probabilities of choosing each, given everything before j, with weights prod exp(alpha *
    score(piece)) (forward sums; a character the model lacks: unk_score)."""
    n = len(word)
    fwd = [0.0] + [-math.inf] * n  # log of the summed weight of every segmentation of word[:j]
    out: list[tuple[list[int], list[float]]] = [([], [])]
    for j in range(1, n + 1):
        starts, logw = [], []
        for i in range(max(0, j - longest), j):
            score = scores.get(word[i:j], unk_score if j - i == 1 else None)
            if score is not None and fwd[i] > -math.inf:
                starts.append(i)
                logw.append(fwd[i] + alpha * score)
        top = max(logw)
        weights = [math.exp(w - top) for w in logw]
        fwd[j] = top + math.log(sum(weights))
        out.append((starts, list(itertools.accumulate(w / sum(weights) for w in weights))))
    return out


def unigram_sample(word: str, scores: dict[str, float], alpha: float, rnd: random.Random,
                   longest: int, unk_score: float, cache: dict | None = None) -> list[str]:
    """A segmentation of `word` drawn with probability proportional to prod exp(alpha *
    score(piece)): pieces drawn backward from the end over its `lattice` (kept in `cache` by (word,
    alpha): words recur)."""
    key = (word, alpha)
    table = cache.get(key) if cache is not None else None
    if table is None:
        table = lattice(word, scores, alpha, longest, unk_score)
        if cache is not None:
            if len(cache) >= 500_000:  # bounded: a new epoch's words mostly come back
                cache.clear()
            cache[key] = table
    pieces, j = [], len(word)
    while j > 0:
        starts, cumulative = table[j]
        start = starts[min(bisect.bisect_right(cumulative, rnd.random()), len(starts) - 1)]
        pieces.append(word[start:j])
        j = start
    return pieces[::-1]
