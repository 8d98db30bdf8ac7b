"""attn-mt export --format transformers: the folder loads offline, and transformers' generate()
gives our translations and log-probabilities (pre-norm: our modeling file; post-norm:
MarianMTModel)."""

import contextlib
import io
import re
import sys
from dataclasses import replace

import pytest
import torch
import yaml
from conftest import TINY, cli, one_line_error, random_checkpoint
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attn_mt import checkpoint
from attn_mt.config import load_config
from attn_mt.data.toy import make_toy_corpus
from attn_mt.decoding.metrics import score
from attn_mt.decoding.translate import max_lengths, prepare_sources, translate_nbest

# small, but trained far enough to write sentences that end before the length limit (every one of
# the 25 compared, greedy and beam 5, both norms, after 100 steps)
TRAINED = ["data.toy_size=2000", "model.d_model=64", "model.d_ff=128", "train.batch_tokens=1500",
           "train.max_steps=100", "train.max_epochs=100", "train.lr=5e-3", "train.warmup_steps=20",
           "train.eval_every=100", "train.bleu_sentences=20"]
NORMS = {"pre-norm": ["model.norm_first=true", "decode.beam_size=5"],
         "post-norm": ["model.norm_first=false"]}


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    return transformers


@pytest.fixture(scope="module")
def trained(hf, tmp_path_factory):
    """norm -> (run directory, transformers folder) of a tiny model trained for 150 steps, made on
    first use."""
    from attn_mt.export.transformers import export_hf
    from attn_mt.training.run import train

    made = {}

    def get(norm: str):
        if norm not in made:
            run = tmp_path_factory.mktemp(f"hf_{norm}")
            train(load_config(None, [*TINY, *TRAINED, *NORMS[norm]]), run)
            export_hf(run / "checkpoint_best.pt", run / "hf")
            made[norm] = run, run / "hf"
        return made[norm]

    return get


def _load(hf, folder):
    model = hf.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    return model, hf.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)



@pytest.mark.parametrize("overrides", [(), ("model.norm_first=false",),
                                       ("tokenizer.joint=false", "model.tie_embeddings=false"),
                                       ("tokenizer.joint=false", "model.norm_first=false"),
                                       ("model.tie_embeddings=false",)],
                         ids=["pre-norm", "post-norm", "pre-norm-separate-untied",
                              "post-norm-separate-tied", "joint-untied"])
def test_teacher_forced_log_probs_match(hf, tiny_cfg, tiny_run, tmp_path, overrides):
    from attn_mt.export.transformers import export_hf

    model, tok = random_checkpoint(tiny_cfg, tiny_run, tmp_path / "random.pt", *overrides)
    export_hf(tmp_path / "random.pt", tmp_path / "hf")
    theirs, hf_tok = _load(hf, tmp_path / "hf")
    assert type(theirs).__name__ == ("MarianMTModel" if "model.norm_first=false" in overrides
                                     else "AttnMtForConditionalGeneration")
    pairs = make_toy_corpus(300)["test"][:8]  # the tiny run's corpus: its tokenizer knows the words
    srcs, tgts = [s for s, _ in pairs], tok.encode_tgt([t for _, t in pairs])
    batch = hf_tok(srcs, return_tensors="pt", padding=True)  # right-padded, as ours
    ours_src = prepare_sources(tok, srcs, model.max_positions)
    lengths = batch.attention_mask.sum(1).tolist()
    assert [row[:n].tolist() for row, n in zip(batch.input_ids, lengths, strict=True)] == ours_src
    tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([tok.bos_id, *t]) for t in tgts],
                                             batch_first=True)
    with torch.no_grad():
        ours = model(batch.input_ids, tgt_in).log_softmax(-1)  # (B, T, V)
        logits = theirs(**batch, decoder_input_ids=tgt_in).logits.log_softmax(-1)
    for i, t in enumerate(tgts):  # positions of real target tokens only
        torch.testing.assert_close(logits[i, : len(t) + 1], ours[i, : len(t) + 1], atol=1e-4,
                                   rtol=1e-4)


