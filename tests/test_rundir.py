"""The run directory: an earlier run is never overwritten by accident, writes are atomic, and a
full disk is found before training and reported in one line."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SHORT, cli, one_line_error, snapshot, write_config

from attn_mt import checkpoint, rundir
from attn_mt.errors import TrainError
from attn_mt.rundir import RunDir

ATTN_MT = str(Path(sys.executable).parent / "attn-mt")  # the installed command


@pytest.mark.slow
def test_fresh_run_into_an_earlier_run_is_refused_and_overwrite_clears_it(tmp_path):
    config = write_config(tmp_path / "c.yaml", "train.max_steps=4", "train.eval_every=2",
                          "train.keep_last=2", "train.bleu_sentences=5")
    run = tmp_path / "run"
    # evaluations and snapshots at steps 2 and 4
    assert cli("train", "-c", config, "--out", run).exit_code == 0
    before = snapshot(run)
    again = cli("train", "-c", config, "--out", run, "--set", "train.max_steps=2")
    one_line_error(again, 1, "holds an earlier run", "--resume", "--overwrite")
    assert snapshot(run) == before  # nothing touched
    assert (
        cli("train", "-c", config, "--out", run, "--set", "train.max_steps=2",
            "--overwrite").exit_code == 0)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    snaps = sorted(p.name for p in run.glob("checkpoint_step*.pt"))
    # none of the old run's left
    assert len(steps) == 1 and snaps == [f"checkpoint_step{steps[0]:07d}.pt"]
    assert json.loads((run / "results.json").read_text())["steps"] == steps[0]
    both = cli("train", "-c", config, "--out", run, "--resume", "--overwrite")
    assert (both.exit_code == 2 and "--overwrite" in both.output
            and "one of resume and overwrite" in both.output)


@pytest.mark.parametrize("name", ["metrics.jsonl",
                                  pytest.param("results.json", marks=pytest.mark.slow),
                                  "test_hyps.txt", "spm.model"])
def test_a_full_disk_while_writing_is_one_line(name, tmp_path, monkeypatch):
    real_open, real_write = open, Path.write_bytes

    real_os_open = os.open

    def full(path):
        # the file or its temp file
        if Path(path).name == name or Path(path).name.startswith(f".{name}."):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("builtins.open", lambda p, *a, **k: full(p) or real_open(p, *a, **k))
    monkeypatch.setattr(os, "open", lambda p, *a, **k: full(p) or real_os_open(p, *a, **k))
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: full(self)
                        or real_write(self, data))
    monkeypatch.setattr(Path, "write_text", lambda self, text, **k: full(self) or real_open(
        self, "w", **k).write(text))
    result = cli("train", "-c", write_config(tmp_path / "c.yaml", *SHORT), "--out",
                 tmp_path / "run")
    one_line_error(result, 1, name, "No space left on device")


def test_results_are_written_without_following_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    for name in ("results.json", "test_hyps.txt"):  # the temp names the writer used to take
        (tmp_path / f".{name}.tmp").symlink_to(victim)
    run = RunDir(tmp_path)
    run.write_results({"bleu": 1.0}, ["a"])
    assert victim.read_text() == "mine" and json.loads(run.results.read_text()) == {"bleu": 1.0}
    assert not run.results.is_symlink() and (tmp_path / "test_hyps.txt").read_text() == "a\n"
    umask = os.umask(0)
    os.umask(umask)
    # like any other file the run writes
    assert run.results.stat().st_mode & 0o777 == 0o666 & ~umask


def test_free_space_check_counts_kept_snapshots(tmp_path, monkeypatch):
    config = write_config(tmp_path / "c.yaml", *SHORT)
    size = 50_000 * 4  # about the tiny model's weights in bytes, well above
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: SimpleNamespace(free=12 * size))
    refused = cli("train", "-c", config, "--out", tmp_path / "a", "--set", "train.keep_last=20")
    one_line_error(refused, 1, "free on disk")
    assert (
        cli("train", "-c", config, "--out", tmp_path / "b", "--set", "train.keep_last=0").exit_code
        == 0)


def test_nearly_full_disk_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: SimpleNamespace(free=100 << 10))
    result = cli("train", "-c", write_config(tmp_path / "c.yaml"), "--out", tmp_path / "run")
    assert (result.exit_code == 1 and "run: 0.1 MiB free on disk, checkpoints need about"
            in result.stderr)
    assert (not list((tmp_path / "run").glob("*.pt"))
            and not (tmp_path / "run" / "metrics.jsonl").exists())


@pytest.mark.slow
def test_full_disk_is_detected_before_training(tmp_path):
    """A run directory that takes no more than 256 KiB a file (RLIMIT_FSIZE) fails before any
    training."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.RLIM_INFINITY))

    cfg = write_config(tmp_path / "c.yaml")
    out = subprocess.run([ATTN_MT, "--quiet", "train", "-c", str(cfg), "--out",
                          str(tmp_path / "run")],
                         capture_output=True, text=True, preexec_fn=limit)
    assert (out.returncode == 1 and out.stderr.startswith("error: ")
            and len(out.stderr.splitlines()) == 1)
    assert "run: run directory is not writable (File too large)" in out.stderr
    assert [p.name for p in (tmp_path / "run").iterdir()] == []


