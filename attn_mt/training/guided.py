"""Guided alignment (Garg et al. 2019; OpenNMT's lambda_align): one cross-attention head learns to
match given word links, beside the token loss.

`train.guided_alignment` is a Pharaoh file line-aligned with the training text: line i holds the
links `i-j` (or `ipj`: both count) of pair i, words the whitespace tokens. `read_links` checks every
line against its pair and keeps the pairs the data cache keeps (sources.py drops empty ones). A
step's index batches name its pairs (the epoch's plan sorts and cuts indices, so the links follow
the pairs through length filtering, sorting and batching); `Links` gives each collated batch the
links between its pieces (`GuidedBatch.links`: a piece belongs to the word it starts or continues,
as decoding/alignment.py reads words). `GuidedLoss` adds train.guided_weight times the
cross-entropy of the guided head's attention against the links, each target piece's row
normalised; target pieces with no link are left out. The head's weights are recomputed from the
inputs a forward hook saw (the fused kernel returns none), for that head alone.

Tested in tests/training/test_guided.py.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn_mt.config import ExperimentConfig, TrainConfig
from attn_mt.config.yamlconf import ConfigError
from attn_mt.data.batching import Batch
from attn_mt.data.corpus import Corpus
from attn_mt.data.lines import DataError
from attn_mt.data.sources import non_empty, source
from attn_mt.decoding.pharaoh import parse_line
from attn_mt.errors import InputError
from attn_mt.models.transformer import Transformer

KEY = "train.guided_alignment"


@dataclass
class GuidedBatch(Batch):
    """A Batch with its pairs' links between pieces."""

    links: Tensor  # (B, T, S) bool: target piece t (of tgt_out) linked with source piece s

    def to(self, device: torch.device) -> GuidedBatch:
        moved = super().to(device)
        return GuidedBatch(moved.src, moved.tgt_in, moved.tgt_out, moved.n_tokens,
                           self.links.to(device, non_blocking=device.type == "cuda"))


@dataclass(frozen=True)
class PairLinks:
    """The links of each training pair: pair p's are `links[offsets[p]:offsets[p + 1]]`."""

    links: np.ndarray  # (M, 2) int32 (source word, target word)
    offsets: np.ndarray  # (N + 1,) int64
    words: np.ndarray  # (N, 2) int32: words in the source and the target


def read_links(path: Path, cfg: ExperimentConfig) -> PairLinks:
    """The links of every pair the training split keeps, from a Pharaoh file line-aligned with the
    split as stored; DataError naming the file and line for a line count that differs, a link out
    of range or an unknown mark."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{KEY}: cannot read {path} ({getattr(e, 'strerror', None) or e})"
                        ) from None
    links, offsets, words, n = [], [0], [], 0
    for src, tgt in source(cfg.data).chunks(cfg.data.splits.train):
        keep = set(non_empty(src, tgt))
        for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
            n += 1
            if n > len(lines):
                continue  # counted below
            sizes = len(s.split()), len(t.split())
            try:
                gold = parse_line(lines[n - 1], f"{path} line {n}", sizes)
            except InputError as e:
                raise DataError(e.message) from None
            if i in keep:
                links += sorted(gold.possible)
                offsets.append(len(links))
                words.append(sizes)
    if n != len(lines):
        raise DataError(f"{path} line {min(n, len(lines)) + 1}: {len(lines)} lines of links, "
                        f"{n} training pairs")
    return PairLinks(np.array(links, np.int32).reshape(-1, 2), np.array(offsets, np.int64),
                     np.array(words, np.int32).reshape(-1, 2))


def word_starts(pieces, size: int) -> np.ndarray:
    """(V,) bool: which ids' pieces begin a word ("▁")."""
    return np.array([pieces.id_to_piece(i).startswith("▁") for i in range(size)])


def words_of(ids: np.ndarray, starts: np.ndarray, n_words: np.ndarray,
             skip: tuple[int, ...]) -> np.ndarray:
    """(B, L) ids -> the word of each piece (-1 at the `skip` ids: eos, pad): a new word at each
    piece that begins one, or at the first; at most n_words (B,) - 1."""
    real = ~np.isin(ids, skip)  # (B, L)
    new = starts[ids] & real
    new[:, 0] |= real[:, 0]
    word = np.minimum(np.cumsum(new, axis=1) - 1, n_words[:, None] - 1)
    return np.where(real, word, -1)