def _generate(model, hf_tok, texts: list[str], limit_of) -> dict[int, list]:
    """transformers' greedy (text, log P) and beam 5 texts (no length penalty), in input order.
    generate() takes one length limit per call where we stop each sentence at its own (a * |src| +
    b): batches by limit."""
    out: dict[int, list] = {1: [None] * len(texts), 5: [None] * len(texts)}
    groups: dict[int, list[int]] = {}
    for i, text in enumerate(texts):
        groups.setdefault(limit_of(text), []).append(i)
    for limit, idx in groups.items():
        batch = hf_tok([texts[i] for i in idx], return_tensors="pt", padding=True)
        for beam in (1, 5):
            extra = dict(length_penalty=0.0, early_stopping="never") if beam > 1 else {}
            gen = model.generate(**batch, num_beams=beam, max_new_tokens=limit, output_logits=True,
                                 return_dict_in_generate=True, **extra)
            lines = hf_tok.batch_decode(gen.sequences, skip_special_tokens=True)
            # log P: the model's log-probabilities (the logits before the forced eos) up to eos
            if beam == 1:
                logp = model.compute_transition_scores(gen.sequences, gen.logits,
                                                       normalize_logits=True)
                logp = (
                    logp.masked_fill(gen.sequences[:, 1:] == hf_tok.pad_token_id,
                                     0.0).sum(1).tolist())
                lines = list(zip(lines, logp, strict=True))
            for i, line in zip(idx, lines, strict=True):
                out[beam][i] = line
    return out


@pytest.mark.slow
@pytest.mark.parametrize("norm", NORMS)
def test_generate_gives_our_translations(hf, trained, norm):
    run, folder = trained(norm)
    theirs, hf_tok = _load(hf, folder)
    model, cfg, tok = checkpoint.load_model(run / "checkpoint_best.pt")
    # of the 100 test sentences: both decoders translate them greedily and with beam 5 (transformers
    # in one call per length limit: 50 sentences took 26 calls a beam)
    n = 25
    texts, refs = ((run / "test.en").read_text().splitlines()[:n],
                   (run / "test.de").read_text().splitlines()[:n])
    # alpha 0: both beam searches rank by log P alone (their |Y|^alpha and our GNMT penalty differ
    # otherwise)
    ours = {beam: translate_nbest(model, tok, texts, replace(cfg.decode, beam_size=beam, alpha=0.0))
            for beam in (1, 5)}

    def limit_of(text: str) -> int:
        n = len(prepare_sources(tok, [text], model.max_positions)[0])
        return int(max_lengths(torch.tensor([n]), cfg.decode, model.max_positions))

    # shipped: the exponent that moves with length as GNMT's does at the mean length
    if cfg.decode.beam_size > 1:
        lengths = [len(ids) + 1
                   for ids in tok.encode_tgt((run / "test_hyps.txt").read_text().splitlines())]
        mean = sum(lengths) / len(lengths)
        assert (theirs.generation_config.length_penalty
                == pytest.approx(cfg.decode.alpha * mean / (5 + mean), abs=1e-3))
    gen = _generate(theirs, hf_tok, texts, limit_of)
    pairs = list(zip(gen[1], (o[0] for o in ours[1]), strict=True))
    # MarianTokenizer strips the decoded text; ours keeps a space from a final lone "▁" piece
    same = [(lp, o.log_prob) for (t, lp), o in pairs if t == o.text.strip()]
    assert len(same) >= 0.99 * len(texts), [(t, o.text) for (t, _), o in pairs
                                            if t != o.text.strip()]
    assert max(abs(a - b) for a, b in same) < 1e-4, max((abs(a - b), a) for a, b in same)
    beam_pairs = [(t, o[0].text.strip()) for t, o in zip(gen[5], ours[5], strict=True)]
    assert (sum(a == b for a, b in beam_pairs) >= 0.95
            * len(texts)), [p for p in beam_pairs if p[0] != p[1]]
    bleu = {"ours": score([o[0].text for o in ours[5]], refs)["bleu"],
            "theirs": score(gen[5], refs)["bleu"]}
    assert abs(bleu["ours"] - bleu["theirs"]) <= 0.3, bleu


