"""Decode options are defined once (attn_mt.DECODE_OPTIONS, in attn_mt/config); every surface that
takes them follows it: DecodeConfig, the API's arguments, the CLI's options, serve's request fields
and the page's controls, the stream, both exports. A row that a surface takes must change what it
decodes or writes: each row has a probe here (settings that change a decode), and a row without
one, or without an entry in an export's table, fails."""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from conftest import cli

import attn_mt
from attn_mt import DECODE_OPTIONS, Model
from attn_mt.cli import app, flag
from attn_mt.config import DecodeConfig
from attn_mt.config.decode import CALLS, Decoding, OneBest, Streamed, taking
from attn_mt.decoding.translate import OPTION_RULES
from attn_mt.errors import ModelError
from attn_mt.export.transformers import GENERATION
from attn_mt.imports.ct2_translator import CT2_OPTIONS, search_options

STATIC = Path(__file__).resolve().parents[2] / "attn_mt" / "serve" / "static"


def test_every_option_is_a_decode_config_field():
    assert {o.key for o in DECODE_OPTIONS} <= {f.name for f in dataclasses.fields(DecodeConfig)}
    assert len({o.arg for o in DECODE_OPTIONS}) == len(DECODE_OPTIONS)


def test_the_apis_decode_keywords_are_the_options():
    assert Decoding.__optional_keys__ == {o.arg for o in DECODE_OPTIONS}
    assert set(CALLS) >= {call for o in DECODE_OPTIONS for call in o.calls}
    # translate: the best only; a stream: greedy, one sentence
    assert OneBest.__optional_keys__ == {o.arg for o in taking("translate")}
    assert Streamed.__optional_keys__ == {o.arg for o in taking("stream")}
    assert {o.arg for o in taking("translate_nbest")} == Decoding.__optional_keys__


@pytest.mark.parametrize("method,keywords", [(Model.options, "Decoding"),
                                             (Model.translate, "OneBest"),
                                             (Model.translate_nbest, "Decoding"),
                                             (Model.evaluate, "OneBest"),
                                             (Model.stream, "Streamed")])
def test_the_api_takes_the_options_as_keywords(method, keywords):
    # decoding steered, beyond the config
    steering = {"target_prefix", "temperature", "seed", "return_attention"}
    params = inspect.signature(method).parameters
    inputs = {"self", "texts", "text", "sources", "refs", "names"}
    assert set(params) - inputs - steering == {"options"}
    assert params["options"].kind is inspect.Parameter.VAR_KEYWORD
    assert params["options"].annotation == f"Unpack[{keywords}]"


def test_the_api_refuses_another_keyword_as_python_does():
    model = object.__new__(Model)  # the keywords are checked before the model is used
    with pytest.raises(TypeError, match=r"^Model.translate\(\) got an unexpected keyword argument "
                       r"'nbest'$"):
        model.translate("a", nbest=2)
    with pytest.raises(TypeError, match=r"^Model.translate_nbest\(\) got an unexpected keyword "
                       r"argument 'beam_size'$"):
        model.translate_nbest("a", beam_size=2)
    with pytest.raises(TypeError, match=r"^Model.stream\(\) got an unexpected keyword argument "
                       r"'beam'$"):
        model.stream("a", beam=2)


# each verb that decodes, and the API call whose decode options it takes
VERBS = {"translate": "translate_nbest", "evaluate": "translate"}


def test_the_cli_options_carry_the_flags_and_their_help():
    command = typer.main.get_command(app)
    ctx = typer.Context(command)
    for verb, call in VERBS.items():
        params = {opt: p for p in command.get_command(ctx, verb).params for opt in p.opts}
        for o in DECODE_OPTIONS:
            if call in o.calls:
                assert (flag(o.arg) in params
                        and params[flag(o.arg)].help.startswith(o.help)), (verb, o.arg)
            else:
                assert flag(o.arg) not in params, (verb, o.arg)


