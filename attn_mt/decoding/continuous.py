"""Continuous (iteration-level) decoding: sentences join and leave a running batch at every step.

`RunningBatch` holds the sentences being translated together. `add` encodes newcomers (once each)
and appends their rows; `step` runs one decoder step for every row and returns what happened: each
greedy row's new token, each finished beam hypothesis, the sentences that ended (their rows leave).
Rows sit at different positions: the cache keeps a position per row and masks the self-attention
columns a row does not own (`RunningCache`, the Transformer's `KVCache` extended at its seam
`advance`), and `ys` holds each row's tokens right-padded. A step is offline search's
(rules.decode_step, then a chooser), its length rule and choosers extended here for rows at
different steps and sentences that join and leave (`RunningLimit`, `RunningGreedy`, `RunningBeam`).
A sentence's decisions look at its own rows only: its translation depends neither on who shares the
batch nor on when it joined. No threads here: serve/scheduler.py drives it.

One job: decoding a running batch: its cache (`RunningCache`, `begin`), length rule and choosers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from attn_mt.config import DecodeConfig, Penalty
from attn_mt.data.batching import pad
from attn_mt.decoding.beam import Beam, Hypothesis, candidates, length_penalty
from attn_mt.decoding.rules import MaxLength, decode_step, only, step_rules
from attn_mt.decoding.search import Greedy
from attn_mt.decoding.translate import max_lengths, option_rules
from attn_mt.models.cache import KV, KVCache
from attn_mt.models.transformer import Transformer


@dataclass(frozen=True)
class Event:
    """What one step did for a sentence: `kind` "token" (greedy: its ids so far), "hypothesis"
    (beam: a Hypothesis it finished), or "done" (its n-best list, best first; its rows left)."""

    tag: Hashable
    kind: str
    value: object


def supports(model: object) -> bool:
    """Whether `model` can decode in a running batch (a Transformer; the RNN: whole calls only)."""
    return isinstance(model, Transformer)


@dataclass
class RunningCache(KVCache):
    """A `KVCache` whose rows are at different steps (made by `begin`; rows `join` and leave by
    `select`), with each row's position, the self-attention columns that hold its tokens
    (right-aligned: a row that joined late has padding on the left), and the source mask of its
    memory (padded on the right to the longest source)."""

    positions: Tensor  # (B,) tokens each row has decoded
    key_mask: Tensor  # (B, L) True where column l of the self-attention cache is this row's
    memory_mask: Tensor  # (B, 1, 1, S) the source mask of the cross-attention keys

    def advance(self, t: int) -> tuple[Tensor, Tensor]:
        """Before decoding t new positions: their position offset (B, 1), one per row, and the
        self-attention mask (B, 1, 1, L + t); counts them as decoded."""
        offset = self.positions[:, None]
        self.positions = self.positions + t
        self.key_mask = torch.cat([self.key_mask, self.key_mask.new_ones(len(offset), t)], dim=1)
        return offset, self.key_mask[:, None, None, :]

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) of the self-attention caches and of each row's position and
        columns, in place (beam search)."""
        super().reorder(index)
        self.positions, self.key_mask = self.positions[index], self.key_mask[index]

    def select(self, index: Tensor) -> None:
        """Keep rows `index` of everything (rows that leave a running batch, beams that are copied),
        then drop the self-attention columns and source positions no row kept uses."""
        self.reorder(index)
        for kv in self.cross_attn:
            kv.select(index)
        self.memory_mask = self.memory_mask[index]
        used = self.key_mask.any(0)  # (L,) columns some row holds; they end at the last column
        first = int(used.int().argmax()) if bool(used.any()) else used.numel()
        source = self.memory_mask.flatten(1).any(0)  # (S,)
        last = source.numel() - int(source.flip(0).int().argmax()) if bool(source.any()) else 0
        self.key_mask, self.memory_mask = self.key_mask[:, first:], self.memory_mask[..., :last]
        for kv in self.self_attn:
            kv.k, kv.v = kv.k[:, :, first:], kv.v[:, :, first:]
        for kv in self.cross_attn:
            kv.k, kv.v = kv.k[:, :, :last], kv.v[:, :, :last]

    def join(self, other: RunningCache) -> None:
        """Append the rows of `other` after these: self-attention columns right-aligned (the
        shorter padded on the left), sources padded on the right."""
        cols = max(len(self), len(other))
        src = max(self.memory_mask.size(-1), other.memory_mask.size(-1))

        def cat(a: Tensor, b: Tensor, pad: Callable[[Tensor], tuple[int, ...]]) -> Tensor:
            # zeros, or False; only the shorter is padded (the caches are copied once, by cat)
            padded = [F.pad(x, gap, value=False) if any(gap := pad(x)) else x for x in (a, b)]
            return torch.cat(padded)

        for mine, theirs in zip(self.self_attn, other.self_attn, strict=True):  # (B, H, L, Dh)
            mine.k, mine.v = (cat(x, y, lambda t: (0, 0, cols - t.size(2), 0)) for x, y in
                              ((mine.k, theirs.k), (mine.v, theirs.v)))  # L padded on the left
        for mine, theirs in zip(self.cross_attn, other.cross_attn, strict=True):  # (B, H, S, Dh)
            mine.k, mine.v = (cat(x, y, lambda t: (0, 0, 0, src - t.size(2))) for x, y in
                              ((mine.k, theirs.k), (mine.v, theirs.v)))  # S on the right
        self.key_mask = cat(self.key_mask, other.key_mask, lambda t: (cols - t.size(1), 0))
        self.memory_mask = cat(self.memory_mask, other.memory_mask, lambda t: (0, src - t.size(-1)))
        self.positions = torch.cat([self.positions, other.positions])


