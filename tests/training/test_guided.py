"""Guided alignment (training/guided.py): the links follow their pairs into batches, the loss reads
the guided head's own weights, the head aligns better than without guidance, bad link files are
refused in one line, and a guided run resumes bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, cfg_for, cli, one_line_error, toy_files, write_config

import attn_mt
from attn_mt import checkpoint
from attn_mt.config import load_config
from attn_mt.data.corpus import load_corpus
from attn_mt.data.lines import DataError
from attn_mt.data.sources import source
from attn_mt.decoding.alignment import word_of_pieces
from attn_mt.decoding.pharaoh import parse_line
from attn_mt.errors import ConfigError
from attn_mt.models import AttentionWeights, build_model
from attn_mt.training.guided import GuidedLoss, Links, alignment_loss
from attn_mt.training.run import train
from attn_mt.training.trainer import TrainStep

# 60 steps of the tiny model, long enough for the guided head to align
STEPS = ("train.max_epochs=100", "train.max_steps=60", "train.eval_every=60",
         "train.bleu_sentences=5", "train.record_attention=false")


def gold_file(tmp_path: Path, cfg) -> Path:
    """The toy generator's links of the training split, as a Pharaoh file."""
    path = tmp_path / "train.align"
    path.write_text("".join(f"{line}\n" for line in source(cfg.data).gold_links("train")))
    return path


def piece_links(tok, src: str, tgt: str, line: str) -> set[tuple[int, int]]:
    """(target piece, source piece) links of one pair, worked out on its own text."""
    src_ids, tgt_ids = tok.encode_src([src])[0], tok.encode_tgt([tgt])[0]
    src_w = word_of_pieces([tok.src.id_to_piece(i) for i in src_ids], len(src.split()))
    tgt_w = word_of_pieces(tok.tgt_pieces(tgt_ids), len(tgt.split()))
    words = parse_line(line, "gold").possible
    return {(t, s) for t, j in enumerate(tgt_w) for s, i in enumerate(src_w) if (i, j) in words}


def test_links_follow_their_pairs_through_filtering_and_batching(tiny_cfg, tmp_path):
    cfg = tiny_cfg("data.max_len=28")  # drops the longest pairs: the plan's index is not the line
    corpus = load_corpus(cfg, cfg.model.max_positions)
    rows = corpus.rows[cfg.data.splits.train]
    assert len(rows) < corpus.entry.pairs
    cfg = tiny_cfg("data.max_len=28", f"train.guided_alignment={gold_file(tmp_path, cfg)}")
    links = Links(cfg, corpus, pin=False)
    texts = next(source(cfg.data).chunks("train"))
    lines = source(cfg.data).gold_links("train")
    index = [len(rows) - 1, 3, 0, 17]  # any order, as a shuffled plan cuts them
    batch = links(next(corpus.batches("train", [index])), index)
    assert batch.links.shape == (4, batch.tgt_out.size(1), batch.src.size(1))
    for row, k in enumerate(index):
        line = int(rows[k])
        want = piece_links(corpus.tok, texts[0][line], texts[1][line], lines[line])
        assert {tuple(x) for x in batch.links[row].nonzero().tolist()} == want
    assert batch.to(torch.device("cpu")).links is batch.links


def test_the_loss_reads_the_guided_heads_own_weights(tiny_cfg):
    cfg = tiny_cfg("model.n_layers=2", "train.guided_head=head2.2",
                   "train.guided_alignment=unused")
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab=50, tgt_vocab=50, pad_id=0, shared_vocab=True)
    guide = GuidedLoss(model, cfg.train)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt_in = torch.tensor([[1, 5, 6], [1, 7, 0]])
    model.train()  # dropout 0: the same numbers as in evaluation
    model(src, tgt_in)
    log_w = guide.log_weights(*guide.seen)  # (B, T, S)
    weights = AttentionWeights()
    model.eval()
    with torch.no_grad():
        mask = model.src_mask(src)
        model.decode(tgt_in, model.encode(src, mask), mask, weights=weights)
    torch.testing.assert_close(log_w.exp(), weights.cross[1][:, 1])
    model(src, tgt_in)
    assert guide.seen is not None  # kept from the training forward only: this one was not
    links = torch.zeros(2, 3, 4, dtype=torch.bool)
    links[0, 0, 1] = True
    batch = type("B", (), {"links": links})()
    got = guide(torch.tensor(1.0), batch) - 1.0
    assert torch.allclose(got, -cfg.train.guided_weight * log_w[0, 0, 1])
    assert guide.seen is None and guide(torch.tensor(1.0), batch) == 1.0  # no forward: nothing


def test_alignment_loss_by_hand():
    log_w = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]]]))
    links = torch.tensor([[[True, True, False], [False, False, True], [False, False, False]]])
    # row 0: two links, half each; row 1: one link; row 2: none, left out (its -inf too)
    want = -(0.5 * np.log(0.5) + 0.5 * np.log(0.25) + np.log(0.6))
    assert alignment_loss(log_w, links).item() == pytest.approx(want)


@pytest.mark.slow
def test_the_guided_head_aligns_better_than_the_same_run_unguided(tiny_cfg, tmp_path):
    """At equal steps, guidance lowers the head's AER well below every method of the unguided
    run."""
    gold = gold_file(tmp_path, tiny_cfg())
    aer = {}
    for name, extra in (("plain", ()), ("guided", (f"train.guided_alignment={gold}",))):
        run = tmp_path / name
        train(tiny_cfg(*STEPS, *extra), run)
        model = attn_mt.load(run / "checkpoint_last.pt", device="cpu")
        report = model.align_report(run / "test.en", run / "test.de", run / "test.align",
                                    by_head=True)
        aer[name] = {k: v.aer for k, v in report.rows.items()}
    assert aer["guided"]["head1.1"] < min(aer["plain"].values()) - 5, aer


