"""scripts/doc_facts.py: every figure the docs quote is the one docs/facts.json records for it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import doc_facts  # noqa: E402


def test_the_docs_quote_the_recorded_figures():
    assert doc_facts.main([]) == 0, "a doc disagrees with docs/facts.json: scripts/doc_facts.py"


def test_every_fact_names_its_run_and_the_issues_contradictions_are_registered():
    facts = doc_facts.load()
    assert all(f["measured"] and f["quotes"] for f in facts.values())
    quoted = {doc for f in facts.values() for doc in f["quotes"]}
    assert {"README.md", "docs/attention.md", "docs/history.md", "docs/tutorial.ipynb",
            "docs/decoding.md", "docs/compare-rnn.md"} <= quoted
    best = [f for name, f in facts.items() if name.startswith("pronoun run of")]
    assert len(best) == 3  # attention.md's, history.md's and the tutorial's run, named apart


def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_another_figure_for_a_measurement_fails_in_any_doc(tmp_path):
    root = copy(tmp_path)
    facts = doc_facts.load(root)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("test BLEU 98.02, chrF", "test BLEU 98.12, chrF"))
    found = doc_facts.problems(facts, doc_facts.docs(root), root)
    wrong = "README.md quotes 98.12 for toy demo, test BLEU, AMD EPYC"
    assert any(line.startswith(wrong) for line in found), found
    readme.write_text(readme.read_text().replace("98.12", "98.02"))
    (root / "docs/new.md").write_text(  # a new page, another figure in the same words
        "The pronoun run of attention.md: the best, decoder 2.2, prefers the\n"
        "antecedent in 82.0% of the items.\n")
    found = doc_facts.problems(facts, doc_facts.docs(root), root)
    assert found == ["docs/new.md quotes 82.0 for pronoun run of attention.md, best head's share "
                     "('the best, decoder 2.2, prefers the antecedent in {:.1f}% of the items'); "
                     "recorded: 71.8"], found


def test_a_quote_gone_from_its_doc_or_a_changed_measurement_fails(tmp_path):
    root = copy(tmp_path)
    facts = doc_facts.load(root)
    history = root / "docs/history.md"
    text = history.read_text()
    history.write_text(text.replace("Test2016\nBLEU 39.80", "Test2016\nBLEU about 40"))
    bench = json.loads((root / "docs/bench_decode.json").read_text())
    bench["speedup_cache_beam5"] = 9.0
    (root / "docs/bench_decode.json").write_text(json.dumps(bench))
    found = doc_facts.problems(facts, doc_facts.docs(root), root)
    assert "docs/history.md no longer quotes history.md's ten-minute run, test2016 BLEU as " \
           "'Test2016 BLEU {}, chrF 58.78'" in found
    assert any(line.startswith("docs/decoding.md quotes 8.3 for decoder cache speedup, beam 5") and
               line.endswith("recorded: 9.0") for line in found), found


def test_a_quote_matches_across_line_breaks_and_takes_a_format():
    regex, spec = doc_facts.pattern("decoder 2.2 at {:.1f}% of")
    assert regex.search("... decoder\n  2.2 at 71.8% of ...")[1] == "71.8" and spec == ".1f"
    regex, spec = doc_facts.pattern("| **{}** |")
    assert regex.search("| 1,265 | **37.00** |")[1] == "37.00" and spec == ""
    with pytest.raises(doc_facts.StaleError, match="exactly one"):
        doc_facts.pattern("{} vs {}")
