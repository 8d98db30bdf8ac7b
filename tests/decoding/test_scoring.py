"""attn-mt score: forced-decoding log-probabilities of given translations, for checkpoints and
CTranslate2 exports, and contrastive accuracy on our JSONL and ContraPro's JSON."""

import json

import pytest
import torch
from conftest import cli, toy_test_files

from attn_mt import checkpoint
from attn_mt.data.lines import DataError
from attn_mt.data.pronoun import classic, contrastive_records, make_pronoun_corpus
from attn_mt.data.toy import make_toy_corpus
from attn_mt.decoding.contrastive import (
    evaluate_contrastive,
    items_from_records,
    read_items,
    subject_rule,
)
from attn_mt.decoding.scoring import score_texts
from attn_mt.decoding.translate import prepare_sources
from attn_mt.decoding.translator import checkpoint_translator


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return checkpoint.load_model(tiny_run / "checkpoint_best.pt")


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return make_toy_corpus(300)["test"][:10]


def test_scores_are_those_of_step_by_step_decoding(loaded, pairs):
    """Forced decoding of whole targets equals feeding them one token at a time through the
    decoder's cache."""
    model, _, tok = loaded
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    scores = score_texts(model, tok, sources, refs)
    for src_ids, tgt_ids, s in zip(prepare_sources(tok, sources, model.max_positions),
                                   tok.encode_tgt(refs), scores, strict=True):
        src = torch.tensor([src_ids])
        mask = model.src_mask(src)
        memory, cache, expected = model.encode(src, mask), model.new_cache(), []
        with torch.no_grad():
            for prev, nxt in zip([tok.bos_id, *tgt_ids], [*tgt_ids, tok.eos_id], strict=True):
                logp = model.decode(torch.tensor([[prev]]), memory, mask, cache)[0, -1].log_softmax(
                    -1)
                expected.append(float(logp[nxt]))
        assert s.tokens == tok.tgt_pieces([*tgt_ids, tok.eos_id]) and s.tokens[-1] == "</s>"
        assert s.token_log_probs == pytest.approx(expected, abs=1e-4)
        assert s.log_prob == pytest.approx(sum(expected), abs=1e-4)


def test_scores_are_in_input_order_whatever_the_batches(loaded, pairs):
    model, _, tok = loaded
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    one = score_texts(model, tok, sources, refs, batch_size=1)
    all_ = score_texts(model, tok, sources, refs, batch_size=64)
    assert [s.tokens for s in one] == [s.tokens for s in all_]
    assert [s.log_prob for s in one] == pytest.approx([s.log_prob for s in all_], abs=1e-4)
    assert one[0].log_prob != pytest.approx(one[1].log_prob)  # each pair its own score


def test_an_empty_target_scores_eos_and_long_targets_are_truncated(loaded, pairs):
    model, _, tok = loaded
    empty, long = score_texts(model, tok, [pairs[0][0]] * 2, ["", " ".join([pairs[0][1]] * 100)])
    assert empty.tokens == ["</s>"] and empty.log_prob < 0
    assert len(long.tokens) == model.max_positions and long.tokens[-1] == "</s>"
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        score_texts(model, tok, ["a", "b"], ["c"])


def test_contrastive_accuracy_is_the_reference_beating_every_variant(tiny_run, loaded):
    model, _, tok = loaded
    items = items_from_records(contrastive_records(make_pronoun_corpus(200, seed=0)["test"]))[:12]
    report = evaluate_contrastive(
        checkpoint_translator(tiny_run / "checkpoint_best.pt", "cpu").score, items)
    for item, ok in zip(items, report.results, strict=True):
        ref, *variants = score_texts(model, tok, [item.src] * 3, [item.ref, *item.variants])
        assert ok == all(ref.log_prob > v.log_prob for v in variants)
    assert report.items == 12 and report.correct == sum(report.results)
    assert sum(v["items"] for v in report.by_pronoun.values()) == 12
    assert sum(v["items"] for v in report.by_distance.values()) == 12


