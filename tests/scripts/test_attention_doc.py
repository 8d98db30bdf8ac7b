"""scripts/attention_doc.py: docs/attention.md's numbers are explain's and heads' own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import attention_doc  # noqa: E402


@pytest.mark.slow
def test_the_doc_walks_through_explain_and_heads(tiny_run, tmp_path):
    src, ref = tiny_run / "test.en", tiny_run / "test.de"
    doc, png, data = tmp_path / "attention.md", tmp_path / "heads.png", tmp_path / "attention.json"
    assert attention_doc.main(["--checkpoint", str(tiny_run / "checkpoint_best.pt"), "--src",
                               str(src), "--ref", str(ref), "--sentences", "8", "--prune", "2",
                               "--out", str(doc), "--png", str(png), "--json", str(data)]) == 0
    text, found = doc.read_text(), json.loads(data.read_text())
    heads, (cross, decoder) = found["heads"], found["explain"]
    assert str(tmp_path) not in text and str(tiny_run) not in text  # placeholders only
    assert png.read_bytes()[:4] == b"\x89PNG" and "(heads.png)" in text
    best = max((r for r in heads["heads"] if r["kind"] == "cross"),
               key=lambda r: r["roles"]["mono"])
    assert (cross["kind"], cross["layer"], cross["head"]) == ("cross", best["layer"], best["head"])
    assert (f"d_model = {cross['d_model']} split into {cross['n_heads']} heads of d_k = "
            f"{cross['d_k']}" in text)
    assert f"by at most {cross['max_abs_diff']:.1e}" in text and cross["max_abs_diff"] < 1e-4
    assert (text.index("softmax(q K^T / sqrt(d_k)) V") < text.index("## One head")
            < text.index("## What each head"))
    # named by what it predicts
    i, token, read = cross["query_index"], cross["query_token"], cross["query_input"]
    assert (f"query {i}, the position that predicts {token!r} (its input there is the token "
            f"before, {read!r}: a head that looks at it looks at the *same* position)") in text
    # explain's own title
    assert f"query {i} predicts {token!r} (it reads {read!r})" in " ".join(text.split())
    top = max((k for k in cross["keys"] if not k["masked"]), key=lambda k: k["weight"])
    assert f"{top['token']!r} gets {top['weight']:.3f}" in text
    assert any(k["masked"] for k in decoder["keys"])  # the decoder's future, shown masked
    for row in heads["heads"]:
        assert f"{row['kind']} {row['layer']}.{row['head']}" in text
    k = attention_doc.can_go(attention_doc.HeadsReport(**heads))
    assert f"{k} of {len(heads['heads'])} heads can go for less than 0.5 BLEU" in text