def test_serves_request_fields_are_the_served_options():
    pytest.importorskip("fastapi")
    from attn_mt.serve.api import TranslateRequest

    fields = set(TranslateRequest.model_fields) - {"texts", "stream", "align"}  # not how it decodes
    assert fields == {o.field for o in DECODE_OPTIONS if o.field}
    for o in DECODE_OPTIONS:
        if o.field:
            assert TranslateRequest.model_fields[o.field].description.startswith(o.help)


def test_the_pages_controls_send_served_options_by_their_names():
    script, page = (STATIC / "app.js").read_text(), (STATIC / "index.html").read_text()
    body = re.search(r"streamed\(\{texts: \[text\], ([\w, ]+)\}", script)
    assert body is not None, "app.js no longer sends {texts: [text], ...} to /api/translate"
    sent = {k.strip() for k in body.group(1).split(",")}
    assert sent <= {o.field for o in DECODE_OPTIONS if o.field}
    for arg in sent:  # each one a control of the page, read by its id
        assert f'id="{arg}"' in page and f'$("{arg}").value' in script


# Each row's probe: API settings (its own and what it needs) that change a decode of TEXTS by the
# tiny model, against the same settings without its own.
PROBES = {
    "beam_size": {"beam": 3},
    "alpha": {"alpha": 0.0},
    "nbest": {"beam": 2, "nbest": 2},
    "batch_size": {"batch_size": 1},
    "max_len_a": {"max_len_b": 2, "max_len_a": 0.0},
    "max_len_b": {"max_len_a": 0.0, "max_len_b": 2},
}
TEXTS = ["the dog sees the cat.", "a woman likes the old horses because the child finds a book."]
ROWS = pytest.mark.parametrize("o", DECODE_OPTIONS, ids=lambda o: o.key)


def base(o) -> dict:
    """The probe of row `o` without its own setting."""
    return {k: v for k, v in PROBES[o.key].items() if k != o.arg}


@pytest.mark.parametrize("table", [PROBES, CT2_OPTIONS, GENERATION],
                         ids=["probes", "ctranslate2", "transformers"])
def test_every_row_has_a_probe_and_an_entry_in_each_exports_table(table):
    """An export maps each row (a function: its options for a DecodeConfig) or refuses it (why)."""
    assert set(table) == {o.key for o in DECODE_OPTIONS}
    for o in DECODE_OPTIONS:
        entry = table[o.key]
        assert o.arg in entry if table is PROBES else callable(entry) or (isinstance(entry, str)
                                                                          and entry)
    assert set(OPTION_RULES) <= {o.key for o in DECODE_OPTIONS}  # a rule is a row's


@pytest.fixture(scope="module")
def model(ckpt) -> Model:
    return attn_mt.load(ckpt, device="cpu")


def traced(model: Model, monkeypatch, call) -> tuple:
    """What `call()` returns, and the rows of each decoder call it made (batches, beams)."""
    calls, decode = [], model.module.decode

    def counted(tgt_in, *args):
        calls.append(tgt_in.size(0))
        return decode(tgt_in, *args)

    with monkeypatch.context() as m:
        m.setattr(model.module, "decode", counted)
        out = call()
    return out, calls


@ROWS
def test_every_row_changes_a_decode(o, model, monkeypatch):
    def nbest(settings):
        return traced(model, monkeypatch, lambda: [[(t.text, t.score) for t in n] for n in
                                                   model.translate_nbest(TEXTS, **settings)])

    assert nbest(PROBES[o.key]) != nbest(base(o))


@pytest.fixture
def reached(monkeypatch) -> list[DecodeConfig]:
    """The DecodeConfig of every search that asked for its options' rules (translate.OPTION_RULES;
    the probe adds none)."""
    seen: list[DecodeConfig] = []
    monkeypatch.setitem(OPTION_RULES, "probe", lambda cfg, eos_id: seen.append(cfg))
    return seen


def reaches(o, seen: list[DecodeConfig]) -> bool:
    value = PROBES[o.key][o.arg]
    return bool(seen) and all(getattr(c, o.key) == value for c in seen)


