"""The head that resolves "it" (analysis/coref.py): words found among their pieces, each head's
weights from the pronoun on its antecedent and on the other noun, and `heads --contrastive` with
masking."""

import json

import pytest
import torch
from conftest import cli

from attn_mt.analysis.coref import locate, resolution, word_pieces
from attn_mt.config import TokenizerConfig
from attn_mt.data.pronoun import contrastive_records, make_pronoun_corpus
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.decoding.contrastive import items_from_records
from attn_mt.models import AttentionWeights


@pytest.fixture(scope="module")
def corpus():
    return make_pronoun_corpus(400, seed=3)


@pytest.fixture(scope="module")
def items(corpus):
    return items_from_records(contrastive_records(corpus["test"]))[:30]


@pytest.fixture(scope="module")
def tok(corpus):
    text = [e.en for e in corpus["train"]], [e.de for e in corpus["train"]]
    return train_tokenizer(TokenizerConfig(type="bpe", vocab_size=300, joint=True), *text)


def _text(tok_side, ids_or_pieces: list[str]) -> str:
    return "".join(ids_or_pieces).replace("\u2581", " ").strip()


def test_words_are_found_among_their_pieces(tok, items):
    for item in items:
        x = locate(item, tok, 256)
        assert x is not None
        src_pieces = tok.src.encode(item.src, out_type=str)
        # the decoder input: bos first
        tgt_pieces = ["<s>", *tok.tgt.encode(item.ref, out_type=str)]
        words, tgt_words = item.src.split(), item.ref.split()
        assert _text(tok.src, [src_pieces[x.src_pronoun]]) == item.src_pronoun
        assert _text(tok.src, [src_pieces[j] for j
                               in x.src_antecedent]) == words[item.src_positions["antecedent"]]
        assert _text(tok.src, [src_pieces[j]
                               for j in x.src_other]) == words[item.src_positions["other"]]
        assert _text(tok.tgt, [tgt_pieces[j] for j in x.tgt_antecedent]).rstrip(",") == \
            tgt_words[item.tgt_positions["antecedent"]].rstrip(",")
        # the query predicts the pronoun
        assert _text(tok.tgt, [tgt_pieces[x.tgt_query + 1]]) == item.pronoun
    assert word_pieces(tok.src, "a  b") == []  # pieces that are not the text's words: not located
    assert locate(items[0], tok, 8) is None  # beyond the model's positions


def test_each_heads_resolution_is_its_weights_on_the_two_nouns(tok, items, tiny_cfg):
    """Batched and padded, the measure equals one item's weights read directly, head by head."""
    from attn_mt.models import build_model

    torch.manual_seed(0)
    model = build_model(tiny_cfg().model, **tok.sizes()).eval()
    res, located = resolution(model, tok, items, torch.device("cpu"))
    assert located == len(items)
    expected = {k: torch.zeros(len(model.encoder), model.cfg.n_heads, 3, dtype=torch.float64)
                for k in ("encoder", "decoder", "cross")}
    for item in items:
        x = locate(item, tok, model.max_positions)
        src = torch.tensor([[*x.src_ids, tok.eos_id]])
        tgt_in = torch.tensor([[tok.bos_id, *x.tgt_ids]])
        w = AttentionWeights()
        with torch.no_grad():
            model.decode(tgt_in, model.encode(src, model.src_mask(src), w), model.src_mask(src),
                         weights=w)
        for kind, maps, q, keys in (("encoder", w.encoder_self, x.src_pronoun,
                                     (x.src_antecedent, x.src_other)),
                                    ("decoder", w.decoder_self, x.tgt_query,
                                     (x.tgt_antecedent, x.tgt_other)),
                                    ("cross", w.cross, x.tgt_query,
                                     (x.src_antecedent, x.src_other))):
            for layer, m in enumerate(maps):
                a, o = (m[0, :, q, k].sum(-1).double() for k in keys)
                expected[kind][layer, :, 0] += (a > o).double()
                expected[kind][layer, :, 1] += a
                expected[kind][layer, :, 2] += o
    for kind, r in res.items():
        for layer in range(len(model.encoder)):
            for head in range(model.cfg.n_heads):
                row = r.row(layer, head)
                want = expected[kind][layer, head] / len(items)
                assert row["resolved"] == pytest.approx(float(want[0]), abs=1e-4)
                assert row["antecedent"] == pytest.approx(float(want[1]), abs=1e-3)
                assert row["other"] == pytest.approx(float(want[2]), abs=1e-3)
                assert row["antecedent"] + row["other"] <= 1 + 1e-6


@pytest.mark.slow
def test_heads_with_a_contrastive_set(tiny_run, tmp_path, corpus):
    """`attn-mt heads --contrastive` alone: the set's sentences are measured, every head gets its
    coref share and its masked accuracy, the top heads are masked together, and the table, JSON, PNG
    and HTML show it."""
    path = tmp_path / "test.contrastive.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in contrastive_records(corpus["test"])[:20]))
    out = tmp_path / "heads.json"
    result = cli("heads", "--checkpoint", str(tiny_run / "checkpoint_best.pt"), "--contrastive",
                 str(path), "--json", str(out), "--png", str(tmp_path / "h.png"), "--html",
                 str(tmp_path / "h.html"))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert (report["sentences"] == 20 and report["coref"]["items"] == 20
            and 0 <= report["contrastive"] <= 1)
    for row in report["heads"]:
        assert set(row["coref"]) == {"resolved", "antecedent", "other"}
        assert row["d_contrastive"] == pytest.approx(row["contrastive"] - report["contrastive"],
                                                     abs=1e-4)
    top = report["coref"]["top"]
    # the tiny model: 2 heads a layer, 1 layer
    assert [len(t["heads"]) for t in top] == [1, 2, 1, 2]
    best = max((r for r in report["heads"] if r["kind"] == "encoder"),
               key=lambda r: r["coref"]["resolved"])
    assert top[0]["heads"] == [f"encoder {best['layer']}.{best['head']}"]
    header = next(line for line in result.output.splitlines() if line.startswith("head "))
    assert header.split()[-1] == "coref" and "contrastive accuracy" in result.output
    assert max(map(len, result.output.splitlines()[:-3])) <= 80
    assert "coref" in (tmp_path / "h.html").read_text() and (tmp_path / "h.png").stat().st_size > 0


def test_heads_needs_sentences_or_a_contrastive_set(tiny_run):
    result = cli("heads", "--checkpoint", str(tiny_run / "checkpoint_best.pt"))
    assert result.exit_code != 0 and "--contrastive" in result.output
