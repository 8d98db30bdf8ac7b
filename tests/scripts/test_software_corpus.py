"""scripts/software_corpus.py: message catalogues packed in a real .deb become clean, aligned
splits."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

polib = pytest.importorskip("polib")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


def load_script():
    spec = importlib.util.spec_from_file_location("software_corpus",
                                                  ROOT / "scripts" / "software_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_deb(tmp: Path, name: str, entries: list[polib.MOEntry]) -> Path:
    root = tmp / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t "
        "<t@example.org>\nDescription: test\n")
    for lang in ("fr", "de"):
        mo = polib.MOFile()
        mo.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
        for e in entries:
            mo.append(polib.MOEntry(msgid=e.msgid, msgstr=f"{lang}:{e.msgstr}" if e.msgstr else "",
                                    msgctxt=e.msgctxt, msgid_plural=e.msgid_plural,
                                    msgstr_plural=e.msgstr_plural))
        folder = root / "usr/share/locale" / lang / "LC_MESSAGES"
        folder.mkdir(parents=True)
        mo.save(str(folder / f"{name}.mo"))
    debs = tmp / "debs"
    debs.mkdir(exist_ok=True)
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root),
                    str(debs / f"{name}.deb")],
                   check=True, capture_output=True)
    return debs


def test_catalogues_become_clean_aligned_splits(tmp_path):
    script = load_script()
    kept = [polib.MOEntry(msgid=f"Save the _file number {i} now",
                          msgstr=f"Enregistrer le fichier {i}")
            for i in range(12)]
    dropped = [
        polib.MOEntry(msgid="Two words", msgstr="Deux mots"),  # too short
        polib.MOEntry(msgid="not translated at all", msgstr=""),
        polib.MOEntry(msgid="%s %d %s", msgstr="%s %d %s"),  # no words
        polib.MOEntry(msgid="one file was removed", msgid_plural="%d files were removed",
                      msgstr_plural={0: "un", 1: "plusieurs"}),
    ]
    debs = make_deb(tmp_path, "pkg-a", kept + dropped)
    # a second package repeating an English message, with context and a line break: kept once
    make_deb(tmp_path, "pkg-b", [polib.MOEntry(msgid="Save the _file number 0 now", msgstr="autre"),
                                 polib.MOEntry(msgid="Open the\nother ~window please",
                                               msgctxt="menu|open",
                                               msgstr="Ouvrir l'autre\nfenêtre")])
    out = tmp_path / "corpus"
    counts = script.build(debs, "fr", out, seed=3, held_out=2)
    assert counts == {"valid": 2, "test": 2, "train": 9}
    pairs = []
    for split in counts:
        en = (out / f"{split}.en").read_text(encoding="utf-8").splitlines()
        fr = (out / f"{split}.fr").read_text(encoding="utf-8").splitlines()
        assert len(en) == len(fr) == counts[split]
        pairs += zip(en, fr, strict=True)
    sources = [src for src, _ in pairs]
    assert len(set(sources)) == len(sources) == 13
    assert ("Open the other window please", "fr:Ouvrir l'autre fenêtre") in pairs
    assert all("_" not in s and "~" not in s for s in sources)
    assert all(t.startswith("fr:") for _, t in pairs)  # the French catalogue, not the German one
    assert "pkg-a.deb" in (out / "README.md").read_text()
    again = tmp_path / "again"
    script.build(debs, "fr", again, seed=3, held_out=2)
    assert (again / "train.en").read_bytes() == (out / "train.en").read_bytes()  # seeded
