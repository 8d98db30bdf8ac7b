"""The data cache: reuse, invalidation, damage, the tokenizer an entry keeps, what a run records of
it, and `attn-mt prepare --list / --clean`."""

import json
import logging
import shutil
from pathlib import Path

import pytest
from conftest import TINY, cfg_for, cli, one_line_error, toy_files, write_config
from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.data import build as builder
from attn_mt.data import cache
from attn_mt.data.batching import token_batches
from attn_mt.data.cache import Resumed, fingerprint, open_entry, prepare
from attn_mt.data.corpus import load_corpus
from attn_mt.data.lines import DataError
from attn_mt.rundir import RunDir


@pytest.fixture
def files(tmp_path) -> Path:
    return toy_files(tmp_path / "data")


def entries(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "cache").iterdir() if p.is_dir())


@pytest.fixture
def builds(monkeypatch) -> list:
    """Counts cache builds."""
    real, calls = cache.build, []

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "build", counting)
    return calls


def test_reused_then_rebuilt_when_data_or_tokenizer_change(files, tmp_path, builds):
    cfg = cfg_for(files, tmp_path)
    for i in ("", "2"):
        (tmp_path / f"run{i}").mkdir()
    first = load_corpus(cfg, 256)
    RunDir(tmp_path / "run").record_entry(first.entry)
    RunDir(tmp_path / "run2").record_entry(load_corpus(cfg, 256).entry)
    assert len(builds) == 1 and len(entries(tmp_path)) == 1  # reused by a second run
    assert ((tmp_path / "run2" / "spm.model").read_bytes()
            == (tmp_path / "run" / "spm.model").read_bytes())
    load_corpus(cfg_for(files, tmp_path, "tokenizer.vocab_size=110"), 256)
    assert len(builds) == 2 and len(entries(tmp_path)) == 2  # tokenizer setting changed
    with (files / "train.de").open("a") as f:
        f.write("ein neuer Satz\n")
    with (files / "train.en").open("a") as f:
        f.write("a new sentence\n")
    again = load_corpus(cfg, 256)
    assert len(builds) == 3 and len(entries(tmp_path)) == 3  # data changed
    assert len(again.lengths("train")[0]) == len(first.lengths("train")[0]) + 1


def test_tokenizer_reused_when_unchanged_retrained_when_changed(files, tmp_path):
    def model(*extra):
        return (open_entry(cfg_for(files, tmp_path, "tokenizer.type=unigram", *extra)).path
                / "spm.model")

    stamp = model().stat().st_mtime_ns
    assert model().stat().st_mtime_ns == stamp  # reused
    changed = model("tokenizer.vocab_size=160")
    assert changed.stat().st_mtime_ns != stamp  # settings changed: retrained
    stamp = changed.stat().st_mtime_ns
    (files / "train.en").write_text("".join((files / "train.en").read_text().splitlines(True)[:-1]))
    (files / "train.de").write_text("".join((files / "train.de").read_text().splitlines(True)[:-1]))
    assert model("tokenizer.vocab_size=160").stat().st_mtime_ns != stamp  # data changed: retrained


def test_the_key_is_the_data_not_where_it_lies(files, tmp_path):
    before = fingerprint(cfg_for(files, tmp_path))
    moved = shutil.copytree(files, tmp_path / "elsewhere")
    assert fingerprint(cfg_for(moved, tmp_path)) == before
    (moved / "train.de").write_text((moved / "train.de").read_text().replace("Hund", "Hunt", 1))
    assert fingerprint(cfg_for(moved, tmp_path)) != before
    # the key of a fixed corpus and settings as it has always been computed: cache entries, and the
    # tokenizer a resumed run finds there, survive an upgrade (change it only with the entry
    # layout's VERSION)
    (moved / "train.en").write_text("a dog\n")
    (moved / "train.de").write_text("ein Hund\n")
    assert fingerprint(cfg_for(moved, tmp_path)) == "b824877c55e7aaf4db43f39fb5cffc8f"


