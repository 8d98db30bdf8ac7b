"""attn_mt/files.py: the atomic writer never follows a planted link, and output paths are checked
before any work (the suffix, the folder, not an input, not another output); the download writes
through it."""

from __future__ import annotations

import gzip
import os

import pytest

from attn_mt import files
from attn_mt.data import download
from attn_mt.files import OutputError, check_outputs, replace_folder, write_atomic


def test_write_atomic_replaces_a_planted_link_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out.json").symlink_to(victim)
    write_atomic(tmp_path / "out.json", "new")
    assert victim.read_text() == "keep" and not (tmp_path / "out.json").is_symlink()
    assert ((tmp_path / "out.json").read_text() == "new"
            and sorted(os.listdir(tmp_path)) == ["out.json", "victim"])


def test_write_atomic_leaves_the_old_file_when_the_writer_fails(tmp_path):
    (tmp_path / "a.png").write_bytes(b"old")

    def broken(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(tmp_path / "a.png", broken)
    assert os.listdir(tmp_path) == ["a.png"] and (tmp_path / "a.png").read_bytes() == b"old"


def _folder(path, text):
    path.mkdir()
    (path / "a.txt").write_text(text)
    return path


def test_replace_folder_puts_a_finished_folder_in_place_of_the_old_one(tmp_path):
    out = _folder(tmp_path / "out", "old")
    replace_folder(_folder(tmp_path / ".out.tmp", "new"), out)
    assert ((out / "a.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir())
            == ["out"])


def test_replace_folder_puts_the_old_folder_back_when_the_rename_fails(tmp_path, monkeypatch):
    out, tmp = _folder(tmp_path / "out", "old"), _folder(tmp_path / ".out.tmp", "new")
    rename = os.rename

    def fail_on_the_new_one(a, b):
        if str(a) == str(tmp):
            raise OSError(28, "No space left on device")
        rename(a, b)

    monkeypatch.setattr(files.os, "rename", fail_on_the_new_one)
    with pytest.raises(OSError, match="No space"):
        replace_folder(tmp, out)
    assert (out / "a.txt").read_text() == "old"
    # the caller removes its temp folder
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.tmp", "out"]


@pytest.mark.parametrize("outputs,says", [
    ([("--json", "in.pt", (".json",))], "--json {t}/in.pt: the file name must end in .json"),
    ([("--json", "in.json", (".json",))], "the same file as the input {t}/in.json"),
    ([("--json", "link.json", (".json",))], "the same file as the input {t}/in.json"),
    # a hard link
    ([("--json", "hard.json", (".json",))], "the same file as the input {t}/in.json"),
    # a folder output
    ([("--out", "in.pt", None)], "--out {t}/in.pt: {t}/in.pt is a file, not a folder"),
    ([("--out", "in.pt/figs/a", None)], "--out {t}/in.pt/figs/a: {t}/in.pt is a file, not a "
     "folder"),
    ([("--out", "model", None)], "--out {t}/model: the same file as the input {t}/model"),
    ([("--out", "p.pt", (".pt",)), ("--json", "P.PT", (".json",))], "must end in .json"),
    ([("--png", "g.pt", (".png",))], "--png {t}/g.pt: the file name must end in .png"),
    ([("--out", "p.pt", (".pt",)), ("--json", "p.pt", (".json", ".pt"))], "the same file as --out"),
    ([("--out", "missing/p.pt", (".pt",))], "--out {t}/missing/p.pt: folder {t}/missing does not "
     "exist"),
    ([("--json", "dir.json", (".json",))], "a folder; give a file name"),
    ([("--json", "model/attn_mt.json", (".json",))], "would overwrite the model folder {t}/model"),
    ([("--json", "model/new.json", (".json",))], "would overwrite the model folder {t}/model"),
])
def test_check_outputs_refuses_in_one_line_naming_the_option(tmp_path, outputs, says):
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "in.pt").write_bytes(b"x")
    (tmp_path / "link.json").symlink_to(tmp_path / "in.json")
    (tmp_path / "hard.json").hardlink_to(tmp_path / "in.json")
    (tmp_path / "dir.json").mkdir()
    # a model folder (an export, a MarianMT model): every file in it is an input
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "attn_mt.json").write_text("{}")
    with pytest.raises(OutputError) as e:
        check_outputs([(o, tmp_path / p, s) for o, p, s in outputs],
                      [tmp_path / "in.pt", tmp_path / "in.json", tmp_path / "model"])
    assert says.format(t=tmp_path) in str(e.value) and e.value.option == outputs[-1][0]
    assert len(str(e.value).splitlines()) == 1


def test_check_outputs_accepts_new_and_existing_report_files(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    check_outputs([("--json", tmp_path / "old.json", (".json",)),
                   ("--png", tmp_path / "new.PNG", (".png",)), ("--out", None, (".pt",)),
                   ("--figs", tmp_path / "new" / "figs", None), ("--dir", tmp_path, None)],
                  [tmp_path / "in.pt"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_check_outputs_refuses_a_folder_it_cannot_write(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(OutputError, match="ro is not writable"):
        check_outputs([("--json", tmp_path / "ro" / "r.json", (".json",))])
    with pytest.raises(OutputError, match="ro is not writable"):
        # a folder made with its parents
        check_outputs([("--out", tmp_path / "ro" / "new" / "figs", None)])


def test_download_never_follows_a_planted_part_link(tmp_path, monkeypatch):
    """The files come from file:// URLs here; a `.part` link planted where the old download wrote
    its temporary file is left alone, its target untouched, and train.de is a file of its own."""
    served = tmp_path / "served"
    served.mkdir()
    for name in download.URL_SPLITS:
        for lang in ("de", "en"):
            (served / f"{name}.{lang}.gz").write_bytes(gzip.compress(f"{name} {lang}\n".encode()))
    monkeypatch.setattr(download, "URL", served.as_uri() + "/{name}.{lang}.gz")
    out, victim = tmp_path / "m30k", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / "train.de.part").symlink_to(victim)
    written = download.download("multi30k", out)
    assert victim.read_text() == "precious\n"
    assert not (out / "train.de").is_symlink() and (out / "train.de").read_text() == "train de\n"
    assert len(written) == 12 and (out / "test2016.en").read_text() == "test_2016_flickr en\n"