@ROWS
def test_every_row_reaches_the_search_from_each_call_that_takes_it(o, model, ckpt, reached,
                                                                   tmp_path):
    settings = PROBES[o.key]
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    ref.write_text("\n".join(TEXTS) + "\n")
    flags = [x for arg, v in settings.items() for x in (flag(arg), str(v))]
    runs = {"translate_nbest": [lambda: model.translate_nbest(TEXTS, **settings),
                                lambda: cli("translate", "--checkpoint", ckpt, *TEXTS, *flags)],
            "translate": [lambda: model.translate(TEXTS, **settings),
                          lambda: model.evaluate(TEXTS, TEXTS, **settings),
                          lambda: cli("evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref,
                                      *flags)],
            "stream": [lambda: list(model.stream(TEXTS[1], **settings))]}
    for call in o.calls:
        for run in runs[call]:
            reached.clear()
            result = run()
            assert getattr(result, "exit_code", 0) == 0, result.output
            assert reaches(o, reached), (call, reached)


@pytest.mark.parametrize("o", [o for o in DECODE_OPTIONS if o.field], ids=lambda o: o.key)
def test_every_served_row_reaches_the_engines_decode(o, client, monkeypatch):
    """A request field the table defines is decoded with, never silently dropped."""
    engine, seen = client.app.state.engine, []
    job = engine.job
    monkeypatch.setattr(engine, "job", lambda dcfg, texts: seen.append(dcfg) or job(dcfg, texts))
    served = {r.arg: r.field for r in DECODE_OPTIONS if r.field}
    fields = {served[arg]: v for arg, v in PROBES[o.key].items() if arg in served}
    answer = client.post("/api/translate", json={"texts": TEXTS[:1], **fields})
    assert answer.status_code == 200, answer.text
    assert reaches(o, seen)


@ROWS
def test_every_row_changes_what_an_export_decodes_or_writes(o, model, tiny_ct2):
    """CTranslate2 decodes differently (its options, calls or output), or refuses the call; the
    transformers export writes a different generation config or model card."""
    pytest.importorskip("transformers")
    from attn_mt.export.model_card import usage
    from attn_mt.export.transformers import generation_config, mapped_length_penalty
    from attn_mt.imports.ct2_translator import load_exported, translate_nbest

    exported = load_exported(tiny_ct2)

    class Recorded:  # CTranslate2's translator, with the options of each call
        def __init__(self) -> None:
            self.calls: list[dict] = []

        def translate_batch(self, pieces, **options):
            self.calls.append(options)
            return exported.translator.translate_batch(pieces, **options)

    def ct2(settings):
        recorded = Recorded()
        out = translate_nbest(replace(exported, translator=recorded), TEXTS,
                              model.options(**settings))
        return [[(t.text, t.score) for t in n] for n in out], recorded.calls

    def written(settings):
        cfg = replace(model.config, decode=model.options(**settings))
        lp = mapped_length_penalty(cfg.decode.alpha, None)
        refused = {k: why for k, why in GENERATION.items() if isinstance(why, str)}
        return (generation_config(cfg, model.tokenizer, lp).to_dict(),
                usage(cfg, "x", "", lp, refused))

    if isinstance(CT2_OPTIONS[o.key], str):  # refused: a call that sets it
        with pytest.raises(ModelError, match=re.escape(CT2_OPTIONS[o.key])):
            ct2(PROBES[o.key])
    else:
        assert ct2(PROBES[o.key]) != ct2(base(o))
    assert written(PROBES[o.key]) != written(base(o))


def test_an_export_refuses_a_row_it_cannot_decode_with(monkeypatch):
    monkeypatch.setitem(CT2_OPTIONS, "alpha", "no such penalty")
    assert search_options(DecodeConfig())["beam_size"] == 1  # at its default: decoded as exported
    with pytest.raises(ModelError, match=r"no such penalty") as e:
        search_options(DecodeConfig(alpha=0.3))
    assert e.value.field == "alpha"
