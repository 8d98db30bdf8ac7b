"""MarianMT models opened as ours: token ids equal MarianTokenizer's, logits MarianMTModel's (1e-4),
greedy and beam outputs generate()'s (same beam, length penalty 1, no repetition rules), on 200 toy
sentences; the model API (translate, score, attention, explain, heads) and serve run on one; our own
export reads back the same."""

from __future__ import annotations

import pytest
import torch
from marian_models import folders, texts

import attn_mt
from attn_mt import checkpoint
from attn_mt.data.batching import pad
from attn_mt.decoding.translate import prepare_sources, search
from attn_mt.imports.marian import is_marian, marian_state

N, LIMIT = 200, 48  # sentences compared; output tokens at most (eos included), forced eos there


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return folders(tmp_path_factory)


@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("transformers")


def _ours(folder):
    return checkpoint.model_from_state(marian_state(folder))


@pytest.mark.parametrize("kind", ["shared", "separate", "multilingual"])
def test_token_ids_are_marian_tokenizers(hf, marian, kind):
    folder = marian(kind)
    theirs = hf.MarianTokenizer.from_pretrained(folder)
    _, _, tok = _ours(folder)
    pairs = texts(N)
    src = [(">>fr<< " if kind == "multilingual" else "") + s for s, _ in pairs]
    tgt = [t for _, t in pairs]
    assert prepare_sources(tok, src, 64) == theirs(src)["input_ids"]
    assert ([[*ids, tok.eos_id] for ids in tok.encode_tgt(tgt)]
            == theirs(text_target=tgt)["input_ids"])
    assert (tok.eos_id == 0 and tok.unk_id == 1 and tok.pad_id == tok.bos_id == tok.tgt_vocab_size
            - 1)
    if kind == "multilingual":
        assert tok.src_pieces(">>fr<< a dog")[0] == ">>fr<<"


@pytest.mark.parametrize("kind", ["shared", "separate"])
def test_logits_are_marian_mt_models(hf, marian, kind):
    folder = marian(kind)
    theirs = hf.MarianMTModel.from_pretrained(folder).eval()
    assert theirs.final_logits_bias.abs().max() > 0.1  # the bias is there to be reproduced
    tokenizer = hf.MarianTokenizer.from_pretrained(folder)
    model, cfg, tok = _ours(folder)
    assert ((cfg.model.activation, cfg.model.positions, cfg.model.norm_first)
            == ("swish", "halves", False))
    pairs = texts(N)
    batch = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt",
                      padding=True)
    labels = batch["labels"]
    start = torch.full_like(labels[:, :1], tok.bos_id)
    tgt_in = torch.cat([start, labels[:, :-1]], dim=1).masked_fill(
        torch.cat([start, labels[:, :-1]], 1) < 0, 0)
    with torch.no_grad():
        expected = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          decoder_input_ids=tgt_in).logits
        got = model(batch["input_ids"], tgt_in)
    real = labels != tok.pad_id  # (B, T) positions of real target tokens
    assert int(real.sum()) > 2000
    assert (got - expected)[real].abs().max() < 1e-4


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("kind", ["shared", "separate"])
def test_greedy_and_beam_outputs_are_generates(hf, marian, kind, beam):
    from dataclasses import replace

    folder = marian(kind)
    theirs = hf.MarianMTModel.from_pretrained(folder).eval()
    tokenizer = hf.MarianTokenizer.from_pretrained(folder)
    model, cfg, tok = _ours(folder)
    assert (cfg.decode.beam_size == 4 and cfg.decode.length_norm == "power"
            and cfg.decode.alpha == 1.0)
    dcfg = replace(cfg.decode, beam_size=beam, max_len_a=0.0, max_len_b=LIMIT)
    srcs = prepare_sources(tok, [s for s, _ in texts(N)], model.max_positions)
    src = pad(srcs, tok.pad_id)  # (N, S)
    ours = [h[0].tokens for h in search(model, tok, src, torch.full((N,), LIMIT), dcfg)]
    batch = tokenizer([s for s, _ in texts(N)], return_tensors="pt", padding=True)
    assert batch["input_ids"].tolist() == src.tolist()
    with torch.no_grad():
        how = (dict(num_beams=beam, length_penalty=1.0, early_stopping="never") if beam > 1
               else dict(num_beams=1))
        out = theirs.generate(**batch, **how, do_sample=False, max_new_tokens=LIMIT,
                              no_repeat_ngram_size=0, repetition_penalty=1.0)
    generated = [[i for i in row[1:] if i != tok.pad_id] for row in out.tolist()]
    generated = [row[: row.index(tok.eos_id)] if tok.eos_id in row else row for row in generated]
    ended = [len(a) < LIMIT - 1 and len(b) < LIMIT - 1 for a,
             b in zip(ours, generated, strict=True)]
    assert sum(ended) > N // 4  # many outputs end before the limit
    same = [a == b for a, b in zip(ours, generated, strict=True)]
    # greedy: every output; beam: every one that ends before the limit (there transformers' forced
    # eos costs nothing, ours its log P, so a hypothesis cut at the limit can rank otherwise)
    if beam == 1:
        assert all(same), f"{N - sum(same)} of {N} differ"
    else:
        assert all(s for s, e in zip(same, ended, strict=True) if e), (
            "outputs that end before the limit differ")
    assert all(tok.pad_id not in x for x in ours)