def test_a_run_on_the_toy_corpus_writes_the_training_links(tiny_run):
    lines = (tiny_run / "train.align").read_text().splitlines()
    cfg = load_config(None, TINY)
    assert lines == source(cfg.data).gold_links("train")


@pytest.mark.parametrize("edit, where, what", [
    (lambda lines: lines[:-1], "line 300", "299 lines of links, 300 training pairs"),
    (lambda lines: [*lines, "0-0"], "line 301", "301 lines of links, 300 training pairs"),
    (lambda lines: [lines[0], "0-0 99-1", *lines[2:]], "line 2", "99-1 is out of range"),
    (lambda lines: [*lines[:4], "0-0 1?1", *lines[5:]], "line 5", "'1?1' is not a link"),
])
def test_a_bad_link_file_is_refused_naming_its_line(tiny_cfg, tmp_path, edit, where, what):
    cfg = tiny_cfg()
    path = gold_file(tmp_path, cfg)
    path.write_text("".join(f"{line}\n" for line in edit(path.read_text().splitlines())))
    corpus = load_corpus(cfg, cfg.model.max_positions)
    with pytest.raises(DataError, match=f"{path} {where}: .*{what}".replace("?", r"\?")):
        Links(tiny_cfg(f"train.guided_alignment={path}"), corpus, pin=False)
    result = cli("train", "--config", write_config(tmp_path / "c.yaml"), "--out", tmp_path / "run",
                 "--set", f"train.guided_alignment={path}")
    one_line_error(result, 1, f"{path} {where}")


def test_empty_pairs_are_left_out_as_the_data_cache_leaves_them(tmp_path):
    files = toy_files(tmp_path / "toy")
    for lang in ("en", "de"):  # pair 2 has an empty target: the cache drops it
        lines = (files / f"train.{lang}").read_text().splitlines()
        lines.insert(2, "" if lang == "de" else "a lone source")
        (files / f"train.{lang}").write_text("".join(f"{x}\n" for x in lines))
    cfg = cfg_for(files, tmp_path)
    gold = ["0-0"] * 301
    gold[2] = ""
    (tmp_path / "train.align").write_text("".join(f"{x}\n" for x in gold))
    corpus = load_corpus(cfg, cfg.model.max_positions)
    links = Links(cfg_for(files, tmp_path, f"train.guided_alignment={tmp_path / 'train.align'}"),
                  corpus, pin=False)
    assert len(links.pairs.words) == corpus.entry.pairs == 300
    gold[2] = "0-0"  # a link to a target that has no words
    (tmp_path / "train.align").write_text("".join(f"{x}\n" for x in gold))
    with pytest.raises(DataError, match="line 3: link 0-0 is out of range"):
        Links(cfg_for(files, tmp_path, f"train.guided_alignment={tmp_path / 'train.align'}"),
              corpus, pin=False)


def test_a_missing_file_a_head_the_model_lacks_and_a_bad_name_are_refused(tiny_cfg, tmp_path):
    result = cli("train", "--config", write_config(tmp_path / "c.yaml"), "--out", tmp_path / "r",
                 "--set", f"train.guided_alignment={tmp_path / 'none.align'}")
    one_line_error(result, 1, "train.guided_alignment: cannot read", "none.align")
    model = build_model(tiny_cfg().model, src_vocab=50, tgt_vocab=50, pad_id=0, shared_vocab=True)
    with pytest.raises(ConfigError, match="guided_head=head2.1: the model has 1 layer"):
        TrainStep(model, tiny_cfg("train.guided_alignment=x", "train.guided_head=head2.1").train,
                  torch.device("cpu"), "fp32")
    rnn = load_config(None, ["model.kind=rnn"])
    with pytest.raises(ConfigError, match="not model.kind=rnn"):
        GuidedLoss(build_model(rnn.model, src_vocab=50, tgt_vocab=50, pad_id=0,
                               shared_vocab=True), tiny_cfg("train.guided_alignment=x").train)
    for bad in ("layer2", "head0.1", "head1"):
        with pytest.raises(ConfigError, match=f"train.guided_head='{bad}': expected headL.H"):
            tiny_cfg(f"train.guided_head={bad}")


class Killed(BaseException):
    """Stands in for SIGKILL: nothing in `train` catches it."""


@pytest.mark.slow
def test_a_guided_run_resumes_bit_exact(tiny_cfg, tmp_path, monkeypatch):
    gold = gold_file(tmp_path, tiny_cfg())
    cfg = tiny_cfg("model.dropout=0.1", "train.checkpoint_every=4", "train.max_steps=16",
                   f"train.guided_alignment={gold}")  # 16 steps: the kill and a checkpoint after
    train(cfg, tmp_path / "whole")
    real, calls = TrainStep.update, [0]

    def dies_at_step_11(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 11:
            raise Killed
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "update", dies_at_step_11)
    with pytest.raises(Killed):
        train(cfg, tmp_path / "resumed")
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / "resumed" / "checkpoint_last.pt")["step"] == 8
    train(cfg, tmp_path / "resumed", resume=True)
    a, b = (checkpoint.load(tmp_path / r / "checkpoint_last.pt") for r in ("whole", "resumed"))
    assert a["step"] == b["step"] > 11
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