def test_claim_refuses_an_earlier_run_and_overwrite_removes_only_its_files(tmp_path):
    files = RunDir(tmp_path)
    files.claim(resume=False, overwrite=False)  # empty: nothing to refuse
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(TrainError, match="holds an earlier run .2 files"):
        files.claim(resume=False, overwrite=False)
    files.claim(resume=True, overwrite=False)  # resuming uses it as it is
    assert (tmp_path / "checkpoint_last.pt").exists()
    files.claim(resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # a user's own file stays


def test_metrics_are_appended_and_trimmed_to_a_resumed_step(tmp_path):
    files = RunDir(tmp_path)
    for step, epoch in [(2, 0), (4, 0), (6, 1), (8, 1)]:
        files.append_metrics({"step": step, "epoch": epoch, "valid_bleu": step / 10})
    with open(files.metrics, "a") as f:
        f.write('{"step": 10, "ep')  # a line cut short by a kill
    files.trim_metrics(step=6, epoch=1)
    assert [json.loads(x)["step"] for x in files.metrics.read_text().splitlines()] == [2, 4, 6]


def test_results_are_written_whole_and_snapshots_keep_the_last_n(tmp_path, tiny_run):
    files = RunDir(tmp_path)
    files.write_results({"test_bleu": 1.5}, ["a", "b"])
    assert json.loads(files.results.read_text()) == {"test_bleu": 1.5}
    assert ((tmp_path / "test_hyps.txt").read_text() == "a\nb\n"
            and not list(tmp_path.glob(".*.tmp")))
    state = checkpoint.load(tiny_run / "checkpoint_last.pt")
    for step in (10, 20, 30, 40):
        files.keep_weights({**state, "step": step})
    # resuming from step 30: the newer one goes, and the oldest beyond 2
    files.trim_snapshots(30, 2)
    assert [p.name for p in files.snapshots()] == ["checkpoint_step0000020.pt",
                                                   "checkpoint_step0000030.pt"]


def test_files_read_back_from_old_and_new_run_directories(tmp_path):
    """What other modules read from a run directory they read through RunDir, also from runs that
    predate a key."""
    files = RunDir(tmp_path)
    assert ((files.read_results(), files.read_hyps(), files.read_metrics(), files.entry_key())
            == ({}, None, [], None))
    # no "tested": as runs before checkpoint averaging
    files.write_results({"test_bleu": 1.0}, ["a dog", "a cat"])
    assert (files.read_results() == {"test_bleu": 1.0}
            and files.tested(files.read_results()) == files.best)
    assert (files.tested({"tested": "checkpoint_avg.pt"}) == files.average
            and files.read_hyps() == ["a dog", "a cat"])
    files.write_test_texts("test", {"de": ["ein Hund"], "en": ["a dog"]})
    assert (files.test_text("test", "en").read_text() == "a dog\n"
            and (tmp_path / "test.de").read_text() == "ein Hund\n")
    # without "entry": older runs
    files.record.write_text(json.dumps({"fingerprint": "ab" * 16, "vocab_size": 120}))
    assert files.entry_key() == "ab" * 16
    files.record.write_text('{"fingerprint": 3}')
    assert files.entry_key() is None
    files.append_metrics({"step": 1, "epoch": 0})
    with open(files.metrics, "a") as f:
        f.write('{"step": 2, "ep')  # cut short by a kill
    assert files.read_metrics() == [{"step": 1, "epoch": 0}]


def test_record_entry_copies_the_tokenizer_and_notes_the_entry(tiny_cfg, tmp_path):
    from attn_mt.data.cache import prepare

    cfg = tiny_cfg(f"data.cache_dir={tmp_path / 'cache'}")
    entry = prepare(cfg)
    files = RunDir(tmp_path / "run")
    files.path.mkdir()
    files.record_entry(entry)
    note = json.loads(files.record.read_text())
    assert note["fingerprint"] == entry.key and note["entry"] == str(entry.path)
    assert note["vocab_size"] == cfg.tokenizer.vocab_size and files.entry_key() == entry.key
    assert {n: (files.path / n).read_bytes() for n in entry.tok.files()} == entry.tok.files()
    stamp = files.record.stat().st_mtime_ns
    files.record_entry(entry)  # unchanged: not rewritten
    assert files.record.stat().st_mtime_ns == stamp and not list(files.path.glob(".*.tmp"))


def test_a_run_killed_after_the_size_ladder_is_no_earlier_run(tmp_path):
    """size.json alone (a budget run killed after its ladder, before any checkpoint) used to make
    the folder 'an earlier run' that only --overwrite could reuse; now a fresh run takes it and
    drops the stale choice."""
    files = RunDir(tmp_path)
    for name in ("size.json", "config.yaml", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    assert files.earlier_run() == []
    files.claim(resume=False, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "tokenizer.json"]
    (tmp_path / "size.json").write_text("{}")
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")  # with a checkpoint it is a run to resume
    assert [p.name for p in files.earlier_run()] == ["checkpoint_last.pt", "size.json"]
    with pytest.raises(TrainError, match="holds an earlier run .2 files"):
        files.claim(resume=False, overwrite=False)


def test_a_run_killed_before_its_first_checkpoint_is_empty_and_a_new_run_takes_it(tmp_path):
    """metrics.jsonl, checkpoint_best.pt or a snapshot without checkpoint_last.pt (a run killed
    while writing its first checkpoints) used to be refused by a fresh run and by `resume` alike:
    only `overwrite` got out."""
    files = RunDir(tmp_path)
    for name in ("metrics.jsonl", "checkpoint_best.pt", "checkpoint_step0000002.pt", "size.json",
                 "config.yaml"):
        (tmp_path / name).write_text("{}")
    assert files.state() == "empty" and files.earlier_run() == []
    with pytest.raises(TrainError, match="checkpoint_last.pt: checkpoint not found: nothing to "
                       "resume"):
        files.claim(resume=True, overwrite=False)
    files.claim(resume=False, overwrite=False)
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # what the new run writes again
    files.last.write_bytes(b"x")
    assert files.state() == "resumable"
    files.results.write_text("{}")
    assert files.state() == "finished"


def test_rewind_drops_what_was_written_after_the_checkpoint(tmp_path, tiny_run):
    """A run killed between a snapshot and checkpoint_last.pt, or between checkpoint_last.pt and
    deleting the oldest snapshot, resumes with the snapshots it had at checkpoint_last.pt's step."""
    files = RunDir(tmp_path)
    state = checkpoint.load(tiny_run / "checkpoint_last.pt")
    for step in (2, 4, 6, 8):
        files.append_metrics({"step": step, "epoch": 0})
        files.keep_weights({**state, "step": step})
    files.last.write_bytes(b"x")
    files.results.write_text("{}")  # of a smaller budget: the run goes on
    files.rewind(6, 0, keep=2, finished=False)
    assert [p.name for p in files.snapshots()] == ["checkpoint_step0000004.pt",
                                                   "checkpoint_step0000006.pt"]
    assert [r["step"] for r in files.read_metrics()] == [2, 4, 6] and files.state() == "resumable"
    files.results.write_text("{}")
    # finished: nothing goes; keep_last 0 deletes no snapshot
    files.rewind(6, 0, keep=0, finished=True)
    assert len(files.snapshots()) == 2 and files.state() == "finished"


def test_a_users_checkpoints_and_history_are_not_a_killed_run_to_clear(tmp_path):
    """A folder holding a user's checkpoint_avg.pt (from `average`), a saved checkpoint_*.pt or a
    copied attention_history.npz, without the marks a run of ours writes first (tokenizer.json,
    config.yaml): a fresh run refuses it as an earlier run's and leaves every file as it was;
    `overwrite` removes them as asked."""
    files = RunDir(tmp_path)
    names = ("checkpoint_avg.pt", "checkpoint_mine.pt", "attention_history.npz")
    for name in names:
        (tmp_path / name).write_bytes(name.encode())
    assert files.state() == "empty" and not files.marked()
    with pytest.raises(TrainError, match="holds an earlier run .3 files"):
        files.claim(resume=False, overwrite=False)
    assert {n: (tmp_path / n).read_bytes() for n in names} == {n: n.encode() for n in names}
    # the same files beside our mark: a run of ours killed before its checkpoint
    files.record.write_text("{}")
    files.claim(resume=False, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]
    (tmp_path / "checkpoint_avg.pt").write_bytes(b"x")
    files.record.unlink()
    files.claim(resume=False, overwrite=True)
    assert list(tmp_path.iterdir()) == []


def gone_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporary_files_of_killed_writes_go_when_a_run_starts_and_at_each_write(tmp_path):
    """A kill inside the history's, results', test texts' or metrics' atomic write leaves
    `.NAME.HOST.*.PID.tmp` (a full-size copy); as checkpoint.save does for its own, a run start
    (fresh, resumed, overwriting) removes every one whose writer is gone, and each write those of
    its file. A live writer's stays."""
    from attn_mt.files import HOST

    files, dead = RunDir(tmp_path), gone_pid()
    names = ("attention_history.npz", "results.json", "test_hyps.txt", "test.en", "metrics.jsonl")
    orphans = [tmp_path / f".{n}.{HOST}.0badf00d.{dead}.tmp" for n in names]
    live = tmp_path / f".results.json.{HOST}.0badf00d.{os.getpid()}.tmp"
    for p in [*orphans, live]:
        p.write_bytes(b"partial")
    files.claim(resume=False, overwrite=False)
    assert sorted(tmp_path.iterdir()) == [live]
    orphans[1].write_bytes(b"partial")
    files.write_results({"test_bleu": 1.0}, ["a"])
    assert not orphans[1].exists() and live.exists() and files.read_results() == {"test_bleu": 1.0}


def test_snapshots_sort_by_step_past_seven_digits(tmp_path):
    """From step 10,000,000 (max_steps allows 1e12) a snapshot's name has 8 digits: sorted by name
    it came before step 9,999,990's, so trimming deleted the newest and the average took the wrong
    ones."""
    files = RunDir(tmp_path)
    steps = (9_999_980, 9_999_990, 10_000_000, 10_000_010)
    for step in steps:
        (tmp_path / f"checkpoint_step{step:07d}.pt").write_bytes(b"x")
    assert [p.name for p in files.snapshots()] == [f"checkpoint_step{s:07d}.pt" for s in steps]
    # resuming from step 10,000,000: the newer one goes, and the oldest two
    files.trim_snapshots(10_000_000, 2)
    assert [p.name for p in files.snapshots()] == ["checkpoint_step9999990.pt",
                                                   "checkpoint_step10000000.pt"]
