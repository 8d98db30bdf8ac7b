"""The memory-mapped corpus: the same tokenizer, batches and losses as the in-memory path it
replaced, and two ranks (processes) sharing one cache entry."""

import json
import os
import traceback
from pathlib import Path

import pytest
import torch
from conftest import cfg_for, toy_files

from attn_mt.data import cache
from attn_mt.data.batching import collate, token_batches
from attn_mt.data.corpus import load_corpus
from attn_mt.data.lines import read_lines
from attn_mt.data.sampling import resample_src
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.models import build_model
from attn_mt.training.trainer import Trainer


@pytest.fixture
def files(tmp_path) -> Path:
    return toy_files(tmp_path / "data")


class ListCorpus:
    """The in-memory path this replaced: Python lists of ids, batches collated from them."""

    def __init__(self, tok, ids):
        self.tok, self.ids = tok, ids

    def lengths(self, split):
        src, tgt = self.ids[split]
        return [len(s) for s in src], [len(t) for t in tgt]

    def batches(self, split, index, sampling=0.0, seed=(), pin=False):
        # the path it replaced had no subword sampling, no pinned buffers
        assert not sampling and not pin
        src, tgt = self.ids[split]
        for b in index:
            yield collate([src[i] for i in b], [tgt[i] for i in b], self.tok.pad_id,
                          self.tok.bos_id, self.tok.eos_id)


def test_same_tokenizer_batches_and_losses_as_in_memory(files, tmp_path):
    # some toy pairs are longer: the length filter is tested
    cfg = cfg_for(files, tmp_path, "data.max_len=12")
    corpus = load_corpus(cfg, cfg.model.max_positions)
    src, tgt = read_lines(files / "train.en"), read_lines(files / "train.de")
    tok = train_tokenizer(cfg.tokenizer, src, tgt)
    assert tok.state() == corpus.tok.state()
    keep = [i for i, (s, t) in enumerate(zip(tok.encode_src(src), tok.encode_tgt(tgt), strict=True))
            if len(s) <= 12 and len(t) <= 12]
    assert 0 < len(keep) < len(src)
    ids = {"train": ([tok.encode_src([src[i]])[0] for i in keep],
                     [tok.encode_tgt([tgt[i]])[0] for i in keep])}
    ref = ListCorpus(tok, ids)
    assert [list(x) for x in corpus.lengths("train")] == list(ref.lengths("train"))
    index = token_batches(*corpus.lengths("train"), 200, seed=3, epoch=1)
    for a, b in zip(corpus.batches("train", index), ref.batches("train", index), strict=True):
        assert (torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in)
                and torch.equal(a.tgt_out, b.tgt_out))
    losses = []
    for c in (corpus, ref):
        torch.manual_seed(0)
        model = build_model(cfg.model, **tok.sizes())
        tr = Trainer(model, cfg, c, torch.device("cpu"), "fp32")
        losses.append([tr.step(lambda: 0.0).loss for _ in range(4)])
    assert losses[0] == losses[1]


def test_subword_sampling_splits_sources_anew_and_keeps_targets(files, tmp_path):
    cfg = cfg_for(files, tmp_path, "data.max_len=30")
    corpus = load_corpus(cfg, cfg.model.max_positions)
    tok, index = corpus.tok, token_batches(*corpus.lengths("train"), 300, seed=3, epoch=0)[:4]

    def draw(alpha, seed=(1, 0, 0)):
        return list(corpus.batches("train", index, alpha, seed))

    plain, sampled = draw(0.0), draw(0.3)
    for a, b in zip(plain, sampled, strict=True):
        assert torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)
        texts = [tok.src.decode([i for i in row.tolist() if i != tok.pad_id])
                 for row in (a.src, b.src)]
        assert texts[0] == texts[1]  # the same sentences, split another way
    def differ(x, y):  # torch.equal is False for different shapes
        return any(not torch.equal(a.src, b.src) for a, b in zip(x, y, strict=True))

    assert differ(plain, sampled)
    assert (sum((b.src != tok.pad_id).sum() for b in sampled)
            > sum((a.src != tok.pad_id).sum() for a in plain))
    again, other = draw(0.3), draw(0.3, (1, 0, 1))
    # seeded by (seed, epoch, batch): resumable
    assert not differ(sampled, again) and differ(sampled, other)
    ids = corpus.ids["train"][0].get(range(20))
    # none may grow past the longest
    kept = resample_src(tok, ids, 0.5, seed=5, limit=max(map(len, ids)))
    assert max(map(len, kept)) <= max(map(len, ids)) and kept != ids


def rank(cfg, go: int, out: Path) -> None:
    """A rank in a forked child: wait for `go`, load the corpus, write what it built, mapped and
    batched to `out` as JSON, and exit."""
    code = 1
    try:
        os.read(go, 1)  # both ranks at once: the lock makes one build
        built = []
        real = cache.build
        cache.build = lambda *a, **k: built.append(1) or real(*a, **k)
        corpus = load_corpus(cfg, 256)
        maps = {line.split()[-1] for line in open("/proc/self/maps")
                if line.rstrip().endswith(".ids")}
        index = token_batches(*corpus.lengths("train"), 300, 1, 0)
        batches = [b.src.tolist() for b in corpus.batches("train", index[:3])]
        out.write_text(json.dumps({"built": len(built), "maps": sorted(maps), "batches": batches}))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


@pytest.mark.slow
def test_two_ranks_build_once_and_map_the_same_files(files, tmp_path):
    """Two processes that load the corpus at once, as torchrun's ranks do (the data path knows no
    ranks), forked from this one: no fresh interpreters importing torch."""
    torch.set_num_threads(1)  # forked children: a single-threaded parent is safe to fork
    cfg = cfg_for(files, tmp_path)
    go, start = os.pipe()
    pids = []
    for r in range(2):
        if (pid := os.fork()) == 0:
            os.close(start)
            rank(cfg, go, tmp_path / f"rank{r}.json")
        pids.append(pid)
    os.close(go)
    os.write(start, b"go")
    os.close(start)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(ranks) == 2 and sum(r["built"] for r in ranks) == 1
    # src.ids, tgt.ids of one entry
    assert ranks[0]["maps"] == ranks[1]["maps"] and len(ranks[0]["maps"]) == 2
    assert ranks[0]["batches"] == ranks[1]["batches"]
