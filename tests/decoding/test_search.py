"""Greedy decoding and `translate`: cache, eos, length limits, input order, awkward input, the
CLI."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import BOS, EOS, batch, cli, sources, train_reverser
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.checkpoint import load_model
from attn_mt.cli import app
from attn_mt.config import DecodeConfig
from attn_mt.decoding.search import Greedy, greedy_search, steps
from attn_mt.decoding.translate import max_lengths, translate, translate_nbest

TEXTS = ["the dog sees the cat.", "", "a woman likes the old horses because the child finds a "
         "book.", "   ", "the child finds a book.", "some birds.",
         "today the small man hears a red house."]


@pytest.fixture(scope="module")
def reverser():
    return train_reverser()


@pytest.fixture(scope="module")
def run(tiny_run):
    return load_model(tiny_run / "checkpoint_best.pt")


def test_greedy_cache_matches_no_cache(reverser):
    src, max_len = batch(sources(32, seed=11))
    cached = greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS)
    uncached = greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]


def test_the_search_loop_yields_each_steps_tokens_and_ends_where_greedy_search_does(reverser):
    src, max_len = batch(sources(8, seed=13))
    chooser = Greedy(max_len, EOS)
    with torch.inference_mode():
        seen = list(steps(reverser, src, chooser, bos_id=BOS))
    # bos, then a token a step
    assert [ys.shape for ys in seen] == [(8, 2 + i) for i in range(len(seen))]
    # rows stay in place
    assert all(torch.equal(a, b[:, :-1]) for a, b in zip(seen[:-1], seen[1:], strict=True))
    assert ([n[0] for n in chooser.nbest(seen[-1])]
            == greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS))


def test_greedy_stops_at_eos_and_respects_max_len(reverser):
    srcs = sources(16, seed=12)
    src, _ = batch(srcs)
    max_len = torch.arange(16) % 5 + 1  # 1..5 tokens, eos included
    out = greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS)
    for h, n in zip(out, max_len.tolist(), strict=True):
        assert len(h.tokens) + 1 <= n and EOS not in h.tokens
    free = greedy_search(reverser, src, torch.full((16,), 40), bos_id=BOS, eos_id=EOS)
    # the reverser ends by itself, long before the limit
    assert all(len(h.tokens) < 39 for h in free)


def test_max_lengths_follow_a_times_src_plus_b_capped_by_the_model():
    lens = torch.tensor([1, 10, 100])
    assert (max_lengths(lens, DecodeConfig(max_len_a=1.5, max_len_b=10), limit=64).tolist()
            == [11, 25, 64])


@pytest.mark.parametrize("beam", [1, 4])
def test_outputs_keep_input_order_for_any_batch_size(run, beam):
    model, cfg, tok = run
    texts = TEXTS * 3
    outs = [translate(model, tok, texts, DecodeConfig(beam_size=beam, batch_size=b))
            for b in (1, 3, 64)]
    assert outs[0] == outs[1] == outs[2]
    assert [o == "" for o in outs[0]] == [t.strip() == "" for t in texts]
    alone = [translate(model, tok, [t], DecodeConfig(beam_size=beam))[0] for t in TEXTS]
    assert outs[0][: len(TEXTS)] == alone


def test_translate_with_and_without_cache(run):
    model, cfg, tok = run
    dcfg = DecodeConfig(beam_size=3)
    assert translate(model, tok, TEXTS, dcfg) == translate(model, tok, TEXTS, dcfg, use_cache=False)


def test_nbest_translations(run):
    model, cfg, tok = run
    nbests = translate_nbest(model, tok, TEXTS, DecodeConfig(beam_size=4, nbest=3))
    for text, nbest in zip(TEXTS, nbests, strict=True):
        if not text.strip():
            assert [(t.text, t.score) for t in nbest] == [("", 0.0)]
            continue
        assert 1 <= len(nbest) <= 3
        assert [t.score for t in nbest] == sorted((t.score for t in nbest), reverse=True)


def test_over_long_lines_are_truncated_with_one_warning(run, caplog):
    model, cfg, tok = run
    long = " ".join(["the dog sees the cat."] * 200)
    with caplog.at_level(logging.WARNING, logger="attn_mt.decoding.translate"):
        out = translate(model, tok, [long, "a cat.", long],
                        DecodeConfig(beam_size=2, max_len_a=0.1))
    assert len(out) == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 input line(s)" in warnings[0].getMessage()


def test_any_unicode_translates(run):
    model, cfg, tok = run
    texts = ["😀🎉 the dog 🐕", "猫が好きです。", "汉字 한국어 العربية",
             "a\x00b\x01\x07\x1b[31m red", "\t\x0b\x0c\r", "\u200b\u2028\ufeff", "e\u0301\u0301",
             "\udcff lone surrogate", "\U0010ffff"]
    for beam in (1, 3):
        out = translate(model, tok, texts, DecodeConfig(beam_size=beam))
        # each text is translated as it would be alone (no odd input disturbs its batch), and the
        # whitespace-only one gives the empty translation
        assert out == [translate(model, tok, [t], DecodeConfig(beam_size=beam))[0] for t in texts]
        assert out[4] == "" and all(o for i, o in enumerate(out) if i != 4)


def test_cli_translate_jsonl_nbest(tiny_run):
    ckpt = str(tiny_run / "checkpoint_best.pt")
    args = ["translate", "--checkpoint", ckpt, "--beam", "3", "--nbest", "2", "--alpha", "1.0",
            "--batch-size", "2", "--format", "jsonl", "--device", "cpu"]
    result = CliRunner().invoke(app, args, input="\n".join(TEXTS) + "\n")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["source"] for r in rows] == TEXTS
    for row in rows:
        hyps = row["hypotheses"]
        assert len(hyps) == (2 if row["source"].strip() else 1)
        assert (hyps[0]["score"] >= hyps[-1]["score"]
                and {"text", "score", "log_prob"} <= set(hyps[0]))


def test_cli_translate_text_from_a_file(tiny_run, tmp_path):
    ckpt = str(tiny_run / "checkpoint_best.pt")
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    base = ["translate", "--checkpoint", ckpt, "--input", str(tmp_path / "in.txt"), "--device",
            "cpu"]
    one = CliRunner().invoke(app, [*base, "--beam", "3"])
    assert one.exit_code == 0, one.output
    lines = one.stdout.split("\n")[:-1]
    assert (len(lines) == len(TEXTS)
            and [line == "" for line in lines] == [not t.strip() for t in TEXTS])
    nbest = CliRunner().invoke(app, [*base, "--beam", "3", "--nbest", "2"])
    assert [line.split(" ||| ")[0] for line in nbest.stdout.splitlines()][:2] == ["0", "0"]
    bad = CliRunner().invoke(app, [*base, "--beam", "2", "--nbest", "3"])
    assert bad.exit_code == 2 and "nbest" in bad.stderr
    assert CliRunner().invoke(app, [*base, "--format", "xml"]).exit_code == 2


def test_cli_evaluate_takes_decoding_flags(tiny_run, tmp_path):
    (tmp_path / "src.txt").write_text("the dog sees the cat.\nsome birds.\n")
    (tmp_path / "ref.txt").write_text("der Hund sieht die Katze.\neinige Vögel.\n")
    args = ["evaluate", "--checkpoint", str(tiny_run / "checkpoint_best.pt"), "--beam", "2",
            "--alpha", "0.8", "--src", str(tmp_path / "src.txt"), "--ref",
            str(tmp_path / "ref.txt"), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["decode"] == {"beam_size": 2, "alpha": 0.8}
    assert "bleu" in report and report["bleu_signature"].startswith("nrefs:1")


WEIRD = [
    "", "   ", "\t", "a", ".", "hello world",
    "the cat " * 3000,  # far past the model's position limit
    "\x00\x01\x02 control \x1b[31m red \x7f", "zero\u200bwidth\u200djoiner\ufeff",
    "emoji 😀🎉👩‍👩‍👧", "日本語のテキスト", "Ελληνικά και русский", "עברית والعربية",
    "देवनागरी ไทย", "\u0301\u0301 combining", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "\u2028line\u2029separators\x85",
    "\ufffd replacement", "a" * 20000,
]


def test_translate_takes_any_line(tiny_run, tmp_path):
    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")
    out = translate(model, tok, WEIRD, cfg.decode)
    assert len(out) == len(WEIRD) and all(isinstance(t, str) for t in out) and out[0] == ""
    assert translate(model, tok, [], cfg.decode) == []
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt",
                 input="\n".join(WEIRD) + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == len(WEIRD)
    (tmp_path / "in.txt").write_text("\n".join(WEIRD) + "\n", encoding="utf-8")
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "-i",
                 tmp_path / "in.txt")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("beam", [1, 3])
def test_interrupt_runs_before_every_decoder_step_and_abandons_the_call(run, beam):
    model, cfg, tok = run
    dcfg = DecodeConfig(beam_size=beam, nbest=1, batch_size=2)
    steps, decode = [], model.decode
    # counts the model's steps
    model.decode = lambda *a, **k: steps.append("decode") or decode(*a, **k)
    try:
        translate_nbest(model, tok, TEXTS, dcfg, interrupt=lambda: steps.append("check"))
        assert (steps[::2] == ["check"] * (len(steps) // 2)
                and steps[1::2] == ["decode"] * (len(steps) // 2))

        class Gone(Exception):
            pass

        def leave_at_the_fourth_step():  # the client leaves: the fourth check raises
            steps.append("check")
            if steps.count("check") == 4:
                raise Gone

        steps.clear()
        with pytest.raises(Gone):
            translate_nbest(model, tok, TEXTS, dcfg, interrupt=leave_at_the_fourth_step)
        assert steps.count("decode") == 3
    finally:
        del model.decode
