"""attn_mt.load and Model: the same answers as the CLI's verbs, on the tiny trained run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import cli

import attn_mt

SENTENCES = ["a small dog sees the old man.", "", "yesterday the children find the red ball."]


@pytest.fixture(scope="module")
def model(tiny_run):
    return attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")


@pytest.fixture(scope="module")
def fresh(tiny_run) -> dict:
    """What a fresh interpreter saw (one for both tests below: each costs 2 s of importing torch):
    torch loaded by `import attn_mt`; the analyses and steering modules loaded by a plain load,
    translate, translate_nbest and score; then how many public names resolved."""
    code = ("import json, sys, attn_mt; torch = 'torch' in sys.modules; "
            "m = attn_mt.load(sys.argv[1], device='cpu'); m.translate('a dog.', beam=2); "
            "m.translate_nbest(['a dog.'], beam=2, nbest=2); m.score('a dog.', 'ein Hund.'); "
            "loaded = sorted(n for n in ('attn_mt.api.analyses', 'attn_mt.api.steering') "
            "if n in sys.modules); names = [n for n in attn_mt.__all__ if n != 'Score']; "
            "[getattr(attn_mt, n) for n in names]; "
            "print(json.dumps({'torch': torch, 'loaded': loaded, 'names': len(names)}))")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_run / "checkpoint_best.pt")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_importing_attn_mt_loads_no_torch_and_every_public_name_resolves(fresh):
    assert not fresh["torch"], "torch"
    assert fresh["names"] == len(attn_mt.__all__) - 1


def test_plain_translation_loads_neither_the_analyses_nor_steering(fresh):
    assert fresh["loaded"] == []


def test_translate_one_text_or_many_in_input_order_equal_to_the_cli(model, tiny_run):
    many = model.translate(SENTENCES)
    assert [model.translate(s) for s in SENTENCES] == many and many[1] == ""
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--device", "cpu",
                 *SENTENCES)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == many


def test_nbest_gives_scored_hypotheses_best_first(model, tiny_run):
    nbest = model.translate_nbest(SENTENCES[0], beam=4, nbest=3, alpha=0.6)
    assert (len(nbest) == 3
            and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True))
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--device", "cpu",
                 "--beam", "4", "--nbest", "3", "--alpha", "0.6", "--format", "jsonl", SENTENCES[0])
    hyps = json.loads(result.stdout)["hypotheses"]
    assert [h["text"] for h in hyps] == [h.text for h in nbest]
    assert [h["score"] for h in hyps] == [round(h.score, 4) for h in nbest]


def test_length_limits_cut_the_output(model):
    full, short = (model.translate(SENTENCES[0]),
                   model.translate(SENTENCES[0], max_len_a=0, max_len_b=3))
    assert len(model.tokenizer.encode_tgt([full])[0]) > 2 and len(short) < len(full)


@pytest.mark.parametrize("kwargs,field", [({"beam": 0}, "beam"), ({"beam": 2, "nbest": 3}, "nbest"),
                                          ({"max_len_b": -1}, "max_len_b")])
def test_bad_settings_name_the_argument(model, kwargs, field):
    with pytest.raises(attn_mt.InputError) as e:
        model.translate_nbest("a dog.", **kwargs)
    assert e.value.field == field and "--" not in str(e.value)


def test_evaluate_equals_the_cli(model, tiny_run):
    src, ref = tiny_run / "test.en", tiny_run / "test.de"
    result = cli("evaluate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--device", "cpu",
                 "--src", src, "--ref", ref, "--json")
    assert model.evaluate(src, ref) == json.loads(result.stdout)
    lines = src.read_text().splitlines()
    assert (model.evaluate(lines, ref.read_text().splitlines())["bleu"]
            == json.loads(result.stdout)["bleu"])


def test_attention_arrays_match_the_maps_and_rows_sum_to_one(model):
    att = model.attention(SENTENCES[0])
    assert att.translation == model.translate(SENTENCES[0])
    assert att.layers == {"encoder": 1, "decoder": 1, "cross": 1}
    cross = att.weights("cross", layer=1)
    assert cross.shape == (2, len(att.target_tokens), len(att.source_tokens))
    assert torch.allclose(torch.from_numpy(cross.sum(-1)), torch.ones(cross.shape[:2]), atol=1e-5)
    enc = att.weights("encoder", layer=1, head=2)
    assert enc.shape == (len(att.source_tokens),) * 2
    # without a layer: every layer, stacked
    assert att.weights("encoder", head=2).shape == (1, *enc.shape)
    assert (att.weights("cross") == cross[None]).all()
    with pytest.raises(attn_mt.InputError, match="out of range"):
        att.weights("cross", layer=2)


def test_explain_equals_the_cli_json_and_recomputes_the_output(model, tiny_run, tmp_path):
    e = model.explain(SENTENCES[0], kind="encoder", layer=1, head=2, token="▁se")
    assert e.max_abs_diff < 1e-5 and e.query_token == "▁se"
    result = cli("explain", "--checkpoint", tiny_run / "checkpoint_best.pt", "--device", "cpu",
                 SENTENCES[0], "--kind", "encoder", "--layer", "1", "--head", "2", "--token", "▁se",
                 "--json", tmp_path / "e.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "e.json").read_text()) == json.loads(e.to_json())
    assert str(e) in result.stdout


def test_explain_errors_name_the_argument(model):
    with pytest.raises(attn_mt.InputError) as e:
        model.explain(SENTENCES[0], layer=5)
    assert e.value.field == "layer" and "1-1" in e.value.message


def test_heads_on_lists_and_prune_gives_a_new_model_and_leaves_this_one(model, tiny_run, tmp_path):
    src = (tiny_run / "test.en").read_text().splitlines()[:20]
    ref = (tiny_run / "test.de").read_text().splitlines()[:20]
    report = model.heads(src, ref)
    assert len(report.heads) == 6 and report.sentences == 20
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    pruned = model.prune(2, src, ref, out=tmp_path / "p.pt")
    assert all(torch.equal(v, model.module.state_dict()[k]) for k, v in before.items())
    assert len(pruned.report.pruned) == 2 and len(pruned.info["pruned_heads"]) == 2
    again = attn_mt.load(tmp_path / "p.pt", device="cpu")
    assert again.translate(src) == pruned.translate(src)
    assert again.info["pruned_heads"] == pruned.info["pruned_heads"]


def test_errors_share_one_base_and_name_the_thing(tmp_path):
    with pytest.raises(attn_mt.ModelError, match="checkpoint not found"):
        attn_mt.load(tmp_path / "missing.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(attn_mt.AttnMTError, match="bad.pt"):
        attn_mt.load(tmp_path / "bad.pt")
    with pytest.raises(attn_mt.ConfigError, match="train.lrr"):
        attn_mt.configure(None, ["train.lrr=1"])
    with pytest.raises(attn_mt.InputError) as e:
        attn_mt.load(tmp_path / "missing.pt", threads=0)
    assert e.value.field == "threads"


def test_results_have_short_reprs_and_the_heads_report_its_table(model, tiny_run):
    from attn_mt.analysis.overview import table

    src = (tiny_run / "test.en").read_text().splitlines()[:5]
    ref = (tiny_run / "test.de").read_text().splitlines()[:5]
    report = model.heads(src, ref)
    assert report.table() == table(report) and report.table().startswith("BLEU ")
    e = model.explain(SENTENCES[0], kind="encoder", layer=1, head=2, token=1)
    att = model.attention(SENTENCES[0])
    for obj in (model, report, e, att,
                model.contrastive([attn_mt.Item(src[0], ref[0], (ref[1],), "er", 1)])):
        assert len(repr(obj)) < 300, repr(obj)[:400]
    assert "max_abs_diff" in repr(e) and "heads masked on 5 sentences" in repr(report)
