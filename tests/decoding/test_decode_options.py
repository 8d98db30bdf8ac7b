"""Decode options are defined once (attn_mt.DECODE_OPTIONS, in attn_mt/config); every surface that
takes them follows it: DecodeConfig, the API's arguments, the CLI's options, serve's request fields
and the page's controls."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import typer

from attn_mt import DECODE_OPTIONS, Model
from attn_mt.cli import app, flag
from attn_mt.config import DecodeConfig
from attn_mt.config.decode import Decoding, OneBest

STATIC = Path(__file__).resolve().parents[2] / "attn_mt" / "serve" / "static"


def test_every_option_is_a_decode_config_field():
    assert {o.key for o in DECODE_OPTIONS} <= {f.name for f in dataclasses.fields(DecodeConfig)}
    assert len({o.arg for o in DECODE_OPTIONS}) == len(DECODE_OPTIONS)


def test_the_apis_decode_keywords_are_the_options():
    assert Decoding.__optional_keys__ == {o.arg for o in DECODE_OPTIONS}
    # translate: the best only
    assert OneBest.__optional_keys__ == {o.arg for o in DECODE_OPTIONS} - {"nbest"}


@pytest.mark.parametrize("method,keywords", [(Model.options, "Decoding"),
                                             (Model.translate, "OneBest"),
                                             (Model.translate_nbest, "Decoding")])
def test_the_api_takes_the_options_as_keywords(method, keywords):
    # decoding steered, beyond the config
    steering = {"target_prefix", "temperature", "seed", "return_attention"}
    params = inspect.signature(method).parameters
    assert set(params) - {"self", "texts", "names"} - steering == {"options"}
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


def test_the_cli_options_carry_the_flags_and_their_help():
    command = typer.main.get_command(app)
    ctx = typer.Context(command)
    for verb, wanted in (("translate", {"beam_size", "alpha", "nbest", "batch_size"}),
                         ("evaluate", {"beam_size", "alpha", "batch_size"})):
        params = {opt: p for p in command.get_command(ctx, verb).params for opt in p.opts}
        for o in DECODE_OPTIONS:
            if o.key in wanted:
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
