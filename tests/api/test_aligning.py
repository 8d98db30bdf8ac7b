"""Word alignment through the front doors: Model.align and align_report (api/aligning.py), `attn-mt
align`, `attn-mt translate --align` (text, n-best, JSONL) and the server's `align` field, on the
tiny trained run."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, cli, one_line_error

import attn_mt
from attn_mt.decoding.pharaoh import parse_line
from attn_mt.errors import InputError

SRC = "the old man sees a small dog."
TGT = "der alte Mann sieht einen kleinen Hund."


@pytest.fixture(scope="module")
def model(tiny_run):
    return attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")


def test_align_gives_words_and_one_link_per_target_word(model):
    a = model.align(SRC, TGT)
    assert a.source_words == SRC.split() and a.target_words == TGT.split()
    assert sorted(j for _, j in a.links) == list(range(7)) and all(0 <= i < 7 for i, _ in a.links)
    assert a.pharaoh == " ".join(f"{i}-{j}" for i, j in sorted(a.links))
    many = model.align([SRC, "a dog."], [TGT, "ein Hund."], method="shift-head1.2")
    assert len(many) == 2 and many[1].target_words == ["ein", "Hund."]
    # the tiny model has one layer
    assert model.align(SRC, TGT, method="layer1") == model.align(SRC, TGT)


def test_align_refuses_what_it_cannot_do(model):
    with pytest.raises(InputError, match="targets"):
        model.align([SRC, SRC], [TGT])
    with pytest.raises(InputError, match="reverse"):
        model.align(SRC, TGT, method="gdf:layer1")
    with pytest.raises(InputError, match="method"):
        model.align(SRC, TGT, method="head1.9")
    with pytest.raises(InputError, match="batch_size"):
        model.align(SRC, TGT, batch_size=0)


def test_the_report_scores_the_run_against_its_gold(model, tiny_run):
    src, tgt, gold = tiny_run / "test.en", tiny_run / "test.de", tiny_run / "test.align"
    assert len(gold.read_text().splitlines()) == len(src.read_text().splitlines())
    one = model.align_report(src, tgt, gold)
    every = model.align_report(src, tgt, gold, by_head=True, reverse=model)
    assert list(one.rows) == ["layer1"] and one.rows["layer1"] == every.rows["layer1"]
    # (average + 2 heads) x shift x 4 ways
    assert len(every.rows) == 6 * 4 and every.best in every.rows
    assert (every.rows["intersect:layer1"].links <= every.rows["layer1"].links
            <= every.rows["union:layer1"].links)
    assert "<- best" in every.table()


def test_the_runs_gold_scores_zero_against_itself(tiny_run):
    from attn_mt.analysis.aer import score
    from attn_mt.decoding.pharaoh import read_gold

    src = tiny_run.joinpath("test.en").read_text().splitlines()
    tgt = tiny_run.joinpath("test.de").read_text().splitlines()
    gold = read_gold(tiny_run / "test.align", src, tgt)
    assert score([set(g.sure) for g in gold], gold).aer == 0.0
    # possible links cost no precision
    assert score([set(g.possible) for g in gold], gold).aer == 0.0


def test_the_rnn_aligns_the_same_way(tiny_run, tmp_path):
    """An untrained RNN checkpoint with the tiny run's tokenizer: its additive attention is layer 1,
    head 1."""
    import torch

    from attn_mt import checkpoint
    from attn_mt.config import load_config, to_dict
    from attn_mt.data.tokenizer import Tokenizer
    from attn_mt.models import build_model

    cfg = load_config(None, [o for o in TINY if not o.startswith("model.")] + [
        "model.kind=rnn", "model.d_embed=16", "model.d_hidden=16", "model.d_attn=16"])
    tok = Tokenizer.from_state(checkpoint.load(tiny_run / "checkpoint_best.pt")["tokenizer"])
    torch.manual_seed(0)
    path = tmp_path / "rnn.pt"
    checkpoint.save({"model": build_model(cfg.model, **tok.sizes()).state_dict(),
                     "config": to_dict(cfg), "tokenizer": tok.state()}, path)
    rnn = attn_mt.load(path, device="cpu")
    a = rnn.align(SRC, TGT)
    assert sorted(j for _, j in a.links) == list(range(7))
    assert rnn.align(SRC, TGT, method="head1.1") == a
    with pytest.raises(InputError, match="1 layer"):
        rnn.align(SRC, TGT, method="layer2")


def test_the_align_command_prints_links_and_the_table(tiny_run, tmp_path):
    ckpt, src, tgt = tiny_run / "checkpoint_best.pt", tiny_run / "test.en", tiny_run / "test.de"
    r = cli("align", "--checkpoint", str(ckpt), "--src", str(src), "--tgt", str(tgt), "--device",
            "cpu")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == len(src.read_text().splitlines())
    assert all(len(parse_line(line, "x").sure) == len(t.split())
               for line, t in zip(lines, tgt.read_text().splitlines(), strict=True))
    r = cli("align", "--checkpoint", str(ckpt), "--src", str(src), "--tgt", str(tgt), "--gold",
            str(tiny_run / "test.align"), "--by-head", "--device", "cpu")
    assert (r.exit_code == 0
            and r.stdout.splitlines()[0].split() == ["method", "AER", "prec", "recall", "links"])
    assert "shift-head1.2" in r.stdout


def test_a_bad_gold_file_or_request_is_one_line(tiny_run, tmp_path):
    ckpt, src, tgt = tiny_run / "checkpoint_best.pt", tiny_run / "test.en", tiny_run / "test.de"
    bad = tmp_path / "bad.align"
    bad.write_text("0-0\n0-0 0-99\n")
    base = ("align", "--checkpoint", str(ckpt), "--src", str(src), "--tgt", str(tgt), "--device",
            "cpu")
    one_line_error(cli(*base, "--gold", str(bad)), 1, f"{bad} line 3: the gold file has 2 lines")
    lines = tiny_run.joinpath("test.align").read_text().splitlines()
    bad.write_text("\n".join([lines[0], "0-0 0-99", *lines[2:]]) + "\n")
    one_line_error(cli(*base, "--gold", str(bad)), 1, f"{bad} line 2: link 0-99 is out of range")
    bad.write_text("\n".join([lines[0], "0-0 1=1", *lines[2:]]) + "\n")
    one_line_error(cli(*base, "--gold", str(bad)), 1, f"{bad} line 2: '1=1' is not a link")
    one_line_error(cli(*base, "--by-head"), 1, "--by-head scores against a gold file: give --gold")
    one_line_error(cli(*base, "--method", "gdf:layer1"), 1, "give --reverse too")


def test_translate_align_adds_links_to_every_output_form(tiny_run, tmp_path, model):
    ckpt = str(tiny_run / "checkpoint_best.pt")
    text = cli("translate", "--checkpoint", ckpt, "--align", "--device", "cpu", SRC, "a dog.")
    assert text.exit_code == 0, text.output
    plain = (
        cli("translate", "--checkpoint", ckpt, "--device", "cpu", SRC,
            "a dog.").stdout.splitlines())
    for line, hyp, src in zip(text.stdout.splitlines(), plain, [SRC, "a dog."], strict=True):
        out, links = line.split(" ||| ")
        assert out == hyp and links == model.align(src, hyp).pharaoh
    nbest = cli("translate", "--checkpoint", ckpt, "--align", "--beam", "2", "--nbest", "2",
                "--device", "cpu", SRC)
    rows = [line.split(" ||| ") for line in nbest.stdout.splitlines()]
    assert len(rows) == 2 and all(len(r) == 4 and r[3] == model.align(SRC, r[1]).pharaoh
                                  for r in rows)
    jsonl = cli("translate", "--checkpoint", ckpt, "--align", "--format", "jsonl", "--device",
                "cpu", SRC)
    hyp = json.loads(jsonl.stdout)["hypotheses"][0]
    assert hyp["alignment"] == model.align(SRC, hyp["text"]).pharaoh


def test_the_server_gives_links_when_asked(client, model):
    r = client.post("/api/translate", json={"texts": [SRC, "a dog."], "align": True, "beam": 2,
                                            "nbest": 2})
    assert r.status_code == 200, r.text
    aligned = r.json()
    for result in aligned["results"]:
        for h in result["hypotheses"]:
            assert h["alignment"] == model.align(result["source"], h["text"]).pharaoh
    plain = client.post("/api/translate",
                        json={"texts": [SRC]}).json()["results"][0]["hypotheses"][0]
    assert "alignment" not in plain
    # streamed: the same links in the last event
    r = client.post("/api/translate", json={"texts": [SRC, "a dog."], "align": True, "beam": 2,
                                            "nbest": 2, "stream": True})
    done = [json.loads(block.split("data: ", 1)[1]) for block in r.text.split("\n\n")
            if block.startswith("event: done")]
    assert r.status_code == 200 and done == [aligned], r.text



def test_an_export_has_no_attention_to_align(tiny_ct2):
    r = cli("translate", "--checkpoint", str(tiny_ct2), "--align", "--device", "cpu", SRC)
    one_line_error(r, 1, "a CTranslate2 export keeps no attention to align")