def begin(model: Transformer, src: Tensor) -> RunningCache:
    """Encode new sentences src (B, S) for a running batch: a cache of B rows at position 0, with
    the cross-attention keys and values of their memory computed once (they join with `join`)."""
    src_mask = model.src_mask(src)  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)  # (B, S, D)
    cross = [KV(*layer.cross_attn.project_kv(memory)) for layer in model.decoder]
    b, h, dh = src.size(0), model.cfg.n_heads, model.d_model // model.cfg.n_heads
    empty = memory.new_zeros(b, h, 0, dh)  # (B, H, 0, Dh): nothing decoded yet
    return RunningCache([KV(empty, empty) for _ in model.decoder], cross,
                        positions=torch.zeros(b, dtype=torch.long, device=src.device),
                        key_mask=torch.zeros(b, 0, dtype=torch.bool, device=src.device),
                        memory_mask=src_mask)


class RunningLimit(MaxLength):
    """`MaxLength` for rows at different steps: `step` is each row's own (R,)."""

    def apply(self, step: Tensor, logp: Tensor, predicted: Tensor) -> Tensor:
        forced = self.forced(step)  # (R,)
        return only(logp, torch.where(forced, self.eos_id, -1)) if bool(forced.any()) else logp


class RunningGreedy(Greedy):
    """Greedy search's chooser over sentences that join (`join`) and leave (`keep`) a running
    batch, each with its own length penalty; `choose` takes each row's step (R,), elementwise."""

    def __init__(self, max_len: Tensor, eos_id: int, alpha: list[float | Penalty]) -> None:
        super().__init__(max_len, eos_id)
        self.alpha, self.limit = list(alpha), RunningLimit(max_len, eos_id)

    def closed(self) -> list[int]:  # the sentences that have ended, in order (they leave)
        return self.ended.nonzero()[:, 0].tolist()

    def results(self, ys: Tensor, sentences: list[int]) -> list[list[Hypothesis]]:
        """The one-hypothesis n-best lists of these sentences (ys: (R, 1 + W), right-padded)."""
        idx = torch.tensor(sentences, dtype=torch.long, device=ys.device)
        outs = zip(sentences, ys[idx, 1:].tolist(), self.log_prob[idx].tolist(), strict=True)
        return [[self.hypothesis(out, lp, self.alpha[s])] for s, out, lp in outs]

    def keep(self, sentences: list[int]) -> None:
        """Only these sentences (indices, in order) stay; their rows are the caller's to keep."""
        idx = torch.tensor(sentences, dtype=torch.long, device=self.log_prob.device)
        self.log_prob, self.ended = self.log_prob[idx], self.ended[idx]
        self.alpha = [self.alpha[s] for s in sentences]
        self.limit = RunningLimit(self.limit.max_len[idx], self.eos_id)

    def join(self, other: RunningGreedy) -> None:
        """other's sentences come after these."""
        self.log_prob = torch.cat([self.log_prob, other.log_prob])
        self.ended, self.alpha = torch.cat([self.ended, other.ended]), self.alpha + other.alpha
        self.limit = RunningLimit(torch.cat([self.limit.max_len, other.limit.max_len]), self.eos_id)


