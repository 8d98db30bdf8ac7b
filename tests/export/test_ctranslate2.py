"""attn-mt export: CTranslate2 gives our log-probabilities and our translations; errors are one
line."""

import json
import shutil
import sys
from dataclasses import replace

import pytest
import torch
from conftest import random_checkpoint
from typer.testing import CliRunner

from attn_mt import checkpoint
from attn_mt.cli import app
from attn_mt.data.toy import make_toy_corpus
from attn_mt.decoding.translate import prepare_sources, translate_nbest
from attn_mt.export.ctranslate2 import export_ct2

runner = CliRunner()


@pytest.fixture(scope="module")
def toy_test() -> list[tuple[str, str]]:
    return make_toy_corpus(300)["test"]  # the tiny run's corpus (data.toy_size=300)



@pytest.mark.parametrize("overrides", [(), ("model.norm_first=false",),
                                       ("tokenizer.joint=false", "model.tie_embeddings=false"),
                                       ("model.tie_embeddings=false",)],
                         ids=["pre-norm", "post-norm", "separate-vocab", "joint-vocab-untied"])
def test_teacher_forced_log_probs_match(tiny_cfg, tiny_run, toy_test, tmp_path, overrides):
    ct2 = pytest.importorskip("ctranslate2")
    model, tok = random_checkpoint(tiny_cfg, tiny_run, tmp_path / "random.pt", *overrides)
    export_ct2(tmp_path / "random.pt", tmp_path / "ct2")
    translator = ct2.Translator(str(tmp_path / "ct2"), intra_threads=1)
    pairs = toy_test[:8]
    srcs = prepare_sources(tok, [s for s, _ in pairs], model.max_positions)
    tgts = tok.encode_tgt([t for _, t in pairs])
    results = translator.score_batch([[tok.src.id_to_piece(i) for i in s] for s in srcs],
                                     [[tok.tgt.id_to_piece(i) for i in t] for t in tgts])
    for src, tgt, result in zip(srcs, tgts, results, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([[tok.bos_id, *tgt]]))  # (1, T, V)
        ours = logits.log_softmax(-1)[0].gather(1, torch.tensor([*tgt, tok.eos_id])[:, None])[:, 0]
        assert result.tokens[-1] == tok.tgt.id_to_piece(tok.eos_id)
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, atol=1e-4, rtol=1e-4)


def test_greedy_and_beam_give_our_translations(tiny_run, tiny_ct2, toy_test):
    from attn_mt.imports import ct2_translator as ct2

    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")
    exp = ct2.load_exported(tiny_ct2, threads=1)
    texts = [s for s, _ in toy_test] + ["", "   "]
    for beam, nbest in ((1, 1), (4, 2)):
        dcfg = replace(cfg.decode, beam_size=beam, nbest=nbest, batch_size=16)
        ours, theirs = (translate_nbest(model, tok, texts, dcfg),
                        ct2.translate_nbest(exp, texts, dcfg))
        best = [(a[0].text, b[0].text) for a, b in zip(ours, theirs, strict=True)]
        same = sum(a == b for a, b in best)
        # greedy: the same tokens by construction; beam: CTranslate2 stops after beam_size finished
        # hypotheses
        assert (same == len(texts) if beam == 1
                else same >= 0.95 * len(texts)), [p for p in best if p[0] != p[1]]
        assert all(len(b) == (nbest if t.strip() else 1) for t,
                   b in zip(texts, theirs, strict=True))
        assert theirs[-1][0].text == "" and all(h.score >= b[-1].score for b in theirs
                                                for h in b[:1])


