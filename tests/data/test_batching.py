"""Batches: collating padded ids, and the token-count plan of an epoch."""

import numpy as np
import torch

from attn_mt.data.arrays import collate_ragged
from attn_mt.data.batching import collate, token_batches
from attn_mt.data.corpus import Ragged, load_corpus


def loop_token_batches(src_lens, tgt_lens, batch_tokens, seed, epoch, shuffle=True):
    """data.token_batches as it was: a Python loop over every sentence (the output must not
    change)."""
    rng = np.random.default_rng([seed, epoch])
    n = len(src_lens)
    order = rng.permutation(n) if shuffle else np.arange(n)
    lens = np.maximum(np.asarray(src_lens), np.asarray(tgt_lens)) + 1
    order = order[np.argsort(lens[order], kind="stable")]
    batches, current, longest = [], [], 0
    for i in order.tolist():
        longest_if_added = max(longest, int(lens[i]))
        if current and longest_if_added * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest_if_added = [], int(lens[i])
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def test_token_batches_equal_to_the_loop_they_replace():
    rng = np.random.default_rng(0)
    for trial in range(200):
        n, longest = int(rng.integers(0, 2000)), int(rng.integers(1, 300))
        src, tgt = rng.integers(0, longest, n).tolist(), rng.integers(0, longest, n).tolist()
        budget = int(rng.integers(1, 5000))  # down to budgets below one sentence
        for shuffle in (True, False):
            assert token_batches(src, tgt, budget, trial, 2, shuffle) == \
                loop_token_batches(src, tgt, budget, trial, 2, shuffle)


def test_token_batches_respect_budget_and_seed():
    import random

    rnd = random.Random(0)
    src = [rnd.randint(1, 40) for _ in range(500)]
    tgt = [rnd.randint(1, 40) for _ in range(500)]
    batches = token_batches(src, tgt, 300, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(500))  # every pair exactly once
    padded = real = 0
    for b in batches:
        longest = max(max(src[i], tgt[i]) + 1 for i in b)
        assert longest * len(b) <= 300 or len(b) == 1
        padded += longest * len(b)
        real += sum(max(src[i], tgt[i]) + 1 for i in b)
    assert real / padded > 0.9  # length-sorted buckets: little padding
    assert batches == token_batches(src, tgt, 300, seed=1, epoch=0)
    assert batches != token_batches(src, tgt, 300, seed=1, epoch=1)


def test_collate_shifts_target():
    b = collate([[5, 6], [7]], [[8, 9, 10], [11]], pad_id=0, bos_id=2, eos_id=3)
    assert b.src.tolist() == [[5, 6, 3], [7, 3, 0]]
    assert b.tgt_in.tolist() == [[2, 8, 9, 10], [2, 11, 0, 0]]
    assert b.tgt_out.tolist() == [[8, 9, 10, 3], [11, 3, 0, 0]]
    assert b.n_tokens == 6


def old_batches(corpus, split, index):
    """Corpus.batches as it was: a list per sentence, padded one row at a time (the output must not
    change)."""
    rows, (src, tgt) = corpus.rows.get(split), corpus.ids[split]
    for b in index:
        b = b if rows is None else rows[np.asarray(b, dtype=np.int64)]
        yield collate(src.get(b), tgt.get(b), corpus.tok.pad_id, corpus.tok.bos_id,
                      corpus.tok.eos_id)


def same(a, b) -> bool:
    return (all(torch.equal(getattr(a, k), getattr(b, k))
               and getattr(a, k).dtype == getattr(b, k).dtype for k in ("src", "tgt_in", "tgt_out"))
            and a.n_tokens == b.n_tokens)


def test_gathered_batches_equal_the_collated_ones_on_random_ragged_ids():
    rng = np.random.default_rng(1)
    for trial in range(100):
        n = int(rng.integers(1, 60))
        seqs = [rng.integers(4, 3000, int(rng.integers(0, 40))).tolist() for _ in range(2 * n)]
        src, tgt = Ragged.from_lists(seqs[:n]), Ragged.from_lists(seqs[n:])
        rows = rng.permutation(n)[: int(rng.integers(1, n + 1))]
        got = collate_ragged(src.spans(rows), tgt.spans(rows), 0, 1, 2)
        assert same(got, collate(src.get(rows), tgt.get(rows), 0, 1, 2)), trial


def test_a_corpus_gives_the_batches_it_gave_before(tiny_cfg):
    """The toy corpus from its memory-mapped cache entry, some pairs dropped by length
    (`Corpus.rows`)."""
    cfg = tiny_cfg("data.max_len=30")
    corpus = load_corpus(cfg, cfg.model.max_positions)
    split = cfg.data.splits.train
    assert split in corpus.rows  # the filtered path is the one exercised
    for epoch in range(2):
        index = token_batches(*corpus.lengths(split), 150, 0, epoch)
        pairs = list(zip(corpus.batches(split, index), old_batches(corpus, split, index),
                         strict=True))
        assert len(pairs) == len(index) > 5 and all(same(a, b) for a, b in pairs)


def test_multi30k_batches_equal_the_collated_ones(multi30k):
    """Real lengths and ids (Multi30k's words as ids), a whole epoch of 16k-token batches."""
    vocab: dict[str, int] = {}
    sides = [[[vocab.setdefault(w, len(vocab) + 3) for w in line.split()] for line in
              (multi30k / f"train.{lang}").read_text().splitlines()] for lang in ("de", "en")]
    src, tgt = Ragged.from_lists(sides[0]), Ragged.from_lists(sides[1])
    index = token_batches(src.lengths, tgt.lengths, 16384, 3, 0)
    for b in index:
        rows = np.asarray(b)
        assert same(collate_ragged(src.spans(rows), tgt.spans(rows), 0, 1, 2),
                    collate(src.get(rows), tgt.get(rows), 0, 1, 2))