@pytest.mark.slow
def test_cli_export_and_the_cards_example(hf, trained, tmp_path, monkeypatch):
    run, _ = trained("post-norm")
    out = tmp_path / "shared"
    result = cli("export", "--format", "transformers", "--checkpoint", run / "checkpoint_best.pt",
                 "--out", out)
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json",
            # Marian: no custom code
            "source.spm", "vocab.json", "README.md"} <= names and "modeling_attn_mt.py" not in names
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    results = yaml.safe_load((run / "results.json").read_text())
    assert header["language"] == ["en", "de"] and header["pipeline_tag"] == "translation"
    assert header["model-index"][0]["results"][0]["metrics"][0]["value"] == results["test_bleu"]
    assert results["sacrebleu_signature"] in card and f"{results['params']:,}" in card
    assert str(run.parent.parent) not in card  # a published card names no path of this machine
    # the card's usage example, run offline
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(out)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet, {})
    model, cfg, tok = checkpoint.load_model(run / "checkpoint_best.pt")
    example = eval(re.search(r"tokenizer\(\[(.*)\], return_tensors", snippet).group(1))
    assert (printed.getvalue().strip()
            == translate_nbest(model, tok, [example], cfg.decode)[0][0].text.strip())


def test_rnn_and_missing_extra_are_one_line(tiny_run, tmp_path, monkeypatch):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    checkpoint.save({**state, "config": {**state["config"], "model": {"kind": "rnn"}}},
                    tmp_path / "rnn.pt")
    args = ["export", "--format", "transformers", "--out", tmp_path / "out", "--checkpoint"]
    if "transformers" in sys.modules or _installed("transformers"):
        one_line_error(cli(*args, tmp_path / "rnn.pt"), 1, "RNN", "only Transformer checkpoints")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    one_line_error(cli(*args, tiny_run / "checkpoint_best.pt"), 1, "pip install 'attn-mt[hf]'")
    assert not (tmp_path / "out").exists()


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_format_and_quantization_are_checked(tiny_run, tmp_path):
    ckpt = tiny_run / "checkpoint_best.pt"
    for args, hint in ((["--format", "onnx"], "'onnx' is not one of"),
                       (["--format", "transformers", "--quantization", "int8"],
                        "export keeps float32")):
        result = cli("export", "--checkpoint", ckpt, "--out", tmp_path / "out", *args)
        assert result.exit_code == 2 and hint in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_the_cards_config_names_no_path_of_this_machine():
    from attn_mt.export.model_card import _shareable

    cfg = load_config(None, ["data.source=files", "data.dir=/home/someone/corpora/multi30k",
                             "data.cache_dir=/scratch/someone/cache"])
    data = _shareable(cfg)["data"]
    assert (data["dir"], data["cache_dir"]) == ("/path/to/multi30k", "/path/to/cache")


@pytest.mark.slow  # a fresh interpreter importing torch: 2-3 s
def test_the_transformers_exporter_does_not_load_the_ctranslate2_exporter():
    """Both exporters share checkpoint_reader.py; neither needs the other's module."""
    import subprocess

    code = ("import sys, attn_mt.export.transformers; "
            "sys.exit('attn_mt.export.ctranslate2' in sys.modules or 'ctranslate2' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


NASTY = ["de-en: small #2", "x\nlicense: mit\nlibrary_name: evil\npipeline_tag: text-generation",
         "'\"{[&*!|>%@`", "multi30k #1: en-de", " - a\n---\n"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.one_of(st.sampled_from(NASTY), st.text(min_size=1, max_size=40)),
       folder=st.one_of(st.sampled_from(NASTY),
                        st.text(alphabet=st.characters(blacklist_characters="/\0"),
                                min_size=1, max_size=30)))
@example(name="de-en: small #2", folder="data #1: en-de")
def test_the_card_header_reads_back_as_written(name, folder):
    """A run name or data folder with ':', '#', quotes or newlines used to break the header or
    inject keys (license, library_name, pipeline_tag) or change the dataset's entry."""
    from attn_mt.export.model_card import card_header

    cfg = load_config(None, [])
    cfg = replace(cfg, name=name, data=replace(cfg.data, dir=f"/data/{folder}"))
    results = {"test_split": "test2016", "test_bleu": 12.5, "test_chrf": 40.1}
    header = card_header(cfg, results, folder, remote=False)
    assert (header.startswith("---\n") and header.endswith("\n---") and header.count("\n---") == 1
            + (
        "\n---" in header[4:-4]))
    meta = yaml.safe_load(header[4:-4])
    assert list(meta) == ["language", "license", "library_name", "pipeline_tag", "tags", "metrics",
                          "model-index"]
    assert ((meta["license"], meta["library_name"], meta["pipeline_tag"])
            == (None, "transformers", "translation"))
    entry = meta["model-index"][0]
    assert (entry["name"] == name
            and entry["results"][0]["dataset"] == {"name": folder, "type": folder,
                                                   "split": "test2016"})
    assert "license: # choose one" in header