def test_load_opens_a_checkpoint_file_with_torch_and_a_folder_with_ctranslate2(tiny_run, tiny_ct2):
    import attn_mt

    ckpt = attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu").translator
    folder = attn_mt.load(tiny_ct2, device="cpu").translator
    assert (ckpt.kind, folder.kind) == ("checkpoint", "export")
    assert (ckpt.model is not None and folder.model is None
            and folder.state["step"] == ckpt.state["step"])
    texts = ["a dog", "the old man sees a small dog."]
    dcfg = replace(ckpt.decode, beam_size=1, nbest=1)
    assert ([n[0].text for n in folder.translate_nbest(texts, dcfg)]
            == [n[0].text for n in ckpt.translate_nbest(
        texts, dcfg)])
    model = attn_mt.load(tiny_ct2, device="cpu")
    for call in (lambda: model.attention("a dog"), lambda: model.explain("a dog"),
                 lambda: model.heads(["a"], ["b"])):
        with pytest.raises(attn_mt.ModelError, match=r": a CTranslate2 export keeps no PyTorch "
                           r"weights to \w+; give a checkpoint file") as e:
            call()
        assert e.value.field == "path"
    assert model.translate(t for t in texts) == [n[0].text
                                                 for n in folder.translate_nbest(texts, dcfg)]
    for call, field in [(lambda: model.translate("a dog", target_prefix="ein"), "target_prefix"),
                        (lambda: model.translate("a dog", temperature=0.5), "temperature"),
                        (lambda: model.stream("a dog"), "path"),
                        (lambda: model.to(dtype="bfloat16"), "dtype")]:
        with pytest.raises(attn_mt.ModelError) as e:
            call()
        assert e.value.field == field


def test_cli_export_translate_evaluate(tiny_run, tmp_path, toy_test):
    pytest.importorskip("ctranslate2")
    ckpt, out = str(tiny_run / "checkpoint_best.pt"), tmp_path / "ct2"
    for quantization in ("int8", "float32"):  # a second export replaces the first
        result = runner.invoke(app, ["export", "--checkpoint", ckpt, "--out", str(out),
                                     "--quantization", quantization])
        assert result.exit_code == 0, result.output
    assert ({"model.bin", "config.json", "spm.model", "attn_mt.json"}
            <= {p.name for p in out.iterdir()})
    src = "\n".join(s for s, _ in toy_test[:5]) + "\n"
    ours = runner.invoke(app, ["translate", "--checkpoint", ckpt, "--beam", "1"], input=src)
    theirs = runner.invoke(app, ["translate", "--checkpoint", str(out), "--beam", "1"], input=src)
    assert theirs.exit_code == 0 and theirs.stdout == ours.stdout and theirs.stdout.count("\n") == 5
    jsonl = runner.invoke(app, ["translate", "--checkpoint", str(out), "--format", "jsonl",
                                "--beam", "3", "--nbest", "2", toy_test[0][0]])
    assert jsonl.exit_code == 0 and jsonl.stdout.count('"text"') == 2
    (tmp_path / "src.txt").write_text(src)
    (tmp_path / "ref.txt").write_text("\n".join(t for _, t in toy_test[:5]) + "\n")
    result = runner.invoke(app, ["evaluate", "--checkpoint", str(out), "--src",
                                 str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt"),
                                 "--json"])
    assert result.exit_code == 0 and '"bleu"' in result.stdout


def _one_line_error(result, *needles):
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_rnn_and_other_inputs_are_refused_in_one_line(tiny_run, tmp_path):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    checkpoint.save({**state, "config": {**state["config"], "model": {"kind": "rnn"}}},
                    tmp_path / "rnn.pt")
    pytest.importorskip("ctranslate2")
    _one_line_error(runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "rnn.pt"), "--out",
                                        str(tmp_path / "out")]), "RNN", "only Transformer")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    _one_line_error(runner.invoke(app, ["export", "--checkpoint",
                                        str(tiny_run / "checkpoint_best.pt"), "--out",
                                        str(tmp_path / "other")]), "other: is not empty",
                    "notes.txt")
    _one_line_error(runner.invoke(app, ["translate", "--checkpoint", str(tmp_path / "other"),
                                        "hello"]),
                    "without attn_mt.json")
    for key, value in (("qk_norm", True), ("norm", "rms"), ("activation", "relu2"),
                       ("positions", "rotary"), ("positions", "learned")):
        model = {**state["config"]["model"], key: value}
        checkpoint.save({**state, "config": {**state["config"], "model": model}},
                        tmp_path / f"{key}_{value}.pt")
        for fmt in ("ctranslate2", "transformers"):
            _one_line_error(runner.invoke(app, ["export", "--checkpoint",
                                                str(tmp_path / f"{key}_{value}.pt"), "--out",
                                                str(tmp_path / f"{key}_{value}_{fmt}"), "--format",
                                                fmt]),
                            f"model.{key}=", "cannot be exported", "docs/export.md")