def test_the_api_runs_on_a_marian_model(marian, tmp_path, monkeypatch):
    folder = marian("shared")
    assert (is_marian(folder) and is_marian("Helsinki-NLP/opus-mt-en-de")
            and not is_marian(folder / "config.json"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert not is_marian("runs/missing.pt")  # a missing file in a folder here is not a hub name
    monkeypatch.chdir(folder.parent)
    model = attn_mt.load(folder, device="cpu")
    (src, ref), *_ = texts(4)
    assert isinstance(model.translate(src), str)
    score = model.score([src], [ref])[0]
    assert score.tokens[-1] == "</s>" and score.log_prob < 0
    att = model.attention(src)
    assert (att.weights("cross", layer=2, head=2).shape[1]
            == len(prepare_sources(model.tokenizer, [src], 64)[0]))
    e = model.explain(src, kind="cross", layer=2, head=1, token=0)
    assert e.max_abs_diff < 1e-4
    pairs = texts(12)
    report = model.heads([s for s, _ in pairs], [t for _, t in pairs], sentences=12)
    assert len(report.heads) == 2 * 2 * 3 and report.loss > 0  # 2 layers x 2 heads x 3 kinds


def test_serve_opens_a_marian_folder(marian):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from attn_mt.serve import create_app

    src = texts(1)[0][0]
    expected = attn_mt.load(marian("shared"), device="cpu").translate(src)
    with TestClient(create_app(marian("shared"), device="cpu"),
                    base_url="http://localhost") as client:
        answer = client.post("/api/translate", json={"texts": [src]})
        assert answer.status_code == 200, answer.text
        assert expected in answer.text


def test_a_folder_that_is_not_marian_says_so(tmp_path, marian):
    import json
    import shutil

    folder = shutil.copytree(marian("shared"), tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="without weights"):
        attn_mt.load(folder)
    (folder / "config.json").write_text(
        json.dumps({**json.loads((folder / "config.json").read_text()),
                    "activation_function": "gelu_new"}))
    with pytest.raises(checkpoint.CheckpointError, match="activation_function='gelu_new'"):
        marian_state(folder)


@pytest.mark.parametrize("overrides", [(), ("tokenizer.joint=false",), ("model.norm_first=true",),
                                       ("model.norm_first=true", "tokenizer.joint=false",
                                        "model.tie_embeddings=false")],
                         ids=["joint", "separate", "pre-norm", "pre-norm-separate-untied"])
def test_our_export_reads_back_the_same_model(hf, tiny_cfg, tiny_run, tmp_path, overrides):
    from conftest import random_checkpoint

    from attn_mt.decoding.scoring import score_texts
    from attn_mt.decoding.translate import translate_nbest
    from attn_mt.export.transformers import export_hf

    model, tok = random_checkpoint(tiny_cfg, tiny_run, tmp_path / "ours.pt",
                                   "model.norm_first=false", *overrides)
    export_hf(tmp_path / "ours.pt", tmp_path / "hf")
    back, cfg, back_tok = _ours(tmp_path / "hf")
    # written as modeling_attn_mt.py's model, else as a MarianMT one
    pre = "model.norm_first=true" in overrides
    assert (cfg.model.positions == ("interleaved" if pre else "halves")
            and cfg.model.norm_first == pre)
    assert cfg.model.kind == ("transformer" if pre else "marian")
    assert cfg.model.activation == "relu" and not getattr(cfg.model, "banned_ids", ())
    pairs = texts(20)
    srcs, refs = [s for s, _ in pairs], [t for _, t in pairs]
    assert (back_tok.encode_src(srcs) == tok.encode_src(srcs)
            and back_tok.encode_tgt(refs) == tok.encode_tgt(refs))
    for dcfg in (tiny_cfg().decode, tiny_cfg("decode.beam_size=4").decode):
        theirs = translate_nbest(back, back_tok, srcs, dcfg)
        assert [n[0].text for n in theirs] == [n[0].text
                                               for n in translate_nbest(model, tok, srcs, dcfg)]
    ours_scores = score_texts(model, tok, srcs, refs)
    back_scores = score_texts(back, back_tok, srcs, refs)
    assert [s.tokens for s in back_scores] == [s.tokens for s in ours_scores]
    assert (max(abs(a.log_prob - b.log_prob) for a, b in zip(ours_scores, back_scores, strict=True))
            < 1e-4)
    assert attn_mt.load(tmp_path / "hf", device="cpu").translate(srcs[0]) is not None
