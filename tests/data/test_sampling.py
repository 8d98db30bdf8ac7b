"""data/sampling.py: subword samples drawn by our own seeded generator. The same seed gives the same
draw in another process and after any other draws (SentencePiece 0.2.x's own sampling did not:
resume was not exact), the text is kept, BPE-dropout at rate 0 is SentencePiece's own BPE, and a
sampled run in a fresh process is the one in another process."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys

import pytest
import sentencepiece as spm
import torch
from conftest import cli, write_config

from attn_mt.data.sampling import resample_src
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.data.toy import make_toy_corpus

TEXTS = [s for pair in make_toy_corpus(300)["train"] for s in pair]


def _model(kind: str) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=out, vocab_size=150,
                                   model_type=kind, minloglevel=2, hard_vocab_limit=False, pad_id=0,
                                   unk_id=1, bos_id=2, eos_id=3)
    return out.getvalue()


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tok(request, tmp_path_factory):
    return Tokenizer(_model(request.param))


DRAW = """
import json, sys
from pathlib import Path
from attn_mt.data.sampling import resample_src
from attn_mt.data.tokenizer import Tokenizer
tok = Tokenizer(Path(sys.argv[1]).read_bytes())
ids = json.loads(sys.argv[2])
if sys.argv[3] == "busy":  # other draws first: a draw must not depend on what was drawn before it
    resample_src(tok, ids, 0.3, 99, 10**6)
print(json.dumps(resample_src(tok, ids, 0.3, 12345, 10**6)))
"""


def test_a_draw_depends_on_its_seed_alone_in_any_process(tok, tmp_path):
    (tmp_path / "spm.model").write_bytes(tok.src_proto)
    ids = tok.encode_src(TEXTS[:40])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    draws = [json.loads(subprocess.run([sys.executable, "-c", DRAW, str(tmp_path / "spm.model"),
                                        json.dumps(ids), how], capture_output=True, text=True,
                                       env=env, check=True).stdout)
             for how in ("fresh", "busy")]
    here = resample_src(tok, ids, 0.3, 12345, 10**6)
    assert draws[0] == draws[1] == here
    # it samples, by its seed
    assert here != ids and here != resample_src(tok, ids, 0.3, 12346, 10**6)


def test_a_sample_keeps_the_text_and_uses_the_models_pieces(tok):
    ids = tok.encode_src(TEXTS[:200])
    new = resample_src(tok, ids, 0.5, 7, 10**6)
    assert [tok.src.decode(x) for x in new] == [tok.src.decode(x) for x in ids]
    assert sum(map(len, new)) > sum(map(len, ids))  # finer on the whole
    assert all(0 <= i < tok.src_vocab_size for x in new for i in x)


def test_bpe_dropout_at_rate_zero_is_sentencepieces_bpe():
    from attn_mt.data.sampling import Sampler, bpe_dropout

    tok = Tokenizer(_model("bpe"))
    sampler = Sampler(tok.src)
    assert sampler.bpe and not Sampler(Tokenizer(_model("unigram")).src).bpe
    words = sorted({w for t in TEXTS for w in t.split()})
    for word in words:  # each word merged in SentencePiece's order: its own pieces
        assert bpe_dropout("▁" + word, sampler.scores, 0.0, iter(())) == tok.src_pieces(word), word
    dropped = [bpe_dropout("▁" + w, sampler.scores, 0.5, iter(random.Random(0).random, None))
               for w in words]
    assert sum(map(len, dropped)) > sum(len(tok.src_pieces(w)) for w in words)


@pytest.mark.slow
def test_a_sampled_run_in_a_fresh_process_trains_the_weights_of_one_in_this(tmp_path):
    """A run in a fresh process and one in this process, which has drawn samples before: a draw
    that depended on a process's state, as SentencePiece's own did, would part them."""
    config = write_config(tmp_path / "c.yaml", "train.subword_sampling=0.2", "train.max_steps=8",
                          "train.max_epochs=1", "train.bleu_sentences=5")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-m", "attn_mt", "--quiet", "train", "-c", str(config),
                    "--out", str(tmp_path / "a")], env=env, check=True, capture_output=True,
                   timeout=600)
    tok = Tokenizer(_model("unigram"))
    resample_src(tok, tok.encode_src(TEXTS[:20]), 0.3, 99, 10**6)  # other draws first
    assert cli("train", "-c", config, "--out", tmp_path / "b").exit_code == 0
    a, b = (torch.load(tmp_path / run / "checkpoint_last.pt", weights_only=True)["model"]
            for run in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)