class RunningBeam(Beam):
    """Beam search's chooser over sentences that join (`join`) and leave (`keep`) a running batch,
    each with its own length penalty and n-best size."""

    fresh: Sequence[tuple[int, Hypothesis]] = ()  # (sentence, hypothesis) the last step finished

    def __init__(self, max_len: Tensor, eos_id: int, k: int, alpha: list[float | Penalty],
                 nbest: list[int]) -> None:
        super().__init__(max_len, eos_id, k)
        self.alpha, self.n = list(alpha), list(nbest)  # DecodeConfig has checked 1 <= nbest <= k
        self._limit(max_len)

    def _limit(self, max_len: Tensor) -> None:
        self.max_len, self.last = max_len, max_len.tolist()  # (B,)
        self.limit = RunningLimit(max_len.repeat_interleave(self.k), self.eos_id)  # (B*k,)

    def choose(self, step: Tensor, logp: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """`Beam.choose` with each row's own step (B*k,); ys (B*k, 1 + W) right-padded."""
        b, k = self.scores.shape
        at = step.view(b, k)[:, 0]  # (B,) each sentence's step
        before = [len(f) for f in self.finished]
        c = candidates(self.scores, logp.view(b, k, -1), self.eos_id)
        self.scores = c.scores
        self.settle(c, ys, at.tolist(), self.bounds(at + 2))
        new = enumerate(zip(before, self.finished, strict=True))
        self.fresh = [(s, h) for s, (n, f) in new for h in f[n:]]
        return self.follow(c)

    def bounds(self, length: Tensor) -> list[float]:
        """`best_possible` of each sentence at its own length (B,) and alpha, one call per alpha:
        the core's values (a float there), rounded once to float32."""
        alphas, bound = set(self.alpha), [0.0] * len(self.alpha)
        for a in alphas:
            group = [s for s, x in enumerate(self.alpha) if x == a]
            idx = torch.tensor(group, device=self.scores.device) if len(alphas) > 1 else slice(None)
            least = length_penalty(length[idx].double(), a).float()  # (G,)
            lp = length_penalty(self.max_len[idx].float(), a).clamp(min=least)
            for s, v in zip(group, (self.scores[idx].max(dim=1).values / lp).tolist(), strict=True):
                bound[s] = v
        return bound

    def closed(self) -> list[int]:  # the sentences whose search is over, in order (they leave)
        return [s for s in range(len(self.finished)) if s not in self.active]

    def results(self, ys: Tensor, sentences: list[int]) -> list[list[Hypothesis]]:
        """The n-best lists of these sentences, best first."""
        return [sorted(self.finished[s], key=lambda h: -h.score)[: self.n[s]] for s in sentences]

    def keep(self, sentences: list[int]) -> None:
        """Only these sentences (indices, in order) stay; their rows are the caller's to keep."""
        idx = torch.tensor(sentences, dtype=torch.long, device=self.scores.device)
        self.scores = self.scores[idx]
        self.active = {j for j, s in enumerate(sentences) if s in self.active}
        self.finished = [self.finished[s] for s in sentences]
        self.alpha, self.n = [self.alpha[s] for s in sentences], [self.n[s] for s in sentences]
        self._limit(self.max_len[idx])

    def join(self, other: RunningBeam) -> None:
        """other's sentences come after these."""
        b = len(self.finished)
        self.scores = torch.cat([self.scores, other.scores])
        self.active |= {s + b for s in other.active}
        self.finished += other.finished
        self.alpha, self.n = self.alpha + other.alpha, self.n + other.n
        self._limit(torch.cat([self.max_len, other.max_len]))


class RunningBatch:
    """Sentences decoded together, each with k = `cfg.beam_size` consecutive rows (greedy: one), by
    the search's step (rules.decode_step) and its choosers, extended so sentences join and leave.

    Args:
        model: a Transformer in eval mode (add, step and drop run under torch.inference_mode).
        cfg: every sentence's settings (beam, length limits, options' rules) but alpha and n-best,
            each one's own (`add`'s `cfgs`, else these): settings that share shapes share calls.
    """

    def __init__(self, model: Transformer, cfg: DecodeConfig, *, bos_id: int, eos_id: int,
                 pad_id: int) -> None:
        self.model, self.cfg, self.k = model, cfg, cfg.beam_size
        self.rules = option_rules(cfg, eos_id)  # those of its decode options, for every sentence
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.cache: RunningCache | None = None  # of all rows, from begin
        self.chooser: RunningGreedy | RunningBeam | None = None  # each sentence's, in row order
        self.tags: list[Hashable] = []  # (n,) the sentences, in row order
        self.steps: list[int] = []  # (n,) tokens each has decoded
        self.ys: Tensor | None = None  # (n*k, 1 + W) bos and each row's tokens so far, right-padded

    def __len__(self) -> int:  # sentences
        return len(self.tags)

    @property
    def rows(self) -> int:
        return len(self.tags) * self.k

    @torch.inference_mode()
    def add(self, items: list[tuple[Hashable, list[int]]],
            cfgs: list[DecodeConfig] | None = None) -> None:
        """Sentences (tag, source ids with eos) join; they take part from the next step on. `cfgs`:
        each one's settings (alpha, nbest; every other must be this batch's)."""
        if not items:
            return
        cfgs = cfgs or [self.cfg] * len(items)
        if any(replace(c, alpha=self.cfg.alpha, nbest=self.cfg.nbest) != self.cfg for c in cfgs):
            raise ValueError("a sentence's beam size and length limits (every setting but alpha "
                             "and n-best) must be its running batch's")
        dev = next(self.model.parameters()).device
        src = pad([ids for _, ids in items], self.pad_id).to(dev)  # (m, S)
        cache = begin(self.model, src)
        m, k = len(items), self.k
        if k > 1:
            cache.select(torch.arange(m, device=dev).repeat_interleave(k))  # (m*k): k beams each
        lens, alpha = torch.tensor([len(ids) for _, ids in items]), [c.penalty for c in cfgs]
        limit = max_lengths(lens, self.cfg, self.model.max_positions).to(dev)
        chooser = (RunningGreedy(limit, self.eos_id, alpha) if k == 1 else
                   RunningBeam(limit, self.eos_id, k, alpha, [c.nbest for c in cfgs]))
        ys = torch.full((m * k, 1 if self.ys is None else self.ys.size(1)), self.pad_id, device=dev)
        ys[:, 0] = self.bos_id
        if self.cache is None:
            self.cache, self.chooser, self.ys = cache, chooser, ys
        else:
            self.cache.join(cache)
            self.chooser.join(chooser)
            self.ys = torch.cat([self.ys, ys])
        self.tags += [tag for tag, _ in items]
        self.steps += [0] * m

    @torch.inference_mode()
    def drop(self, tags: set[Hashable]) -> None:
        """Sentences nobody waits for leave now."""
        self._keep([s for s, tag in enumerate(self.tags) if tag not in tags])

    @torch.inference_mode()
    def step(self) -> list[Event]:
        """One decoder step for every row; its events in row order: greedy's new token of each
        sentence (or its end), beam's finished hypotheses, then the sentences that ended."""
        if not self.tags:
            return []
        chooser, k = self.chooser, self.k
        step = torch.tensor(self.steps, device=self.ys.device).repeat_interleave(k)  # (R,)
        if self.ys.size(1) < max(self.steps) + 2:  # room for this step's token
            self.ys = torch.cat([self.ys, torch.full_like(self.ys[:, :1], self.pad_id)], dim=1)
        rules = step_rules(self.model, self.rules, chooser.limit)  # the limit: a RunningLimit
        tgt_in = self.ys.gather(1, step[:, None])  # (R, 1) each row's newest token
        logp = decode_step(self.model, tgt_in, None, self.cache.memory_mask, self.cache,
                           step=step, predicted=self.ys[:, 1:], rules=rules)  # (R, V)
        out, moved = chooser.choose(step, logp, self.ys)
        if moved is not None:
            self.ys = self.ys[moved]
        self.ys.scatter_(1, step[:, None] + 1, out[:, None])
        closed = chooser.closed()
        ended = dict(zip(closed, chooser.results(self.ys, closed), strict=True)) if closed else {}
        if k == 1:  # each sentence's tokens so far, or its end
            rows = self.ys.tolist()
            events = [Event(tag, "done", ended[s]) if s in ended else
                      Event(tag, "token", tuple(rows[s][1 : self.steps[s] + 2]))
                      for s, tag in enumerate(self.tags)]
        else:
            events = [Event(self.tags[s], "hypothesis", hyp) for s, hyp in chooser.fresh]
            events += [Event(self.tags[s], "done", nbest) for s, nbest in ended.items()]
        self.steps = [s + 1 for s in self.steps]
        self._keep([s for s in range(len(self.tags)) if s not in ended], moved)
        return events

    def _keep(self, sentences: list[int], moved: Tensor | None = None) -> None:
        """Keep these sentences (indices, in order) and their rows; the rest leave the batch.
        `moved`: the cache rows that the rows are to take first (beam search's), else they stay
        where they are. One copy of the cache either way: moving and leaving are one select."""
        if len(sentences) == len(self.tags):
            if moved is not None:
                self.cache.reorder(moved)
            return
        k = self.k
        rows = [s * k + j for s in sentences for j in range(k)]
        self.tags = [self.tags[s] for s in sentences]
        self.steps = [self.steps[s] for s in sentences]
        if not sentences:
            self.cache = self.chooser = self.ys = None
            return
        self.chooser.keep(sentences)
        keep = torch.tensor(rows, device=self.ys.device)
        self.ys = self.ys[keep, : max(self.steps) + 1]  # (the beams' moves are in ys already)
        self.cache.select(keep if moved is None else moved[keep])
