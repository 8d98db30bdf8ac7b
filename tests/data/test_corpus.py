"""The data cache and the memory-mapped corpus: reuse, invalidation, damage, ranks sharing it, and the
same tokenizer, batches and losses as the in-memory path it replaced."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY
from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.config import load_config
from attn_mt.data import cache as datacache
from attn_mt.data.corpus import load_corpus, prepare
from attn_mt.data.sources import DataError, collate, line_chunks, read_lines, token_batches
from attn_mt.data.tokenizer import train_or_load
from attn_mt.data.toy import make_toy_corpus
from attn_mt.models import build_model
from attn_mt.training.trainer import Trainer


@pytest.fixture
def files(tmp_path) -> Path:
    """The tiny toy corpus as {split}.{en,de} files."""
    d = tmp_path / "data"
    d.mkdir()
    for split, pairs in make_toy_corpus(300).items():
        (d / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs))
        (d / f"{split}.de").write_text("".join(t + "\n" for _, t in pairs))
    return d


def cfg_for(files: Path, tmp_path: Path, *extra: str):
    return load_config(None, [*TINY, "data.source=files", f"data.dir={files}", f"data.cache_dir={tmp_path / 'cache'}",
                              *extra])


def entries(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "cache").iterdir() if p.is_dir())


@pytest.fixture
def builds(monkeypatch) -> list:
    """Counts cache builds."""
    real, calls = datacache._fill, []

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(datacache, "_fill", counting)
    return calls


class ListCorpus:
    """The in-memory path this replaced: Python lists of ids, batches collated from them."""

    def __init__(self, tok, ids):
        self.tok, self.ids = tok, ids

    def lengths(self, split):
        src, tgt = self.ids[split]
        return [len(s) for s in src], [len(t) for t in tgt]

    def batches(self, split, index):
        src, tgt = self.ids[split]
        for b in index:
            yield collate([src[i] for i in b], [tgt[i] for i in b], self.tok.pad_id, self.tok.bos_id, self.tok.eos_id)


def test_same_tokenizer_batches_and_losses_as_in_memory(files, tmp_path):
    cfg = cfg_for(files, tmp_path, "data.max_len=12")  # some toy pairs are longer: the length filter is tested
    corpus = load_corpus(cfg, tmp_path, cfg.model.max_positions)
    src, tgt = read_lines(files / "train.en"), read_lines(files / "train.de")
    (tmp_path / "ref").mkdir()
    tok = train_or_load(cfg.tokenizer, src, tgt, tmp_path / "ref")
    assert tok.state() == corpus.tok.state()
    keep = [i for i, (s, t) in enumerate(zip(tok.encode_src(src), tok.encode_tgt(tgt), strict=True))
            if len(s) <= 12 and len(t) <= 12]
    assert 0 < len(keep) < len(src)
    ids = {"train": ([tok.encode_src([src[i]])[0] for i in keep], [tok.encode_tgt([tgt[i]])[0] for i in keep])}
    ref = ListCorpus(tok, ids)
    assert [list(x) for x in corpus.lengths("train")] == list(ref.lengths("train"))
    index = token_batches(*corpus.lengths("train"), 200, seed=3, epoch=1)
    for a, b in zip(corpus.batches("train", index), ref.batches("train", index), strict=True):
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)
    losses = []
    for c in (corpus, ref):
        torch.manual_seed(0)
        model = build_model(cfg.model, **tok.sizes())
        tr = Trainer(model, cfg, c, torch.device("cpu"), "fp32")
        losses.append([tr.step(lambda: 0.0).loss for _ in range(4)])
    assert losses[0] == losses[1]


def test_reused_then_rebuilt_when_data_or_tokenizer_change(files, tmp_path, builds):
    cfg = cfg_for(files, tmp_path)
    for i in ("", "2", "3", "4"):
        (tmp_path / f"run{i}").mkdir()
    first = load_corpus(cfg, tmp_path / "run", 256)
    load_corpus(cfg, tmp_path / "run2", 256)
    assert len(builds) == 1 and len(entries(tmp_path)) == 1  # reused by a second run
    assert (tmp_path / "run2" / "spm.model").read_bytes() == (tmp_path / "run" / "spm.model").read_bytes()
    load_corpus(cfg_for(files, tmp_path, "tokenizer.vocab_size=110"), tmp_path / "run3", 256)
    assert len(builds) == 2 and len(entries(tmp_path)) == 2  # tokenizer setting changed
    with (files / "train.de").open("a") as f:
        f.write("ein neuer Satz\n")
    with (files / "train.en").open("a") as f:
        f.write("a new sentence\n")
    again = load_corpus(cfg, tmp_path / "run4", 256)
    assert len(builds) == 3 and len(entries(tmp_path)) == 3  # data changed
    assert len(again.lengths("train")[0]) == len(first.lengths("train")[0]) + 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "marker"])
def test_damaged_entry_is_rebuilt(files, tmp_path, builds, damage):
    cfg = cfg_for(files, tmp_path)
    before = load_corpus(cfg, tmp_path, 256)
    index = token_batches(*before.lengths("train"), 300, 1, 0)
    expected = [b.src.tolist() for b in before.batches("train", index)]  # before the damage: in place, it is seen
    entry = entries(tmp_path)[0]
    ids = entry / "src.ids"
    if damage == "truncate":
        ids.write_bytes(ids.read_bytes()[:-2])
    elif damage == "flip":
        raw = bytearray(ids.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        ids.write_bytes(bytes(raw))
    else:
        (entry / "complete.json").unlink()  # as a build killed before its marker leaves it
    after = load_corpus(cfg, tmp_path, 256)
    assert len(builds) == 2 and entries(tmp_path) == [entry]
    assert [b.src.tolist() for b in after.batches("train", index)] == expected


def test_prepare_then_train_reuses_the_cache(files, tmp_path, builds, monkeypatch):
    cfg_args = [a for item in [*TINY, "data.source=files", f"data.dir={files}", f"data.cache_dir={tmp_path / 'c'}",
                               "train.max_steps=2"] for a in ("--set", item)]
    (tmp_path / "tiny.yaml").write_text("name: tiny\n")
    cfg_args = ["--config", str(tmp_path / "tiny.yaml"), *cfg_args]
    result = CliRunner().invoke(app, ["prepare", *cfg_args])
    assert result.exit_code == 0, result.output
    assert "300 training pairs" in result.output and len(builds) == 1
    monkeypatch.setattr(datacache, "write_pairs", lambda *a: pytest.fail("the training split was read again"))
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), *cfg_args])
    assert result.exit_code == 0, result.output
    assert len(builds) == 1 and (tmp_path / "run" / "spm.model").exists()


def test_bad_input_and_unwritable_cache_are_one_line_errors(files, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(datacache, "write_pairs", lambda *a: pytest.fail("work started"))
    with pytest.raises(DataError, match=r"data.cache_dir .*file/sub: cannot write the data cache"):
        load_corpus(cfg_for(files, tmp_path, f"data.cache_dir={tmp_path / 'file' / 'sub'}"), tmp_path, 256)
    monkeypatch.undo()
    (files / "train.de").write_bytes((files / "train.de").read_bytes() + b"gut\n")
    with pytest.raises(DataError, match=r"line counts differ: .*train\.en has 300 lines, .*train\.de has 301"):
        prepare(cfg_for(files, tmp_path))
    (files / "train.de").write_bytes((files / "train.de").read_bytes()[:-4] + b"\xff\n")
    with pytest.raises(DataError, match=r"train\.de:301: invalid UTF-8"):
        prepare(cfg_for(files, tmp_path))
    (files / "test.de").unlink()
    with pytest.raises(DataError, match=r"test\.de: data file not found"):
        prepare(cfg_for(files, tmp_path))
    assert not list((tmp_path / "cache").glob("*.tmp-*"))  # failed builds leave nothing behind


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


def test_line_chunks_count_lines_across_chunks(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"a\n b \n\nc\r\nd\n\xc3\n")
    with pytest.raises(DataError, match=r"x\.txt:6: invalid UTF-8"):
        list(line_chunks(path, size=2))
    path.write_bytes(b"a\n b \n\nc\r\nd")  # no final newline
    assert list(line_chunks(path, size=2)) == [["a", "b"], ["", "c"], ["d"]]


RANK_SCRIPT = """
import json, sys
from pathlib import Path
import torch.distributed as dist
from attn_mt.data import cache as datacache
from attn_mt.config import load_config
from attn_mt.data.corpus import load_corpus
from attn_mt.data.sources import token_batches

dist.init_process_group("gloo")
real, built = datacache._fill, []
datacache._fill = lambda *a, **k: built.append(1) or real(*a, **k)
cfg = load_config(None, sys.argv[2:])
corpus = load_corpus(cfg, Path(sys.argv[1]), 256)  # both ranks at once: the lock makes one build
maps = {line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith(".ids")}
index = token_batches(*corpus.lengths("train"), 300, 1, 0)
print(json.dumps({"built": len(built), "maps": sorted(maps), "batches": [b.src.tolist() for b in corpus.batches(
    "train", index[:3])]}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_build_once_and_map_the_same_files(files, tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not found")
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    cfg = [*TINY, "data.source=files", f"data.dir={files}", f"data.cache_dir={tmp_path / 'cache'}"]
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path), *cfg],
                         capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(ranks) == 2 and sum(r["built"] for r in ranks) == 1
    assert ranks[0]["maps"] == ranks[1]["maps"] and len(ranks[0]["maps"]) == 2  # src.ids, tgt.ids of one entry
    assert ranks[0]["batches"] == ranks[1]["batches"]
