"""scripts/results_table.py: README's results table is what docs/ gives, and goes stale loudly."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import results_table  # noqa: E402


def test_readme_table_is_current():
    assert results_table.main(["--check"]) == 0, "run: python scripts/results_table.py"


def test_readme_shows_a_short_summary_of_the_full_table():
    """README's table has at most 6 rows, each also in docs/results.md's table, which has every row
    with its machine, commit and command."""
    table = json.loads((ROOT / "docs/readme_results.json").read_text())
    short = results_table.render(table, ROOT, summary=True).splitlines()[4:-2]
    full = results_table.render(table, ROOT, where="docs/results.md").splitlines()[4:-2]
    assert 1 <= len(short) <= 6 and len(full) == len(table["rows"]) > len(short)
    for line in short:
        measurement = line.split(" | ")[0]
        assert any(row.startswith(measurement + " | ") for row in full), measurement
    assert all(f"commit {row['at']}" in "\n".join(full) for row in table["rows"])
    with pytest.raises(results_table.StaleError, match="1 to 6"):
        results_table.render({**table, "rows": [{**r, "summary": True} for r in table["rows"]]},
                             ROOT, summary=True)


def test_every_row_names_machine_commit_and_command():
    table = json.loads((ROOT / "docs/readme_results.json").read_text())
    for row in table["rows"]:
        assert (row["machine"] and len(row["at"]) >= 7
                and row["command"].split()[0] in ("attn-mt", "python"))
        assert all(c in table["changes"] for c in row.get("predates", []))


def copy_docs(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_a_changed_measurement_changes_the_table(tmp_path):
    root = copy_docs(tmp_path)
    table = json.loads((root / "docs/readme_results.json").read_text())
    before = results_table.render(table, root)
    bench = json.loads((root / "docs/bench_multi30k.json").read_text())
    bench["ratio"]["fp32"] = 1.5
    (root / "docs/bench_multi30k.json").write_text(json.dumps(bench))
    after = results_table.render(table, root)
    assert "1.50x in fp32" in after and "1.50x in fp32" not in before


def test_a_row_reads_its_registered_fact(tmp_path):
    """A row's `fact` is docs/facts.json's figure: changed there, it changes in the table."""
    root = copy_docs(tmp_path)
    table = json.loads((root / "docs/readme_results.json").read_text())
    facts = json.loads((root / "docs/facts.json").read_text())
    assert "test2016 BLEU **37.00**" in results_table.render(table, root)
    facts["facts"]["ten minutes on one fp32 thread, test2016 BLEU"]["value"] = "37.50"
    (root / "docs/facts.json").write_text(json.dumps(facts))
    assert "test2016 BLEU **37.50**" in results_table.render(table, root)


def test_a_quote_missing_from_its_doc_is_an_error(tmp_path):
    root = copy_docs(tmp_path)
    results = root / "docs/results.md"
    results.write_text(results.read_text().replace("41.62", "41.7"))
    with pytest.raises(results_table.StaleError, match="41.62"):
        results_table.render(json.loads((root / "docs/readme_results.json").read_text()), root)


def test_replace_table_keeps_the_rest():
    readme = f"intro\n{results_table.BEGIN}\nold\n{results_table.END}\noutro\n"
    assert results_table.replace_table(readme, "NEW") == "intro\nNEW\noutro\n"
    with pytest.raises(results_table.StaleError):
        results_table.replace_table("no markers", "NEW")
