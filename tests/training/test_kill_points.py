"""A run killed at any write leaves its directory empty, resumable or finished, and starting or
resuming it there ends with the files of a run that was never killed (its attention history
included)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY, snapshot

from attn_mt import checkpoint, rundir
from attn_mt.analysis.history import Recorder, load_history, to_arrays
from attn_mt.config import load_config, loader
from attn_mt.files import open_new
from attn_mt.rundir import RunDir
from attn_mt.training import evaluation as evaluation_module
from attn_mt.training import finish as finish_module
from attn_mt.training.run import train

# three evaluations with two snapshots kept (one is deleted), averaging, the test texts;
# translations of at most 3 tokens: the barely trained model's run to the length limit (1.5 x source
# + 10), and decoding them took 40% of each run here (the reference, 25 killed, 25 started again or
# resumed: a whole run 0.42 s -> 0.25 s); the same writes in the same order
OVERRIDES = ("train.max_steps=6", "train.eval_every=2", "train.keep_last=2",
             "train.bleu_sentences=5", "model.dropout=0.1", "decode.max_len_a=0",
             "decode.max_len_b=3")
TIMING = ("tokens_per_s", "elapsed_s", "train_seconds", "threads")


def hook_writes(monkeypatch, run_dir: Path, killed: Path | None = None) -> list[str]:
    """Every change a run makes to `run_dir` (atomic writes, metrics lines, deletions), listed as it
    is made. With `killed`: before change number k, `run_dir` is copied to `killed/k` as SIGKILL
    would leave it there, that change cut off half way: a temporary file with part of the data,
    half a line, a file not deleted. Nothing more is written to the copy, as to the folder of a
    process that is gone at once (its `finally` and `except` never run); the run goes on in
    `run_dir`. One run gives the folder each kill leaves, not a run killed at each change."""
    done: list[str] = []

    def change(what: str, path: Path, half=None) -> None:
        if killed is not None:
            copy = shutil.copytree(run_dir, killed / str(len(done)))
            if half is not None:
                half(copy)
        done.append(f"{what} {Path(path).name}")

    def atomic(real):
        def write(path, data):
            def half(folder: Path) -> None:
                f, _ = open_new(folder, f".{Path(path).name}.", ".tmp")
                with f:
                    f.write(b"\x80\x02 half a pickle" if callable(data) else
                            (data.encode() if isinstance(data, str) else data)[: len(data) // 2])
            change("write", path, half)
            real(path, data)
        return write

    def append(self, record):
        change("append", self.metrics, lambda folder: (folder / self.metrics.name).open("a").write(
            json.dumps(record)[:20]))
        real_append(self, record)

    def unlink(self, missing_ok=False):
        # not a temporary file
        if self.parent == run_dir and not self.name.startswith(".") and self.exists():
            change("delete", self)
        real_unlink(self, missing_ok)

    real_append, real_unlink = RunDir.append_metrics, Path.unlink
    for module in (rundir, checkpoint, loader):
        monkeypatch.setattr(module, "write_atomic", atomic(module.write_atomic))
    monkeypatch.setattr(RunDir, "append_metrics", append)
    monkeypatch.setattr(Path, "unlink", unlink)
    return done


def final_files(run_dir: Path) -> dict:
    """What a finished run leaves, timings aside: comparable with ==."""
    def weights(name: str) -> dict:
        state = checkpoint.load(run_dir / name)
        return {"step": state.get("step"), **{k: v.tolist() for k, v in state["model"].items()}}

    last = checkpoint.load(run_dir / "checkpoint_last.pt")
    out = {name: weights(name) for name in ("checkpoint_best.pt", "checkpoint_avg.pt")}
    out["snapshots"] = {p.name: weights(p.name) for p in RunDir(run_dir).snapshots()}
    out["last"] = {k: v.tolist() for k, v in last["model"].items()}
    out["last moments"] = {f"{i} {k}": v.tolist() for i, s in last["optimizer"]["state"].items()
                           for k, v in s.items()}
    out["last rng"] = last["rng"]["torch"].tolist()
    out["last step"] = (last["step"], last["epoch"], last["stopped"])
    out["metrics"] = [{k: v for k, v in r.items() if k not in TIMING}
                      for r in RunDir(run_dir).read_metrics()]
    out["results"] = {k: v for k, v in json.loads((run_dir / "results.json").read_text()).items()
                      if k not in TIMING}
    out["texts"] = {name: (run_dir / name).read_text()
                    for name in ("test_hyps.txt", "test.en", "test.de")}
    out["names"] = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))
    # bit for bit, NaN too
    out["history"] = {k: v.tobytes() for k, v in to_arrays(load_history(run_dir)).items()}
    return out


@pytest.mark.slow
def test_a_run_killed_at_any_write_is_empty_resumable_or_finished_and_ends_as_if_never_killed(
        tmp_path, monkeypatch):
    # a tiny model's BLEU stays 0: a score that grows as the loss falls instead, so that
    real = evaluation_module.validate
    for module in (evaluation_module, finish_module):  # validation rounds and the average's test
        monkeypatch.setattr(module, "validate", lambda *a: (
            lambda m: {**m, "valid_bleu": 100 - 10 * m["valid_loss"]})(real(*a)))
    cfg = load_config(None, [*TINY, *OVERRIDES])  # every evaluation writes checkpoint_best.pt
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    killed.mkdir()
    with monkeypatch.context() as mp:
        # the attention recorder `attn_mt.train` passes
        changes = hook_writes(mp, ref, killed)
        train(cfg, ref, observers=(Recorder(ref),))
    expected = final_files(ref)
    assert (changes.count("write checkpoint_best.pt") == 3
            and changes.count("write checkpoint_last.pt") == 3)
    assert (changes.count("write attention_history.npz") == 4
            and load_history(ref).steps == [0, 2, 4, 6])
    # step 0's history first, then each evaluation's after metrics
    evaluation = changes.index("append metrics.jsonl")
    assert (changes.index("write attention_history.npz") < evaluation <
            changes.index("write attention_history.npz", evaluation)
            < changes.index("write checkpoint_best.pt"))
    assert [c for c in changes if c.startswith("delete")] == ["delete checkpoint_step0000002.pt"]
    first_last = changes.index("write checkpoint_last.pt")
    for k, what in enumerate(changes):
        run_dir = killed / str(k)
        state = RunDir(run_dir).state()
        want = ("empty" if k <= first_last else "finished"
                if k > changes.index("write results.json") else "resumable")
        assert state == want, (k, what)
        # an empty one is started
        train(cfg, run_dir, resume=state != "empty", observers=(Recorder(run_dir),))
        # again, the others resumed
        assert final_files(run_dir) == expected, (k, what)


def test_resuming_a_finished_run_without_its_test_texts_writes_them(tiny_run, tmp_path):
    """A run killed after results.json by an attn-mt that wrote the test texts after it: resuming
    writes them (evaluate's --src RUN/test.en), and changes nothing else."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    texts = {name: (run_dir / name).read_text() for name in ("test.en", "test.de")}
    for name in texts:
        (run_dir / name).unlink()
    before = snapshot(run_dir)
    train(load_config(None, TINY), run_dir, resume=True)
    assert {name: (run_dir / name).read_text() for name in texts} == texts
    assert {k: v for k,
            v in snapshot(run_dir).items() if k not in texts and k != "config.yaml"} == \
        {k: v for k, v in before.items() if k != "config.yaml"}
