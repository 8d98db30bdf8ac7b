"""Word alignment from attention (decoding/alignment.py), Pharaoh files (decoding/pharaoh.py), AER
(analysis/aer.py) and the toy generator's gold links (data/toy.py, data/pronoun.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import BOS, EOS, PAD, sources, train_reverser

from attn_mt.analysis.aer import report, score
from attn_mt.data.batching import pad
from attn_mt.data.pronoun import make_pronoun_corpus
from attn_mt.data.toy import VERBS, make_aligned_corpus, make_toy_corpus
from attn_mt.decoding.alignment import (
    Attended,
    Method,
    align,
    all_methods,
    combine,
    cross_attention,
    grow_diag_final,
    links,
    parse_method,
    word_of_pieces,
)
from attn_mt.decoding.pharaoh import Gold, format_links, parse_line, read_gold
from attn_mt.errors import InputError


def attended(weights: torch.Tensor, src_words: list[int], tgt_words: list[int]) -> Attended:
    """An Attended of given weights (L, H, T + 1, S); the last source position is </s>."""
    return Attended(weights, torch.tensor([*src_words, -1]), torch.tensor(tgt_words),
                    max(src_words) + 1, max(tgt_words) + 1)


def test_pieces_map_to_whitespace_words():
    assert word_of_pieces(["▁der", "▁Hund", "e", "▁", ".", "▁x"], 4) == [0, 1, 1, 2, 2, 3]
    assert word_of_pieces(["ab", "▁c"], 2) == [0, 1]  # no "▁" on the first piece: still word 0


def test_source_pieces_add_target_pieces_average_and_eos_is_left_out():
    # 3 source pieces (words 0, 0, 1) and </s>; 2 target pieces of one word; rows: predicting piece
    # 0, 1, </s>
    w = torch.tensor([[0.30, 0.30, 0.35, 0.05],  # word 0 gets 0.6 in all, word 1 0.35
                      [0.20, 0.20, 0.10, 0.50],  # much on </s>, which links nothing
                      [0.00, 0.00, 1.00, 0.00]])[None, None]  # (1, 1, 3, 4)
    pair = attended(w, [0, 0, 1], [0, 0])
    assert links(pair, Method(1)) == {(0, 0)}
    # rows 1 and 2: word 1 gets (0.1 + 1.0) / 2
    assert links(pair, Method(1, shift=True)) == {(1, 0)}


def test_head_and_layer_average_read_their_own_weights():
    w = torch.zeros(2, 2, 3, 3)  # (L, H, T + 1, S): two source words, two target words
    w[0, 0, :, 0] = 1  # layer 1 head 1: everything on source word 0
    w[0, 1, :, 1] = 1  # layer 1 head 2: on word 1
    w[1, :, 0, 1] = w[1, :, 1, 0] = 1  # layer 2: crossed
    pair = attended(w, [0, 1], [0, 1])
    assert links(pair, Method(1, 1)) == {(0, 0), (0, 1)}
    assert links(pair, Method(1, 2)) == {(1, 0), (1, 1)}
    assert links(pair, Method(2)) == {(1, 0), (0, 1)}


def test_methods_are_named_and_checked():
    for name in ("layer2", "head1.3", "shift-layer1", "gdf:shift-head2.1", "union:layer1",
                 "intersect:head2.4"):
        assert parse_method(name, 2, 4).name == name
    assert parse_method("head2.1", 2, 4) == Method(2, 1)
    for bad in ("layer3", "head1.5", "head0.1", "layer", "gdf:", "shift:layer1", "layer1.1"):
        with pytest.raises(InputError, match="method"):
            parse_method(bad, 2, 4)
    names = [m.name for m in all_methods(2, 2, combined=True)]
    # layers x (average, heads) x shift x 4 ways
    assert len(names) == len(set(names)) == 2 * (1 + 2) * 2 * 4


def test_grow_diag_final_grows_from_the_intersection_to_neighbours():
    forward = {(0, 0), (1, 1), (3, 2)}  # each target word to one source word
    backward = {(0, 0), (1, 1), (2, 1), (3, 3)}  # each source word to one target word
    assert combine(forward, backward, "intersect") == {(0, 0), (1, 1)}
    assert combine(forward, backward, "union") == forward | backward
    # (2, 1) neighbours (1, 1) and aligns source word 2; the final step adds (3, 2) and (3, 3) of
    # unaligned words
    assert grow_diag_final(forward, backward) == {(0, 0), (1, 1), (2, 1), (3, 2), (3, 3)}
    assert grow_diag_final(set(), set()) == set()


def test_a_reverse_model_is_needed_to_combine():
    pair = attended(torch.full((1, 1, 2, 2), 0.5), [0], [0])
    with pytest.raises(InputError, match="reverse"):
        align([pair], Method(1, combine="gdf"))
    assert align([pair], Method(1, combine="union"), [pair]) == [{(0, 0)}]


def test_a_trained_reverser_aligns_each_output_with_the_mirrored_input():
    """The reverser's target is its source reversed: the gold link of target word j is source word
    n-1-j."""
    model = train_reverser()
    xs = [s[:-1] for s in sources(40, 7)]
    src, tgt_in = pad([x + [EOS] for x in xs], PAD), pad([[BOS, *x[::-1]] for x in xs], PAD)
    cross = cross_attention(model, src, tgt_in)  # (B, L, H, T + 1, S)
    pairs = [attended(cross[b, :, :, : len(x) + 1, : len(x) + 1], list(range(len(x))),
                      list(range(len(x))))
             for b, x in enumerate(xs)]
    gold = [Gold(frozenset((len(x) - 1 - j, j) for j in range(len(x)))) for x in xs]
    diagonal = score([{(j, j) for j in range(len(x))} for x in xs], gold)
    # half-trained (100 steps): 59% against the diagonal's 91%
    table = report(pairs, gold, all_methods(2, 4))
    assert table.rows[table.best].aer < 0.7 * diagonal.aer, table.table()
    # one link per target word
    assert all(r.links == sum(map(len, xs)) for r in table.rows.values())


def test_aer_precision_and_recall_by_their_definitions():
    gold = [Gold(frozenset({(0, 0), (1, 1)}), frozenset({(2, 1)}))]
    assert score([{(0, 0), (1, 1)}], gold).aer == 0.0
    s = score([{(0, 0), (2, 1), (2, 2)}], gold)  # |A| 3, |S| 2, |A&S| 1, |A&P| 2
    assert (s.precision, s.recall, s.aer) == (66.67, 50.0, 40.0)
    assert score([set()], gold).aer == 100.0


def test_pharaoh_lines_read_and_write():
    g = parse_line("0-0 1p2 2-1", "x", (3, 3))
    assert g.sure == {(0, 0), (2, 1)} and g.possible == {(0, 0), (2, 1), (1, 2)}
    assert (parse_line("1-1 2p3", "x", (2, 3), one_indexed=True)
            == Gold(frozenset({(0, 0)}), frozenset({(1, 2)})))
    assert format_links({(2, 1), (0, 0), (1, 2)}) == "0-0 1-2 2-1"
    assert parse_line("", "x", (0, 0)) == Gold(frozenset())


@pytest.mark.parametrize("lines,one,expected", [
    (["0-0", "0-0 1x0"], False, "line 2: '1x0' is not a link"),
    (["0-0", "0-0 0-2"], False, "line 2: link 0-2 is out of range: 2 source and 2 target words"),
    (["1-1", "1-1 0-1"], True, "line 2: link 0-1 has an index 0"),
    (["0-0"], False, "line 2: the gold file has 1 lines, the texts 2"),
    (["0-0", "0-0", "0-0"], False, "line 3: the gold file has 3 lines, the texts 2"),
])
def test_a_bad_gold_file_is_refused_naming_the_file_and_line(tmp_path, lines, one, expected):
    path = tmp_path / "gold.align"
    path.write_text("".join(f"{line}\n" for line in lines))
    with pytest.raises(InputError) as e:
        read_gold(path, ["a b", "a b"], ["c d", "c d"], one_indexed=one)
    assert str(e.value).startswith(f"{path} {expected}") and "\n" not in str(e.value)


def test_the_toy_gold_links_every_word_of_both_sides_and_only_punctuation_is_possible():
    corpus = make_aligned_corpus(300)
    assert [(p.en, p.de) for p in corpus["test"]] == make_toy_corpus(300)["test"]
    for p in corpus["test"]:
        en, de = p.en.split(), p.de.split()
        gold = parse_line(p.pharaoh(), "toy", (len(en), len(de)))
        assert ({i for i, _ in gold.sure} == set(range(len(en)))
                and {j for _, j in gold.sure} == set(range(len(de))))
        # the full stops' link, where not sure
        assert gold.possible - gold.sure <= {(len(en) - 1, len(de) - 1)}


def test_the_toy_gold_follows_the_rules_reordering():
    pairs = [p for s in make_aligned_corpus(3000).values() for p in s]
    verbs = {v for row in VERBS for v in row[:2]}
    that = [p for p in pairs if " that " in p.en and " because " not in p.en]
    assert len(that) > 100
    # "... that S V O." -> "..., dass S O V.": German's last word links to the clause's verb
    for p in that:
        sure = {j: i for i, j, s in p.links if s}
        assert p.en.split()[sure[len(p.de.split()) - 1]] in verbs, p
    # one word, three: "am nächsten Tag"
    tomorrow = next(p for p in pairs if p.en.startswith("tomorrow "))
    assert {(0, 0, True), (0, 1, True), (0, 2, True)} <= set(tomorrow.links)


def test_the_pronoun_variant_links_the_pronoun_and_every_word_it_can():
    for ex in make_pronoun_corpus(300)["test"][:60]:
        en, de = ex.en.split(), ex.de.split()
        gold = parse_line(ex.links, "pronoun", (len(en), len(de)))
        assert (ex.src_positions["pronoun"], ex.tgt_positions["pronoun"]) in gold.sure
        assert (ex.src_positions["antecedent"], ex.tgt_positions["antecedent"]) in gold.sure
        # every English word has a counterpart
        assert {i for i, _ in gold.sure} == set(range(len(en)))
