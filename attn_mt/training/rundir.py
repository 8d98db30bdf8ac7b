"""The run directory and its files: disk checks, metrics.jsonl, results.json, the kept snapshots and
their average. Checkpoints themselves are written atomically by checkpoint.save.

    config.yaml  spm*.model  tokenizer.json    what the run was started with
    checkpoint_last.pt  checkpoint_best.pt     resume from last; translate with best
    checkpoint_step{N}.pt  checkpoint_avg.pt   the last train.keep_last evaluations, their average
    metrics.jsonl  results.json  test_hyps.txt one line per evaluation; the final scores
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from torch import nn

from attn_mt import checkpoint
from attn_mt.training.trainer import TrainError

# what a run writes once it trains: an earlier run's files that a fresh run must not overwrite
RUN_FILES = ("checkpoint_*.pt", "metrics.jsonl", "results.json", "test_hyps.txt")


class RunDir:
    """Paths and file operations of one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.last, self.best = self.path / "checkpoint_last.pt", self.path / "checkpoint_best.pt"
        self.average = self.path / "checkpoint_avg.pt"
        self.metrics, self.results = self.path / "metrics.jsonl", self.path / "results.json"

    def earlier_run(self) -> list[Path]:
        """The files of an earlier run in this directory (none for a new or only-prepared one)."""
        return sorted(f for pattern in RUN_FILES for f in self.path.glob(pattern))

    def claim(self, resume: bool, overwrite: bool) -> None:
        """Before anything is written: a fresh run into an earlier run's directory is refused,
        unless `overwrite` asks to delete that run's files (the tokenizer files stay: they are
        reused only if the data and settings match)."""
        old = self.earlier_run()
        if resume or not old:
            return
        if not overwrite:
            raise TrainError(f"{self.path}: holds an earlier run ({len(old)} files, e.g. {old[0].name}); continue it "
                             "with --resume, start afresh with --overwrite, or choose another --out")
        for f in old:
            f.unlink(missing_ok=True)

    def check_writable(self) -> None:
        """Fail before training, not after an hour, when the run directory cannot take files."""
        probe = self.path / ".write_test"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(bytes(1 << 20))  # 1 MiB: catches a full disk, too
        except OSError as e:
            raise TrainError(f"{self.path}: run directory is not writable ({e.strerror or e})") from None
        finally:
            with contextlib.suppress(OSError):
                probe.unlink(missing_ok=True)

    def check_space(self, model: nn.Module, keep_last: int) -> None:
        """Fail before training when the disk cannot hold what the run will write: checkpoint_last and
        _best plus one being written (weights and 2 AdamW moments each), the `keep_last` weight
        snapshots, their average, and one more snapshot being written."""
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        snapshots = keep_last + 1 + (1 if keep_last >= 2 else 0) if keep_last else 0
        need = 3 * 3 * weights + snapshots * weights - sum(f.stat().st_size for f in self.path.glob("checkpoint_*.pt"))
        free = shutil.disk_usage(self.path).free
        if free < need:
            raise TrainError(f"{self.path}: {free / 2**20:.1f} MiB free on disk, checkpoints need about "
                             f"{need / 2**20:.1f} MiB")

    def append_metrics(self, record: dict) -> None:
        try:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise TrainError(f"{self.metrics}: cannot write ({e.strerror or e})") from None

    def trim_metrics(self, step: int, epoch: int) -> None:
        """Drop the records written after the checkpoint a run resumes from: they will be written again."""
        if not self.metrics.exists():
            return
        keep = []
        for line in self.metrics.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                if (record["step"], record["epoch"]) <= (step, epoch):
                    keep.append(line + "\n")
            except (ValueError, KeyError, TypeError):  # e.g. a line cut short by a kill
                continue
        self.metrics.write_text("".join(keep), encoding="utf-8")

    def write_results(self, results: dict, hyps: list[str]) -> None:
        """test_hyps.txt and results.json, each written whole or not at all."""
        _write_atomic(self.path / "test_hyps.txt", "\n".join(hyps) + "\n")
        _write_atomic(self.results, json.dumps(results, indent=2) + "\n")

    def snapshots(self) -> list[Path]:
        """The kept evaluation checkpoints, oldest first."""
        return sorted(self.path.glob("checkpoint_step*.pt"))

    def keep_weights(self, state: dict, n: int) -> None:
        """Save this evaluation's weights as checkpoint_step{step}.pt; delete all but the last n."""
        keys = ("model", "config", "tokenizer", "step", "epoch")
        checkpoint.save({k: state[k] for k in keys}, self.path / f"checkpoint_step{state['step']:07d}.pt")
        for old in self.snapshots()[:-n]:
            old.unlink(missing_ok=True)

    def average_snapshots(self) -> dict:
        """Average the kept snapshots into checkpoint_avg.pt; returns the averaged checkpoint."""
        averaged = checkpoint.average(self.snapshots())
        checkpoint.save(averaged, self.average)
        return averaged


def _write_atomic(path: Path, text: str) -> None:
    tmp = None
    try:
        f, tmp = checkpoint.open_new(path.parent, f".{path.name}.", ".tmp")  # O_EXCL: no planted link followed
        with f:
            f.write(text.encode("utf-8"))
        tmp.replace(path)
    except OSError as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise TrainError(f"{path}: cannot write ({e.strerror or e})") from None
