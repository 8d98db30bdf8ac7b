"""scripts/pronoun_doc.py: the classic sentence's section of docs/attention.md, with heads' and
explain's own numbers, kept after the five steps when scripts/attention_doc.py rewrites the rest of
the page."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TINY

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import attention_doc  # noqa: E402
import pronoun_doc  # noqa: E402


@pytest.fixture(scope="module")
def pronoun_run(tmp_path_factory) -> Path:
    """A tiny model of the pronoun variant (seconds; it need not resolve anything)."""
    from attn_mt.config import load_config
    from attn_mt.training.run import train

    run = tmp_path_factory.mktemp("pronoun_run")
    train(load_config(None, [*TINY, "data.toy_variant=pronoun", "tokenizer.vocab_size=200",
                             "train.max_epochs=1"]),
          run)
    return run


@pytest.mark.slow
def test_the_section_is_heads_and_explains_own_numbers(pronoun_run, tiny_run, tmp_path):
    doc = tmp_path / "attention.md"
    doc.write_text("# Attention\n\nthe rest of the page\n")
    compare = {"budget_minutes": 1, "models": {name: {"steps": 10, "contrastive": {
        "accuracy": 0.5, "by_distance": {"1-5": {"accuracy": 0.75}, "6-10": {"accuracy": 0.25}}}}
        for name in ("transformer", "rnn")}}
    (tmp_path / "report.json").write_text(json.dumps(compare))
    assert pronoun_doc.main(["--run", str(pronoun_run), "--compare", str(tmp_path / "report.json"),
                             "--sentences", "20", "--out", str(doc)]) == 0
    text = doc.read_text()
    assert (text.startswith("# Attention\n\n" + pronoun_doc.BEGIN)
            and text.rstrip().endswith("the rest of the page"))
    assert str(tmp_path) not in text and str(pronoun_run) not in text  # placeholders only
    assert "The animal didn't cross the street because it was too tired" in text
    results = json.loads((pronoun_run / "results.json").read_text())
    assert f"{results['steps']} steps" in text and "contrastive accuracy" in text
    assert "| rnn | 10 | 50.0% | 75.0% | 25.0% |" in text
    section = text[text.index(pronoun_doc.BEGIN):]
    cmd = (
        section.split("(`attn-mt explain --checkpoint "
                      "RUN/checkpoint_best.pt ")[1].split(' "..."')[0].split())
    flags = dict(zip(cmd[::2], cmd[1::2], strict=True))  # --kind K --layer L --head H --token T
    import attn_mt
    from attn_mt.data.pronoun import classic

    model = attn_mt.load(pronoun_run / "checkpoint_best.pt", device="cpu")
    tired, wide = (model.explain(classic(p).en, kind=flags["--kind"], layer=int(flags["--layer"]),
                                 head=int(flags["--head"]), token=flags["--token"])
                   for p in ("tired", "wide"))
    assert pronoun_doc.moved(tired, wide, "animal", "street") in text
    assert f"*{wide.source}* as *{wide.translation}*" in text
    assert f"| `{tired.keys[0].token}` | {tired.keys[0].weight:.3f} |" in text
    # attention_doc rewrites the page around it and keeps the section first
    assert attention_doc.main(["--checkpoint", str(tiny_run / "checkpoint_best.pt"), "--src",
                               str(tiny_run / "test.en"), "--ref", str(tiny_run / "test.de"),
                               "--sentences", "4", "--prune", "0", "--out", str(doc)]) == 0
    again = doc.read_text()
    assert again.count(pronoun_doc.BEGIN) == 1 and section.split(pronoun_doc.END)[0] in again
    assert (again.index("## One head, one query") < again.index(pronoun_doc.BEGIN)
            < again.index(pronoun_doc.BEFORE))
    # and a second run replaces the section rather than adding one
    assert pronoun_doc.main(["--run", str(pronoun_run), "--sentences", "20", "--out",
                             str(doc)]) == 0
    assert doc.read_text().count(pronoun_doc.BEGIN) == 1 and "| rnn |" not in doc.read_text()