def test_the_position_scheme_says_whether_it_exports(tiny_cfg, monkeypatch):
    """Both exports ask the scheme (`not_exported`: why not, or None), not a list of names: each
    scheme's answer is what they do, and a scheme that changes its answer changes theirs."""
    from attn_mt.export.checkpoint_reader import ExportError, check_exportable
    from attn_mt.models.positions import SCHEMES, Sinusoidal

    assert [name for name, scheme in SCHEMES.items() if scheme.not_exported is None] == [
        "interleaved"]
    for name, scheme in SCHEMES.items():
        cfg = tiny_cfg(f"model.positions={name}")
        if scheme.not_exported is None:
            check_exportable(cfg, "c.pt", "CTranslate2")
        else:
            with pytest.raises(ExportError, match=f"positions={name} .*{scheme.not_exported}"):
                check_exportable(cfg, "c.pt", "CTranslate2")
    monkeypatch.setattr(Sinusoidal, "not_exported", "no table today")
    with pytest.raises(ExportError, match="positions=interleaved .*no table today"):
        check_exportable(tiny_cfg(), "c.pt", "transformers")


def test_missing_ctranslate2_says_what_to_install(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails as if not installed
    result = runner.invoke(app, ["export", "--checkpoint", str(tiny_run / "checkpoint_best.pt"),
                                 "--out", str(tmp_path / "out")])
    _one_line_error(result, "pip install 'attn-mt[export]'")


def test_reexport_never_deletes_the_checkpoint_or_user_files(tiny_run, tmp_path, monkeypatch):
    ct2 = pytest.importorskip("ctranslate2")
    out, ckpt = tmp_path / "ex1", tmp_path / "ex1" / "my.pt"
    export_ct2(tiny_run / "checkpoint_best.pt", out)
    first = sorted(p.name for p in out.iterdir())
    ckpt.write_bytes((tiny_run / "checkpoint_best.pt").read_bytes())
    _one_line_error(runner.invoke(app, ["export", "--checkpoint", str(ckpt), "--out", str(out)]),
                    "ex1: holds", "my.pt", "which this export reads")
    (tmp_path / "elsewhere.pt").write_bytes(ckpt.read_bytes())
    _one_line_error(runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "elsewhere.pt"),
                                        "--out", str(out)]),
                    "ex1: holds files an earlier export did not write: my.pt")
    assert sorted(p.name for p in out.iterdir()) == sorted([*first, "my.pt"])
    ckpt.unlink()
    model_bin = (out / "model.bin").read_bytes()

    def fails(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ct2.specs.TransformerSpec, "save", fails)
    _one_line_error(runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "elsewhere.pt"),
                                        "--out", str(out), "--quantization", "int8"]),
                    "No space left on device")
    assert (sorted(p.name for p in out.iterdir()) == first
            and (out / "model.bin").read_bytes() == model_bin)
    # no temporary folder left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.pt", "ex1"]


def test_damaged_exports_fail_in_one_line_naming_the_file(tiny_ct2, tmp_path):
    meta = json.loads((tiny_ct2 / "attn_mt.json").read_text())
    cases = {
        "corrupt-spm": ("spm.model", b"\x0agarbage", "spm.model: not a SentencePiece model"),
        "empty-spm": ("spm.model", b"", "spm.model: empty SentencePiece model"),
        "no-max-positions": ("attn_mt.json",
                             {k: v for k, v in meta.items() if k != "max_positions"},
                             "attn_mt.json: max_positions must be a positive integer, not None"),
        "negative-max-positions": ("attn_mt.json", {**meta, "max_positions": -5}, "not -5"),
        "no-sentencepiece": ("attn_mt.json", {**meta, "sentencepiece": []},
                             "sentencepiece must list 1 or 2"),
        "outside": ("attn_mt.json", {**meta, "sentencepiece": ["../spm.model"]},
                    "file names in the export"),
        "list": ("attn_mt.json", [], "attn_mt.json: unreadable"),
        "bad-decode": ("attn_mt.json", {**meta, "decode": {"beam_size": "x"}},
                       "attn_mt.json: unreadable"),
    }
    for name, (file, content, message) in cases.items():
        out = shutil.copytree(tiny_ct2, tmp_path / name)
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (out / file).write_bytes(data)
        result = runner.invoke(app, ["translate", "--checkpoint", str(out), "hello"])
        _one_line_error(result, f"{out}", message)
        assert result.exit_code == 1