def test_always_the_subject_scores_about_half():
    items = items_from_records(contrastive_records(make_pronoun_corpus(12000, seed=0)["test"]))
    report = subject_rule(items)
    assert 0.4 < report.accuracy < 0.6
    assert (report.by_role["subject"]["accuracy"] == 1.0 and report.by_role["object"]["accuracy"]
            == 0.0)


def test_contrapro_json_is_read(tmp_path):
    tired = classic("tired")
    entry = {"document id": "x.de", "segment id": 3, "src segment": tired.en,
             "ref segment": tired.de, "src pronoun": "It", "ref pronoun": "es", "ante distance": 0,
             "intrasegmental": True, "errors": [{"contrastive": tired.de.replace(" es ", " er "),
                                                 "replacement": "er"},
                        {"contrastive": tired.de.replace(" es ", " sie "), "replacement": "sie"}]}
    (tmp_path / "contrapro.json").write_text(json.dumps([entry, {**entry, "ante distance": 5}]))
    a, b = read_items(tmp_path / "contrapro.json")
    assert ((a.src, a.ref, a.pronoun, a.src_pronoun, a.unit)
            == (tired.en, tired.de, "es", "it", "sentences"))
    assert a.variants[1] == "das Tier überquerte die Straße nicht, weil sie zu müde war."
    report = evaluate_contrastive(lambda s, t: [0.0 if " es " in x else -1.0 for x in t], [a, b])
    assert report.accuracy == 1.0 and list(report.by_distance) == ["0", ">3"]


@pytest.mark.parametrize("content,message", [
    ('{"src": "a", "ref": "b", "pronoun": "es", "distance": 2}\nnot json\n',
     "bad.jsonl:1: no 'variants' field"),
    ('{"src": "a", "ref": "b", "pronoun": "es", "distance": 2, "variants": ["c"]}\n{"src"\n',
     "bad.jsonl:2: not valid"),
    ('{"src": "a", "ref": "b", "pronoun": "es", "distance": -1, "variants": ["c"]}\n',
     "'distance' must be"),
    ('[{"src segment": "a", "ref segment": "b", "ref pronoun": "es", "ante distance": 0, "errors": '
     '[]}]', "bad.jsonl: entry 0: 'errors' must be a non-empty list"),
    ("", "no contrastive items"),
    ('[{"src segment": "a", "ref segment": "b", "ref pronoun": "es", "ante distance": 0, "errors": '
     '5}]', "bad.jsonl: entry 0: 'errors' must be a non-empty list"),
    ("[" * 100_000 + "]" * 100_000, "bad.jsonl: not valid JSON \\(nested too deep\\)"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "bad.jsonl:1: not valid JSON \\(nested too deep\\)"),
])
def test_a_bad_contrastive_file_is_one_line_naming_it(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(DataError, match=message.replace("[", r"\[")):
        read_items(tmp_path / "bad.jsonl")


def test_the_score_command(tiny_run, tmp_path):
    src, ref = toy_test_files(tmp_path, 5)
    records = contrastive_records(make_pronoun_corpus(200, seed=0)["test"])[:6]
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    ckpt = tiny_run / "checkpoint_best.pt"
    result = cli("score", "--checkpoint", ckpt, "--src", src, "--ref", ref, "--contrastive",
                 tmp_path / "set.jsonl", "--json", tmp_path / "out.json", "--device", "cpu")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    model, _, tok = checkpoint.load_model(ckpt)
    expected = score_texts(model, tok, src.read_text().splitlines(), ref.read_text().splitlines())
    assert [float(x) for x in lines[:5]] == pytest.approx([s.log_prob for s in expected], abs=1e-3)
    assert lines[5].startswith("contrastive accuracy") and "(6 items" not in lines[5]
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["contrastive"]["items"] == 6 and len(saved["scores"]) == 5
    assert saved["scores"][0]["tokens"][-1] == "</s>"
    bad = cli("score", "--checkpoint", ckpt, "--src", src)
    assert bad.exit_code == 2 and "--src and --ref go together" in bad.output