class Links:
    """Adds to a step's collated batches the links of their pairs (`GuidedBatch`)."""

    def __init__(self, cfg: ExperimentConfig, corpus: Corpus, pin: bool) -> None:
        split, tok = cfg.data.splits.train, corpus.tok
        self.pairs = read_links(Path(cfg.train.guided_alignment), cfg)
        if len(self.pairs.words) != corpus.entry.pairs:
            raise DataError(f"{cfg.train.guided_alignment}: links for {len(self.pairs.words)} "
                            f"training pairs, the data cache holds {corpus.entry.pairs}")
        self.rows, self.pin = corpus.rows.get(split), pin  # a plan's index -> a cached pair
        self.starts = (word_starts(tok.src, tok.src_vocab_size),
                       word_starts(tok.tgt, tok.tgt_vocab_size))
        self.skip = (tok.pad_id, tok.eos_id)

    def __call__(self, batch: Batch, index: list[int]) -> GuidedBatch:
        """`batch` (its first len(index) sentences the pairs `index`; rows a bucket added after
        them) with their links between pieces."""
        p = np.asarray(index, np.int64)
        p = p if self.rows is None else self.rows[p]
        b, n = batch.src.size(0), len(p)
        n_words = np.zeros((2, b), np.int32)  # (source, target) words of each row; added rows 0
        n_words[:, :n] = self.pairs.words[p].T
        src_w = words_of(batch.src.numpy(), self.starts[0], n_words[0], self.skip)  # (B, S)
        tgt_w = words_of(batch.tgt_out.numpy(), self.starts[1], n_words[1], self.skip)  # (B, T)
        first = self.pairs.offsets[p]  # (n,) where each pair's links begin
        per_pair = self.pairs.offsets[p + 1] - first
        row = np.repeat(np.arange(n), per_pair)  # (links,) the batch row of each link
        at = np.arange(len(row)) + np.repeat(first - (np.cumsum(per_pair) - per_pair), per_pair)
        i, j = self.pairs.links[at].T  # (links,) source and target words
        words = np.zeros((b, max(tgt_w.max(), 0) + 1, max(src_w.max(), 0) + 1), bool)
        inside = (j <= tgt_w.max()) & (i <= src_w.max())  # a word no piece reaches: no link
        words[row[inside], j[inside], i[inside]] = True  # (B, target words, source words)
        links = words[np.arange(b)[:, None, None], tgt_w.clip(0)[:, :, None],
                      src_w.clip(0)[:, None, :]]
        links &= (tgt_w >= 0)[:, :, None] & (src_w >= 0)[:, None, :]  # (B, T, S)
        links = torch.from_numpy(links)
        return GuidedBatch(batch.src, batch.tgt_in, batch.tgt_out, batch.n_tokens,
                           links.pin_memory() if self.pin else links)


def head_of(cfg: TrainConfig, model: nn.Module) -> tuple[int, int]:
    """(layer, head) from 1 that train.guided_head names, checked against the model."""
    if not isinstance(model, Transformer):
        raise ConfigError(f"{KEY}: guides a head of a Transformer's cross-attention, not "
                          f"model.kind={model.cfg.kind}", KEY)
    layers, heads = len(model.decoder), model.decoder[0].cross_attn.n_heads
    if not cfg.guided_head:
        return layers, 1
    layer, head = map(int, cfg.guided_head.removeprefix("head").split("."))
    if layer > layers or head > heads:
        raise ConfigError(f"train.guided_head={cfg.guided_head}: the model has {layers} layer(s) "
                          f"of {heads} cross-attention head(s)", "train.guided_head")
    return layer, head


class GuidedLoss:
    """A batch's token loss plus train.guided_weight times its guided head's alignment loss; a
    batch without links (bench's) gets none."""

    def __init__(self, model: nn.Module, cfg: TrainConfig) -> None:
        layer, head = head_of(cfg, model)
        self.attn, self.head, self.weight = model.decoder[layer - 1].cross_attn, head - 1, \
            cfg.guided_weight
        self.seen: tuple[Tensor, Tensor, Tensor] | None = None
        self.signature = inspect.signature(self.attn.forward)
        self.attn.register_forward_hook(self.see, with_kwargs=True)

    def see(self, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        """The forward hook: in training, keep the inputs of the guided layer's cross-attention."""
        if module.training:
            given = self.signature.bind(*args, **kwargs).arguments
            self.seen = given["x"], given["context"], given["mask"]

    def __call__(self, loss: Tensor, batch: Batch) -> Tensor:
        seen, self.seen = self.seen, None
        links = getattr(batch, "links", None)
        if links is None or seen is None:
            return loss
        return loss + self.weight * alignment_loss(self.log_weights(*seen), links)

    def log_weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """The guided head's log attention weights (B, T, S): models/attention.py's `attention`
        for its queries and keys alone, in log space. x: (B, T, D), memory: (B, S, D), mask:
        (B, 1, 1, S)."""
        a = self.attn
        rows = slice(self.head * a.d_k, (self.head + 1) * a.d_k)  # the head's slice of Q and K
        q = a.q_norm(F.linear(x, a.q_proj.weight[rows], a.q_proj.bias[rows]))  # (B, T, d_k)
        k = a.k_norm(F.linear(memory, a.kv_proj.weight[rows], a.kv_proj.bias[rows]))  # (B, S, d_k)
        scores = (q @ k.transpose(1, 2)).float() / math.sqrt(a.d_k)  # (B, T, S)
        return scores.masked_fill(~mask[:, 0], float("-inf")).log_softmax(-1)


def alignment_loss(log_weights: Tensor, links: Tensor) -> Tensor:
    """Summed cross-entropy -sum p log w of each target piece's attention `log_weights` (B, T, S)
    against its links (B, T, S) made a distribution p; a piece with no link adds nothing."""
    p = links.float()
    p = p / p.sum(-1, keepdim=True).clamp(min=1)
    return -(torch.where(links, log_weights, 0.0) * p).sum()


def with_links(collate, cfg: ExperimentConfig, corpus: Corpus, pin: bool):
    """A step's collate function whose batches carry their pairs' links."""
    links = Links(cfg, corpus, pin)

    def collate_linked(index: list[list[int]], draws: tuple[int, ...]) -> list[GuidedBatch]:
        return [links(batch, b) for batch, b in zip(collate(index, draws), index, strict=True)]

    return collate_linked
