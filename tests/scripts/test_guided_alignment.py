"""scripts/guided_alignment.py: unguided and guided runs at equal steps, BLEU, speed and AER."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import write_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import guided_alignment  # noqa: E402

SETS = ("train.bleu_sentences=5", "train.record_attention=false")


@pytest.mark.slow
def test_given_links_guide_the_head_and_the_report_says_so(tiny_run, tmp_path):
    config = write_config(tmp_path / "tiny.yaml", *SETS)
    out, report = tmp_path / "out", tmp_path / "guided.json"
    assert guided_alignment.main(["--config", str(config), "--steps", "60", "--out", str(out),
                                  "--json", str(report), "--links", str(tiny_run / "train.align"),
                                  "--test-links", str(tiny_run / "test.align"),
                                  "--speed-steps", "3"]) == 0
    found = json.loads(report.read_text())
    assert found["steps"] == 60 and found["guided_head"] == "head1.1"
    for name in ("unguided", "guided"):
        results = json.loads((out / name / "results.json").read_text())
        assert results["steps"] == 60 and found[name]["test_bleu"] == results["test_bleu"]
        assert found[name]["default"]["method"] == "layer1"
        assert found[name]["best"]["aer"] <= found[name]["head"]["aer"]
    assert found["guided"]["head"]["aer"] < found["unguided"]["head"]["aer"] - 5, found
    assert found["tokens_per_s"]["guided"] > 0 and found["speed_ratio"] == pytest.approx(
        found["tokens_per_s"]["guided"] / found["tokens_per_s"]["unguided"], abs=1e-3)


@pytest.mark.slow
def test_eflomal_makes_the_links_when_none_are_given(tmp_path):
    if shutil.which("eflomal-align") is None and not (
            Path(sys.executable).parent / "eflomal-align").exists():
        pytest.skip("eflomal is not installed (the align extra)")
    config = write_config(tmp_path / "tiny.yaml", *SETS)
    out, report = tmp_path / "out", tmp_path / "guided.json"
    assert guided_alignment.main(["--config", str(config), "--steps", "4", "--out", str(out),
                                  "--json", str(report), "--speed-steps", "1"]) == 0
    found = json.loads(report.read_text())
    assert found["reference"].startswith("eflomal")
    train_links = (out / "eflomal" / "train.pharaoh").read_text().splitlines()
    test_links = (out / "eflomal" / "test.pharaoh").read_text().splitlines()
    assert len(train_links) == 300 and len(test_links) == 100 and any(train_links)


def test_links_without_test_links_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        guided_alignment.main(["--config", "x.yaml", "--steps", "1", "--out", str(tmp_path),
                               "--json", str(tmp_path / "x.json"), "--links", "a.align"])
    assert "give both --links and --test-links" in capsys.readouterr().err
