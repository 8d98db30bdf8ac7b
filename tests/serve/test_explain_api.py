"""POST /api/explain: what `attn-mt explain --json` writes, the weights /api/attention sends, and
bad input answered in one JSON error naming the field."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import LOCAL

import attn_mt
from attn_mt.analysis.explanation import Explanation

pytest.importorskip("fastapi")  # the serve extra
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from attn_mt.serve import create_app  # noqa: E402
from attn_mt.serve.api import ExplainResponse  # noqa: E402

TEXT = "the old man sees a small dog."


def test_the_response_model_has_every_field_of_the_explanation():
    assert list(ExplainResponse.model_fields) == [f.name for f in dataclasses.fields(Explanation)]


@pytest.mark.parametrize("kind,token", [("encoder", 2), ("decoder", 1), ("cross", "</s>")])
def test_explain_answers_what_the_cli_writes(client, ckpt, kind, token):
    r = client.post("/api/explain", json={"text": TEXT, "kind": kind, "layer": 1, "head": 2,
                                          "token": token, "beam": 1})
    assert r.status_code == 200, r.text
    expected = attn_mt.load(ckpt, device="cpu").explain(TEXT, kind=kind, layer=1, head=2,
                                                        token=token, beam=1)
    assert r.json() == json.loads(expected.to_json())
    assert r.json()["max_abs_diff"] < 1e-5


def test_explain_weights_are_those_of_api_attention(client):
    maps = client.post("/api/attention", json={"text": TEXT, "beam": 3}).json()
    for kind, name in [("encoder", "encoder_self"), ("decoder", "decoder_self"),
                       ("cross", "cross")]:
        rows = maps[name][0][1]  # layer 1, head 2: [query][key]
        for query in (0, len(rows) - 1):
            e = client.post("/api/explain", json={"text": TEXT, "kind": kind, "head": 2,
                                                  # the same translation as the maps'
                                                  "token": query, "beam": 3}).json()
            assert e["translation"] == maps["translation"]
            weights = [k["weight"] for k in e["keys"]]
            assert len(weights) == len(rows[query])
            # sent rounded
            assert max(abs(a - b) for a, b in zip(weights, rows[query], strict=True)) <= 5.1e-5


BAD = [
    ({"text": ""}, 422, "text"),
    ({"text": "   "}, 422, "text"),
    ({"text": "x" * 101}, 413, "text"),
    ({"text": "a dog", "layer": 0}, 422, "layer"),
    ({"text": "a dog", "layer": 2}, 422, "layer"),
    ({"text": "a dog", "head": 3}, 422, "head"),
    ({"text": "a dog", "kind": "sideways"}, 422, "kind"),
    ({"text": "a dog", "kind": "encoder", "token": 99}, 422, "token"),
    ({"text": "a dog", "kind": "encoder", "token": "Katze"}, 422, "token"),
    ({"text": "a dog", "token": 1.5}, 422, "token"),
    # str.isdigit says yes, int() says no: was a 500
    ({"text": "a dog", "token": "\u00b2"}, 422, "token"),
    ({"text": "a dog", "token": "--1"}, 422, "token"),
    ({"text": "a dog", "token": "1" * 5000}, 422, "token"),  # int() refuses over 4300 digits
    ({"text": "a dog", "beam": 7}, 422, "beam"),
    ({"text": "a dog", "query": 1}, 422, "query"),  # unknown key
]


@pytest.mark.parametrize("body,status,field", BAD)
def test_bad_input_names_the_field(client, body, status, field):
    r = client.post("/api/explain", json=body)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and r.json()["error"].startswith(f"{field}: ")
    # and the server goes on
    assert client.post("/api/explain", json={"text": "a dog"}).status_code == 200


def test_an_export_has_nothing_to_explain(ckpt, tmp_path):
    pytest.importorskip("ctranslate2")
    from attn_mt.export.ctranslate2 import export_ct2

    export_ct2(ckpt, tmp_path / "ct2")
    with TestClient(create_app(tmp_path / "ct2", device="cpu"), base_url=LOCAL) as c:
        r = c.post("/api/explain", json={"text": "a dog"})
        assert r.status_code == 404 and "PyTorch checkpoint" in r.json()["error"]


def test_an_rnn_checkpoint_says_what_explain_supports(tiny_run, tmp_path):
    from dataclasses import replace

    from attn_mt import checkpoint
    from attn_mt.config import load_config, to_dict
    from attn_mt.models import build_model

    _, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")
    rnn = load_config(None, ["model.kind=rnn", "model.d_embed=16", "model.d_hidden=16",
                             "model.d_attn=16"]).model
    checkpoint.save({"model": build_model(rnn, **tok.sizes()).state_dict(),
                     "config": to_dict(replace(cfg, model=rnn)), "tokenizer": tok.state()},
                    tmp_path / "rnn.pt")
    with TestClient(create_app(tmp_path / "rnn.pt", device="cpu"), base_url=LOCAL) as c:
        r = c.post("/api/explain", json={"text": "a dog"})
        assert r.status_code == 422 and r.json()["field"] == "checkpoint"
        assert "explain recomputes a Transformer's attention" in r.json()["error"]
