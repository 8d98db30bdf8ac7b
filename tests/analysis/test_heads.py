"""attn-mt heads: masking a head is zeroing its columns of W_o, the roles on constructed attention,
a pruned checkpoint that scores what `heads` reported (and that translate, evaluate, serve and both
exporters accept), and the one-line errors."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TINY, cli, one_line_error

from attn_mt import checkpoint
from attn_mt.analysis.masking import Head, all_heads, masked, prune
from attn_mt.analysis.roles import Keys, RoleSums, key_info, spearman
from attn_mt.config import load_config
from attn_mt.decoding.translate import greedy, translate
from attn_mt.errors import InputError
from attn_mt.models import build_model


def _model(tiny_cfg, impl: str):
    torch.manual_seed(0)
    model = build_model(tiny_cfg("model.n_layers=2", f"model.attention={impl}").model, src_vocab=40,
                        tgt_vocab=40, pad_id=0, shared_vocab=True).eval()
    with torch.no_grad():  # noisy biases and norms, so every head matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_masking_a_head_is_zeroing_its_columns_of_w_o(tiny_cfg, impl):
    model = _model(tiny_cfg, impl)
    src = torch.tensor([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0]])  # (B, S), padded
    tgt = torch.tensor([[2, 12, 13, 14], [2, 15, 0, 0]])  # (B, T)
    keys = set(model.state_dict())
    full = model(src, tgt)
    for h in all_heads(model):
        with masked(model, [h]):
            out = model(src, tgt)
            tokens = greedy(model, src, torch.tensor([6, 6]), 2, 3)  # with the decoder's cache
        zeroed = copy.deepcopy(model)
        m = {"encoder": zeroed.encoder, "decoder": zeroed.decoder,
             "cross": zeroed.decoder}[h.kind][h.layer - 1]
        m = m.cross_attn if h.kind == "cross" else m.self_attn
        with torch.no_grad():
            m.out_proj.weight[:, (h.head - 1) * m.d_k : h.head * m.d_k] = 0
        assert torch.equal(out, zeroed(src, tgt)), h
        assert not torch.allclose(out, full), h  # the head did something
        pruned = copy.deepcopy(model)
        prune(pruned, [h])  # W_q, W_k, W_v rows too: still the same output
        assert torch.equal(out, pruned(src, tgt)), h
        assert tokens == greedy(pruned, src, torch.tensor([6, 6]), 2, 3), h
    assert torch.equal(model(src, tgt), full)  # the masks are gone after the block
    assert set(model.state_dict()) == keys  # and never were weights


def _keys(b: int, t: int, rare: list[int], boundary: list[int], punct: list[int]) -> Keys:
    marks = torch.zeros(b, t, dtype=torch.bool)
    marks[:, punct] = True
    return Keys(torch.ones(b, t, dtype=torch.bool), torch.tensor(rare), torch.tensor(boundary),
                marks)


def test_roles_of_constructed_attention():
    t = 6
    w = torch.zeros(2, 4, t, t)  # (B, H, Tq, Tk)
    rows = torch.arange(t)
    # head 1: the previous token (the first query: itself)
    w[:, 0, rows, (rows - 1).clamp(min=0)] = 1.0
    w[:, 1, rows, rows] = 1.0  # head 2: itself
    w[:, 2, :, 3] = 0.5  # head 3: half on the rare token (position 3), half on eos (position 5)
    w[:, 2, :, 5] = 0.5
    w[:, 3] = 1.0 / t  # head 4: evenly spread
    sums = RoleSums(4)
    sums.add(w, torch.ones(2, t, dtype=torch.bool), _keys(2, t, [3, 3], [5, 5], [4]),
             self_attention=True, causal=False)
    prev, same, spread, even = sums.shares()
    assert (prev["prev"] == 1.0 and prev["same"] == pytest.approx(1 / t, abs=1e-4)
            and prev["next"] == 0.0)
    assert same["same"] == 1.0 and same["prev"] == 0.0 and same["conf"] == 1.0
    assert (spread["rare"] == 0.5 and spread["eos"] == 0.5 and spread["punct"] == 0.0
            and spread["conf"] == 0.5)
    assert (even["punct"] == pytest.approx(1 / t, abs=1e-4)
            and even["conf"] == pytest.approx(1 / t, abs=1e-4))
    assert prev["mono"] is None  # self-attention has no alignment


def test_causal_roles_count_only_visible_keys():
    t = 5
    w = torch.zeros(1, 1, t, t)
    w[0, 0, :, 0] = 1.0  # everything on bos
    sums = RoleSums(1)
    sums.add(w, torch.ones(1, t, dtype=torch.bool), _keys(1, t, [2], [0], []), self_attention=True,
             causal=True)
    (shares,) = sums.shares()
    assert shares["eos"] == 1.0 and shares["next"] is None and shares["rare"] == 0.0
    assert sums.counts["rare"] == 3  # queries 2, 3, 4 see the rare token at position 2


def test_monotony_of_cross_attention():
    assert spearman(torch.arange(7).numpy()) == pytest.approx(1.0)
    assert spearman(torch.arange(7).flip(0).numpy()) == pytest.approx(-1.0)
    assert spearman(torch.full((7,), 2).numpy()) == 0.0
    w = torch.zeros(1, 2, 4, 6)  # (B, H, T, S)
    w[0, 0, torch.arange(4), torch.tensor([0, 2, 3, 5])] = 1.0  # monotone
    w[0, 1, torch.arange(4), torch.tensor([5, 1, 4, 0])] = 1.0
    sums = RoleSums(2)
    keys = Keys(torch.ones(1, 6, dtype=torch.bool), torch.tensor([1]), torch.tensor([5]),
                torch.zeros(1, 6).bool())
    sums.add(w, torch.ones(1, 4, dtype=torch.bool), keys, self_attention=False, causal=False)
    mono, other = sums.shares()
    assert mono["mono"] == 1.0 and other["mono"] < 0 and mono["prev"] is None


def test_key_info_finds_rarest_token_punctuation_and_eos(tiny_run):
    tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")[2]
    ids = [tok.encode_src(["the dog, the dog."])[0] + [tok.eos_id],
           tok.encode_src(["a cat."])[0] + [tok.eos_id]]
    counts = torch.tensor([i for s in ids for i in s]).bincount().tolist()
    batch = torch.tensor([ids[0], ids[1] + [0] * (len(ids[0]) - len(ids[1]))])
    keys = key_info(batch, tok.src, Counter(dict(enumerate(counts))), tok.pad_id, tok.eos_id)
    pieces = [tok.src.id_to_piece(i) for i in ids[0]]
    assert keys.boundary.tolist() == [len(ids[0]) - 1, len(ids[1]) - 1]
    assert [p for p, m in zip(pieces, keys.punct[0].tolist(), strict=True) if m] == [",", "."]
    rare = keys.rare[0]
    assert counts[ids[0][rare]] == min(counts[i] for i, p in zip(ids[0], pieces, strict=True)
                                       if p not in (",", ".", "</s>"))
    assert not keys.valid[1, len(ids[1]):].any()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny model trained long enough to translate a little (BLEU above 0: 5 epochs at a high
    learning rate, a quick validation BLEU), with short outputs."""
    from attn_mt.training.run import train

    run_dir = tmp_path_factory.mktemp("heads_run")
    train(load_config(None, [*TINY, "train.max_epochs=5", "train.lr=1e-2",
                             "train.bleu_sentences=5", "decode.max_len_a=1.2",
                             "decode.max_len_b=5"]), run_dir)
    return run_dir


