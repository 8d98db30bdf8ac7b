"""publish(): an export folder is written beside its target and replaces only a previous export."""

import json
from pathlib import Path

import pytest

from attn_mt.export.folder import MANIFEST, FolderError, publish


def _writer(**files):
    def write(tmp):
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
    return write


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir())


def test_publish_writes_a_manifest_and_replaces_a_previous_export(tmp_path):
    out = tmp_path / "ex"
    publish(out, _writer(**{"a.bin": "1", "sub/b.txt": "2"}))
    assert json.loads((out / MANIFEST).read_text())["files"] == ["a.bin", "sub/b.txt"]
    publish(out, _writer(**{"c.bin": "3"}))
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "c.bin"]
    assert _siblings(out) == ["ex"]  # no temporary folder left beside it


def test_publish_into_an_empty_or_absent_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    publish(tmp_path / "empty", _writer(x="1"))
    publish(tmp_path / "new" / "deeper", _writer(x="1"))
    assert ((tmp_path / "empty" / "x").read_text()
            == (tmp_path / "new" / "deeper" / "x").read_text() == "1")


def test_publish_never_deletes_user_files(tmp_path):
    out = tmp_path / "ex"
    publish(out, _writer(**{"model.bin": "old"}))
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FolderError, match=r"ex: holds files an earlier export did not write: "
                       r"notes\.txt"):
        publish(out, _writer(**{"model.bin": "new"}))
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.bin").read_text() == "old"
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.txt").write_text("mine")
    with pytest.raises(FolderError, match="no attn_mt_manifest.json") as e:
        publish(other, _writer(x="1"))
    assert "\n" not in str(e.value) and (other / "data.txt").read_text() == "mine"
    file = tmp_path / "file"
    file.write_text("mine")
    with pytest.raises(FolderError, match="not a directory"):
        publish(file, _writer(x="1"))
    assert _siblings(out) == ["ex", "file", "other"]


def test_publish_refuses_an_out_that_holds_what_it_reads(tmp_path):
    out = tmp_path / "ex"
    publish(out, _writer(**{"model.bin": "old"}))
    ckpt = out / "model.bin"  # even a file the previous export listed
    with pytest.raises(FolderError, match="which this export reads"):
        publish(out, _writer(x="1"), reads=[ckpt])
    with pytest.raises(FolderError, match="which this export reads"):
        publish(tmp_path, _writer(x="1"), reads=[ckpt])
    assert ckpt.read_text() == "old"


def test_a_failed_write_leaves_the_previous_export(tmp_path):
    out = tmp_path / "ex"
    publish(out, _writer(**{"model.bin": "old"}))

    def fails(tmp):
        (tmp / "model.bin").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish(out, fails)
    assert (out / "model.bin").read_text() == "old" and _siblings(out) == ["ex"]


def test_publish_into_the_working_directory(tmp_path, monkeypatch):
    here = tmp_path / "ex"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    publish(Path("."), _writer(**{"a.bin": "1", "sub/b.txt": "2"}))  # `attn-mt export --out .`
    publish(Path("."), _writer(**{"c.bin": "3"}))  # replaces the earlier export
    assert sorted(p.name for p in Path(".").iterdir()) == [MANIFEST, "c.bin"]
    # the shell's folder still exists
    assert here.stat().st_ino == inode and Path.cwd().samefile(here)
    assert _siblings(here) == ["ex"]  # no temporary folder left beside it
    (here / "notes.txt").write_text("mine")
    with pytest.raises(FolderError, match="notes.txt"):
        publish(Path("."), _writer(x="1"))
    monkeypatch.chdir(here / "..")
    # not the working directory: renamed into place as always
    publish(Path("ex/sub"), _writer(y="1"))
    assert (here / "sub" / "y").exists()