@pytest.mark.parametrize("damage", ["truncate", "flip", "marker", "file entry"])
def test_damaged_entry_is_rebuilt(files, tmp_path, builds, damage, caplog):
    cfg = cfg_for(files, tmp_path)
    before = load_corpus(cfg, 256)
    index = token_batches(*before.lengths("train"), 300, 1, 0)
    # before the damage: in place, it is seen
    expected = [b.src.tolist() for b in before.batches("train", index)]
    entry = entries(tmp_path)[0]
    ids = entry / "src.ids"
    if damage == "truncate":
        ids.write_bytes(ids.read_bytes()[:-2])
    elif damage == "flip":
        raw = bytearray(ids.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        ids.write_bytes(bytes(raw))
    elif damage == "marker":
        (entry / "complete.json").unlink()  # as a build killed before its marker leaves it
    else:
        marker = json.loads((entry / "complete.json").read_text())
        del marker["files"]["src.offsets"]  # was a KeyError when the entry was read
        (entry / "complete.json").write_text(json.dumps(marker))
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        after = load_corpus(cfg, 256)
    assert len(builds) == 2 and entries(tmp_path) == [entry]
    assert [b.src.tolist() for b in after.batches("train", index)] == expected
    assert sum("rebuilding" in r.message for r in caplog.records) == 1  # said once


def test_prepare_then_train_reuses_the_cache(files, tmp_path, builds, monkeypatch):
    cfg_args = [a for item in [*TINY, "data.source=files", f"data.dir={files}",
                               f"data.cache_dir={tmp_path / 'c'}", "train.max_steps=2"]
                for a in ("--set", item)]
    (tmp_path / "tiny.yaml").write_text("name: tiny\n")
    cfg_args = ["--config", str(tmp_path / "tiny.yaml"), *cfg_args]
    result = CliRunner().invoke(app, ["prepare", *cfg_args])
    assert result.exit_code == 0, result.output
    assert "300 training pairs" in result.output and len(builds) == 1
    monkeypatch.setattr(builder, "write_pairs",
                        lambda *a: pytest.fail("the training split was read again"))
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), *cfg_args])
    assert result.exit_code == 0, result.output
    assert len(builds) == 1 and (tmp_path / "run" / "spm.model").exists()
    # which entry the run used
    record = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    assert (tmp_path / "c" / record["fingerprint"]).is_dir() and record["vocab_size"] == 120


def test_a_resumed_run_rebuilds_a_deleted_entry_with_its_own_tokenizer(
        files, tmp_path, monkeypatch):
    cfg = cfg_for(files, tmp_path)
    (tmp_path / "run").mkdir()
    first = load_corpus(cfg, 256)
    RunDir(tmp_path / "run").record_entry(first.entry)
    note = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    assert note["fingerprint"] == first.entry.key and note["entry"] == str(first.entry.path)
    del note["entry"]  # as run directories written before the tokenizer lived in the cache have it
    (tmp_path / "run" / "tokenizer.json").write_text(json.dumps(note))
    state = first.tok.state()
    shutil.rmtree(first.entry.path)
    monkeypatch.setattr(builder, "train_tokenizer",
                        lambda *a: pytest.fail("trained a new tokenizer"))
    again = load_corpus(cfg, 256, Resumed.of(RunDir(tmp_path / "run").entry_key(), state))
    assert again.tok.state() == state and again.entry.path == first.entry.path
    monkeypatch.undo()
    # a run directory of another entry (its data changed since) lends nothing: that entry gets its
    # own
    (tmp_path / "run" / "tokenizer.json").write_text(
        json.dumps({"fingerprint": "0" * 32, "vocab_size": 120}))
    shutil.rmtree(first.entry.path)
    trained, real = [], builder.train_tokenizer
    monkeypatch.setattr(builder, "train_tokenizer", lambda *a: trained.append(1) or real(*a))
    load_corpus(cfg, 256, Resumed.of(RunDir(tmp_path / "run").entry_key(), state))
    assert trained == [1]
    assert Resumed.of(RunDir(tmp_path / "nothing").entry_key(), state) is None