def _first(path: Path, n: int, out: Path) -> Path:
    out.write_text("\n".join(path.read_text(encoding="utf-8").splitlines()[:n]) + "\n",
                   encoding="utf-8")
    return out


@pytest.mark.slow
def test_pruned_checkpoint_scores_what_heads_reported(trained, tmp_path):
    src, ref = (_first(trained / f"test.{lang}", 20, tmp_path / f"{lang}.txt")
                for lang in ("en", "de"))
    ckpt, out = trained / "checkpoint_best.pt", tmp_path / "pruned.pt"
    result = cli("heads", "--checkpoint", ckpt, "--src", src, "--ref", ref, "--prune", "2", "--out",
                 out, "--json", tmp_path / "heads.json", "--png", tmp_path / "heads.png",
                 "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines() if str(tmp_path) not in line) <= 80
    report = json.loads((tmp_path / "heads.json").read_text())
    assert len(report["heads"]) == 6 and report["sentences"] == 20 and report["bleu"] > 0
    # each change with its interval
    assert all(h["d_bleu_low"] <= h["d_bleu_high"] for h in report["heads"])
    assert (tmp_path / "heads.png").read_bytes()[:4] == b"\x89PNG"
    evaluated = cli("evaluate", "--checkpoint", out, "--src", src, "--ref", ref, "--beam", "1",
                    "--json")
    assert (json.loads(evaluated.stdout)["bleu"] == report["bleu_after"]
            == report["pruned"][-1]["bleu"])
    state = checkpoint.load(out)
    gone = [Head(**h) for h in state["pruned_heads"]]
    assert [str(h) for h in gone] == [p["head"] for p in report["pruned"]]
    model, cfg, tok = checkpoint.load_model(ckpt)
    lines, dcfg = src.read_text().splitlines(), replace(cfg.decode, beam_size=1)
    with masked(model, gone):
        want = translate(model, tok, lines, dcfg)
    translated = cli("translate", "--checkpoint", out, "--beam", "1", "--input", src)
    assert translated.stdout.splitlines() == want
    assert want != translate(model, tok, lines, dcfg)  # pruning changed something
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from attn_mt.serve import Limits, create_app

    with TestClient(create_app(out, Limits(), device="cpu"), base_url="http://localhost") as client:
        served = client.post("/api/translate", json={"texts": lines, "beam": 1}).json()["results"]
    assert [r["hypotheses"][0]["text"] for r in served] == want
    pytest.importorskip("ctranslate2")
    assert cli("export", "--checkpoint", out, "--out", tmp_path / "ct2").exit_code == 0
    assert (cli("translate", "--checkpoint", tmp_path / "ct2", "--beam", "1", "--input", src).stdout
            == translated.stdout)
    pytest.importorskip("transformers")
    assert (
        cli("export", "--checkpoint", out, "--out", tmp_path / "hf", "--format",
            "transformers").exit_code == 0)


def _rnn(tmp: Path, run: Path) -> Path:
    from attn_mt.config import from_dict, load_config, to_dict
    from attn_mt.models import build_model

    state = checkpoint.load(run / "checkpoint_best.pt")
    rnn = load_config(None, ["model.kind=rnn", "model.d_embed=16", "model.d_hidden=16",
                             "model.d_attn=16"]).model
    cfg = replace(from_dict(state["config"]), model=rnn)
    model = build_model(rnn, **checkpoint.tokenizer_from_state(state["tokenizer"]).sizes())
    checkpoint.save({**state, "model": model.state_dict(), "config": to_dict(cfg)}, tmp / "rnn.pt")
    return tmp / "rnn.pt"


def _short(tmp: Path, run: Path) -> Path:
    return _first(run / "test.de", 3, tmp / "short.de")


BAD = {  # name: (arguments after the checkpoint's, the checkpoint, texts of the one line)
    "lines differ": (lambda tmp, run: ["--ref", _short(tmp, run)], lambda tmp,
                     run: run / "checkpoint_best.pt", ["line counts differ",
                                                       "test.en has 100 lines", "short.de has 3"]),
    "export folder": (lambda tmp, run: [], lambda tmp, run: tmp,
                      ["--checkpoint", "a folder (an export?)"]),
    "rnn": (lambda tmp, run: [], _rnn, ["--checkpoint", "an RNN model; heads needs a Transformer"]),
    "prune without out": (lambda tmp, run: ["--prune", "2"], lambda tmp,
                          run: run / "checkpoint_best.pt", ["--prune 2 needs --out FILE"]),
    "prune too many": (lambda tmp, run: ["--prune", "7", "--out", tmp / "p.pt"],
                       lambda tmp, run: run / "checkpoint_best.pt",
                       ["--prune: cannot prune 7 heads: the model has 6"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_naming_the_flag(case, tiny_run, tmp_path):
    args, ckpt, texts = BAD[case]
    result = cli("heads", "--checkpoint", ckpt(tmp_path, tiny_run), "--src", tiny_run / "test.en",
                 "--ref", tiny_run / "test.de", *args(tmp_path, tiny_run))
    one_line_error(result, 1, *texts)
    assert not (tmp_path / "p.pt").exists()


def test_pruning_refuses_a_contrastive_set_before_the_model_loads(tiny_run, tmp_path):
    (tmp_path / "set.jsonl").write_text('{"src": "a", "ref": "b", "pronoun": "es", "distance": 2, '
                                        '"variants": ["c"]}\n')
    ckpt, sentences = tiny_run / "checkpoint_best.pt", ["--src", tiny_run / "test.en", "--ref",
                                                        tiny_run / "test.de"]
    # alone it cannot prune; with them it is unused
    for args, flag in (([], "--src"), (sentences, "--contrastive")):
        result = cli("heads", "--checkpoint", ckpt, "--contrastive", tmp_path / "set.jsonl", *args,
                     "--prune", "1", "--out", tmp_path / "p.pt")
        one_line_error(result, 1, flag, "measures each head on --src and --ref")
    assert not (tmp_path / "p.pt").exists()


@pytest.mark.parametrize("args,texts", [
    (["--json", "{ckpt}"], ["--json", "must end in .json"]),
    (["--json", "{tmp}/in.json"], ["--json", "the same file as the input"]),
    (["--prune", "1", "--out", "{tmp}/p.pt", "--json", "{tmp}/p.pt"],
     ["--json", "must end in .json"]),
    (["--png", "{tmp}/g.pt"], ["--png", "must end in .png"]),
    (["--prune", "1", "--out", "{tmp}/missing/p.pt", "--json", "{tmp}/r.json"],
     ["--out", "missing does not exist"]),
])
def test_output_paths_are_checked_before_any_work(args, texts, tiny_run, tmp_path):
    """Each of these used to run the whole analysis and then write over the checkpoint or a report,
    or end in a traceback; now one line, status 2, and every file as it was."""
    ckpt = tmp_path / "h.pt"
    ckpt.write_bytes((tiny_run / "checkpoint_best.pt").read_bytes())
    src = tmp_path / "in.json"  # a source file whose name a careless --json could take
    src.write_text((tiny_run / "test.en").read_text())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = cli("heads", "--checkpoint", ckpt, "--src", src, "--ref", tiny_run / "test.de",
                 "--device", "cpu", *[a.format(ckpt=ckpt, tmp=tmp_path) for a in args])
    one_line_error(result, 2, *texts)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def _pruned_wrongly(tmp: Path, run: Path, value) -> Path:
    state = checkpoint.load(run / "checkpoint_best.pt")
    checkpoint.save({**state, "pruned_heads": value}, tmp / "odd.pt")
    return tmp / "odd.pt"


@pytest.mark.parametrize("value,says", [
    (["encoder 1.1"], "pruned_heads[0] is not a head of this model"),
    ([{"kind": "encoder", "layer": 1}], "pruned_heads[0]"),
    ([{"kind": "cross", "layer": 1, "head": 1}, {"kind": "cross", "layer": 9, "head": 1}],
     "pruned_heads[1]"),
    ({"kind": "cross"}, "pruned_heads[0]"),
])
def test_a_malformed_pruned_heads_list_is_one_line(value, says, tiny_run, tmp_path):
    result = cli("heads", "--checkpoint", _pruned_wrongly(tmp_path, tiny_run, value), "--src",
                 tiny_run / "test.en", "--ref", tiny_run / "test.de", "--device", "cpu")
    one_line_error(result, 1, "odd.pt", says)


def test_empty_src_and_ref_are_one_line(tiny_run, tmp_path):
    (tmp_path / "empty.en").write_text("")
    (tmp_path / "empty.de").write_text("")
    result = cli("heads", "--checkpoint", tiny_run / "checkpoint_best.pt", "--src",
                 tmp_path / "empty.en", "--ref", tmp_path / "empty.de", "--device", "cpu")
    one_line_error(result, 1, "--src", "empty.en: no lines")


@pytest.mark.parametrize(("args", "text"), [
    ((Path("s"), Path("r"), None, 2, None), "`n` 2 needs `out` FILE"),
    ((Path("s"), Path("r"), None, 0, Path("p.pt")), "`out` is where `n` writes"),
    ((Path("s"), None, None, 0, None), "give `src` with `ref`"),
    ((None, None, None, 0, None), "give `src` with `ref`"),
])
def test_the_heads_request_is_checked_below_the_cli_naming_arguments(args, text):
    from attn_mt.analysis.heads import check_request

    with pytest.raises(InputError, match=re.escape(text)) as e:
        check_request(*args)
    assert "--" not in str(e.value)
    check_request(None, None, Path("c.jsonl"))  # a contrastive set alone is enough


def test_bleu_change_intervals_are_paired_over_resampled_sentences():
    from attn_mt.analysis import intervals

    refs = [f"the dog {i} runs after the red ball ." for i in range(30)]
    # a third of the sentences broken
    worse = [r if i % 3 else "a cat sleeps" for i, r in enumerate(refs)]
    base, changed = intervals.sentence_stats(refs, refs), intervals.sentence_stats(worse, refs)
    assert base.shape == (30, 10)
    idx = intervals.draws(30)
    # the same sentences: no change in any draw
    assert intervals.delta_interval(base, base, idx) == (0.0, 0.0)
    lo, hi = intervals.delta_interval(base, changed, idx)
    assert lo < hi < 0  # worse in every resample, by an amount that depends on the draw
    near = intervals.sentence_stats([r if i else "a cat sleeps" for i, r in enumerate(refs)], refs)
    lo1, hi1 = intervals.delta_interval(base, near, idx)
    assert lo1 < hi1 <= 0 and lo1 > lo  # one broken sentence: a smaller change; some draws miss it


def test_one_spelling_of_a_heads_name_on_every_surface():
    """heads' reports, explain's and the maps' kinds, and the history's modules (its page, PNG and
    marks: tests/analysis/test_history_view.py) all name decoder self-attention's layer 1, head 4
    "decoder 1.4"."""
    from attn_mt.analysis.names import head_name, module_head

    assert (str(Head("decoder", 1, 4)) == head_name("decoder_self", 1, 4)
            == module_head("decoder 1 self", 4))
    assert str(Head("cross", 2, 3)) == head_name("cross", 2, 3) == module_head("decoder 2 cross", 3)
    assert (module_head("decoder 1 self", 4) == "decoder 1.4"
            and module_head("decoder cross", 1) == "cross 1.1")
