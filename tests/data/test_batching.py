"""Batches: collating padded ids, and the token-count plan of an epoch."""

import numpy as np

from attn_mt.data.batching import collate, token_batches


def loop_token_batches(src_lens, tgt_lens, batch_tokens, seed, epoch, shuffle=True):
    """data.token_batches as it was: a Python loop over every sentence (the output must not change)."""
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