def test_bad_input_and_unwritable_cache_are_one_line_errors(files, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(builder, "write_pairs", lambda *a: pytest.fail("work started"))
    with pytest.raises(DataError, match=r"data.cache_dir .*file/sub: cannot write the data cache"):
        load_corpus(cfg_for(files, tmp_path, f"data.cache_dir={tmp_path / 'file' / 'sub'}"), 256)
    monkeypatch.undo()
    (files / "train.de").write_bytes((files / "train.de").read_bytes() + b"gut\n")
    with pytest.raises(DataError, match=r"line counts differ: .*train\.en has 300 lines, "
                       r".*train\.de has 301"):
        prepare(cfg_for(files, tmp_path))
    (files / "train.de").write_bytes((files / "train.de").read_bytes()[:-4] + b"\xff\n")
    with pytest.raises(DataError, match=r"train\.de:301: invalid UTF-8"):
        prepare(cfg_for(files, tmp_path))
    (files / "test.de").unlink()
    with pytest.raises(DataError, match=r"test\.de: data file not found"):
        prepare(cfg_for(files, tmp_path))
    assert not list((tmp_path / "cache").glob("*.tmp-*"))  # failed builds leave nothing behind


def test_prepare_lists_and_cleans_the_cache(files, tmp_path):
    config = write_config(tmp_path / "c.yaml", "data.source=files", f"data.dir={files}",
                          "data.src_lang=en", "data.tgt_lang=de",
                          f"data.cache_dir={tmp_path / 'cache'}")
    assert cli("prepare", "-c", config).exit_code == 0
    good = entries(tmp_path)[0]
    # complete.json names another key
    damaged = shutil.copytree(good, tmp_path / "cache" / ("f" * 32))
    # a build that was killed
    left = shutil.copytree(good, tmp_path / "cache" / f"{'e' * 32}.tmp-999999")
    # its lock: held by no process now
    (tmp_path / "cache" / f"{'e' * 32}.lock").write_text("999999\n")
    (tmp_path / "cache" / "notes.txt").write_text("not the cache's")
    listed = cli("prepare", "-c", config, "--list")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0] == f"data cache {tmp_path / 'cache'}" and len(lines) == 5
    assert (f"{good.name}  300 pairs" in listed.stdout and f"{damaged.name}  damaged: complete.json"
            in listed.stdout)
    assert f"{left.name}  left by a build that was stopped" in listed.stdout
    assert f"{'e' * 32}.lock  held by no process" in listed.stdout
    cleaned = cli("prepare", "-c", config, "--clean")
    assert cleaned.exit_code == 0, cleaned.output
    assert len(cleaned.stdout.splitlines()) == 4 and all(line.startswith(("data cache", "removed"))
                                                          for line in cleaned.stdout.splitlines())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [good.name, "notes.txt"]
    assert cli("prepare", "-c", config, "--clean").stdout.endswith(": nothing to remove\n")


def test_clean_keeps_an_entry_of_another_layout_version(files, tmp_path):
    config = write_config(tmp_path / "c.yaml", "data.source=files", f"data.dir={files}",
                          "data.src_lang=en", "data.tgt_lang=de",
                          f"data.cache_dir={tmp_path / 'cache'}")
    assert cli("prepare", "-c", config).exit_code == 0
    # as a newer attn-mt writes it
    newer = shutil.copytree(entries(tmp_path)[0], tmp_path / "cache" / ("a" * 32))
    marker = json.loads((newer / "complete.json").read_text())
    (newer / "complete.json").write_text(json.dumps({**marker, "version": 2, "key": newer.name,
                                                     "new": {}}))
    assert (f"{newer.name}  an entry of layout version 2"
            in cli("prepare", "-c", config, "--list").stdout)
    cleaned = cli("prepare", "-c", config, "--clean").stdout
    assert f"kept {newer.name}: an entry of layout version 2" in cleaned and newer.is_dir()


def test_prepare_leaves_a_build_in_progress_alone(files, tmp_path):
    import subprocess
    import sys

    config = write_config(tmp_path / "c.yaml", f"data.cache_dir={tmp_path / 'cache'}")
    (tmp_path / "cache").mkdir()
    key = "d" * 32
    (tmp_path / "cache" / f"{key}.tmp-1").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path; from attn_mt.data.lock import exclusive\n"
        f"with exclusive(Path({str(tmp_path / 'cache' / (key + '.lock'))!r}), 'x'):\n"
        "    print('held', flush=True); sys.stdin.readline()")],  # held until the test ends
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        listed = cli("prepare", "-c", config, "--list").stdout
        assert f"{key}.tmp-1  being built by process {holder.pid}" in listed
        assert f"{key}.lock  held by process {holder.pid}" in listed
        cleaned = cli("prepare", "-c", config, "--clean").stdout
        assert f"kept {key}: process {holder.pid} is building it" in cleaned
        assert (tmp_path / "cache" / f"{key}.tmp-1").is_dir()
    finally:
        holder.kill()
        holder.wait()
    one_line_error(cli("prepare", "-c", tmp_path / "missing.yaml", "--list"), 2, "missing.yaml")
