"""The run directory: every file a run writes or reads back goes through `RunDir`, which alone knows
their names; disk checks before training. Checkpoints themselves are written atomically by
checkpoint.save.

    config.yaml  spm*.model  tokenizer.json    what the run was started with (tokenizer.json: which
                                               data cache entry, `record_entry`; read back on
                                               resume)
    checkpoint_last.pt  checkpoint_best.pt     resume from last; translate with best
    checkpoint_step{N}.pt  checkpoint_avg.pt   the last train.keep_last evaluations, their average
    metrics.jsonl  results.json  test_hyps.txt one line per evaluation; the final scores
    size.json                                  model.size: auto: what was measured and chosen
                                               (autosize.py)
    {test split}.{lang}                        the test sources and references, line-aligned with
                                               test_hyps.txt
    {test split}.contrastive.jsonl             the test split's contrastive set, where the data has
                                               one
    {split}.align                              the test and training splits' gold word alignments
                                               (Pharaoh), where the data knows them
    attention_history.npz                      the attention on a few fixed sentences at step 0 and
                                               each evaluation (train.record_attention;
                                               analysis/history.py)
    tensorboard/                               TensorBoard events (train.tensorboard)

A run directory is always in one of three states (`RunDir.state`), whenever the run is killed:
    empty      no checkpoint_last.pt and no results.json: a run starts here; what else a run killed
               before its first checkpoint_last.pt left (metrics.jsonl, checkpoint_best.pt, a
               snapshot, size.json, attention_history.npz) is removed then, where that run's marks
               show it was one (tokenizer.json, written before any of them, or config.yaml): a
               folder of a user's checkpoint_avg.pt or copied attention_history.npz without them
               holds another's files, refused as an earlier run
    resumable  checkpoint_last.pt and no results.json: `resume` goes on from it; what was written
               after it (metrics records, snapshots, results.json of a smaller budget) is dropped
               and written again (`rewind`)
    finished   results.json, written last of all (after the test texts and checkpoint_avg.pt):
               `resume` does nothing
A fresh run first writes attention_history.npz's step-0 record. Each evaluation writes
metrics.jsonl's record, attention_history.npz (whole, records after the checkpoint a run resumes
from dropped by its recorder), checkpoint_best.pt, the new snapshot, checkpoint_last.pt, and only
then deletes the snapshots beyond train.keep_last.

One job: the files of a run directory (their names, and the states their order of writing keeps).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from torch import nn

from attn_mt import checkpoint
from attn_mt.config import ExperimentConfig, save_config
from attn_mt.data.cache import Entry
from attn_mt.errors import TrainError
from attn_mt.files import OutputError, remove_orphans, write_atomic

# what a run writes once it trains: an earlier run's files that a fresh run must not overwrite
RUN_FILES = ("checkpoint_*.pt", "metrics.jsonl", "results.json", "test_hyps.txt", "size.json",
             "attention_history.npz")


class RunDir:
    """Paths and file operations of one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.last, self.best = self.path / "checkpoint_last.pt", self.path / "checkpoint_best.pt"
        # the kept snapshots averaged (training/averaging.py)
        self.average = self.path / "checkpoint_avg.pt"
        self.metrics, self.results = self.path / "metrics.jsonl", self.path / "results.json"
        self.config, self.hyps = self.path / "config.yaml", self.path / "test_hyps.txt"
        # the data cache entry the run used, and its tokenizer settings
        self.record = self.path / "tokenizer.json"
        self.tensorboard = self.path / "tensorboard"
        self.size = self.path / "size.json"
        # analysis/history.py reads and writes its contents
        self.history = self.path / "attention_history.npz"

    def state(self) -> str:
        """'finished', 'resumable' or 'empty' (the module's docstring says what each means)."""
        return ("finished" if self.results.is_file() else "resumable" if self.last.is_file()
                else "empty")

    def earlier_run(self) -> list[Path]:
        """The files of an earlier run in this directory; none when it is empty (a new or
        only-prepared one, or one of ours killed before its first checkpoint_last.pt: nothing to
        resume or lose). Run files without our marks (`marked`) are someone's: they count as an
        earlier run's."""
        found = sorted(f for pattern in RUN_FILES for f in self.path.glob(pattern))
        return found if self.state() != "empty" or not self.marked() else []

    def marked(self) -> bool:
        """Whether a run of ours started here: it writes tokenizer.json, then config.yaml, before
        any run file."""
        return self.record.exists() or self.config.exists()

    def claim(self, resume: bool, overwrite: bool) -> None:
        """Before anything is written: a fresh run into an earlier run's directory is refused,
        unless `overwrite` asks to delete that run's files (the tokenizer files stay: they are
        reused only if the data and settings match); `resume` of an empty one is refused. The
        temporary files of writes killed in this folder go."""
        remove_orphans(self.path, every=True)
        old = self.earlier_run()
        if resume and self.state() == "empty":
            raise TrainError(f"{self.last}: checkpoint not found: nothing to resume (no run here, "
                             "or one stopped before its first checkpoint); start it without "
                             "`resume`")
        if not resume and not old:  # not where the folder cannot be: check_writable says
            for f in (f for pattern in RUN_FILES for f in self.path.glob(pattern)):
                # what a run killed before its first checkpoint_last.pt left
                f.unlink(missing_ok=True)
        if resume or not old:
            return
        if not overwrite:
            raise TrainError(f"{self.path}: holds an earlier run ({len(old)} files, e.g. "
                             f"{old[0].name}); continue it with `resume`, start afresh with "
                             "`overwrite`, or choose another `out`")
        for f in old:
            f.unlink(missing_ok=True)

    def check_writable(self) -> None:
        """Fail before training, not after an hour, when the run directory cannot take files."""
        probe = self.path / ".write_test"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(bytes(1 << 20))  # 1 MiB: catches a full disk, too
        except OSError as e:
            raise TrainError(f"{self.path}: run directory is not writable "
                             f"({e.strerror or e})") from None
        finally:
            with contextlib.suppress(OSError):
                probe.unlink(missing_ok=True)

    def check_space(self, model: nn.Module, keep_last: int, averaged: bool = False) -> None:
        """Fail before training when the disk cannot hold what the run will write: checkpoint_last
        and _best plus one being written (weights and 2 AdamW moments each, and the trained weights
        beside their moving average when `averaged`), the `keep_last` weight snapshots, their
        average, and one more snapshot being written."""
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        snapshots = keep_last + 1 + (1 if keep_last >= 2 else 0) if keep_last else 0
        held = sum(f.stat().st_size for f in self.path.glob("checkpoint_*.pt"))
        need = 3 * (4 if averaged else 3) * weights + snapshots * weights - held
        free = shutil.disk_usage(self.path).free
        if free < need:
            raise TrainError(f"{self.path}: {free / 2**20:.1f} MiB free on disk, checkpoints need "
                             f"about {need / 2**20:.1f} MiB")

    def holds_run(self) -> bool:
        """Whether `train` wrote here: its marks, or any run file but the attention history
        (compare-rnn writes one, and only that, into a folder of each model)."""
        others = (p for p in RUN_FILES if p != self.history.name)
        return self.marked() or any(f for p in others for f in self.path.glob(p))

    def refuse_own(self, path: Path, option: str) -> None:
        """Refuse (OutputError naming `option`) a command's output named as a checkpoint of the run
        in this directory (one that holds any of a run's files): the run resumes from
        checkpoint_last.pt, keeps and averages checkpoint_step*.pt, names checkpoint_best.pt or
        _avg.pt as tested in results.json, and counts every checkpoint_*.pt as its own (removed by
        `overwrite`). Any other name is the command's own."""
        # lower: a case-blind disk too
        named = fnmatch.fnmatch(Path(path).name.lower(), "checkpoint_*.pt")
        held = (self.config.exists() or self.record.exists()
                or any(f for p in RUN_FILES for f in self.path.glob(p)))
        if named and held:
            raise OutputError(f"{option} {path}: a checkpoint name of the run in {self.path}, "
                              "which train writes and reads back; give it another name (e.g. "
                              "avg.pt)", option)

    def append_metrics(self, record: dict) -> None:
        try:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise TrainError(f"{self.metrics}: cannot write ({e.strerror or e})") from None

    def read_metrics(self) -> list[dict]:
        """The records of metrics.jsonl, oldest first (a line cut short by a kill is skipped)."""
        records = []
        for line in (self.metrics.read_text(encoding="utf-8").splitlines() if self.metrics.is_file()
                     else []):
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records

    def rewind(self, step: int, epoch: int, keep: int, finished: bool) -> None:
        """Before a run goes on from checkpoint_last.pt of (`step`, `epoch`) (a fresh one: (0, 0)):
        what was written after it goes, as it will be written again: metrics records, newer
        snapshots and those beyond `keep`, and results.json where the run is not `finished` (a
        finished run resumed with a larger budget)."""
        self.trim_metrics(step, epoch)
        self.trim_snapshots(step, keep)
        if not finished:
            self.results.unlink(missing_ok=True)

    def trim_metrics(self, step: int, epoch: int) -> None:
        """Drop the records written after the checkpoint a run resumes from: they will be written
        again."""
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
        _write_atomic(self.metrics, "".join(keep))

    def write_config(self, cfg: ExperimentConfig) -> None:
        """config.yaml: the resolved config, every key."""
        save_config(cfg, self.config)

    def record_entry(self, entry: Entry) -> None:
        """Note which data cache entry the run uses (tokenizer.json: its key and path, the tokenizer
        settings) and leave a copy of its SentencePiece model(s); only the key is read back
        (`entry_key`)."""
        note = json.dumps({"fingerprint": entry.key, "entry": str(entry.path),
                           **entry.tokenizer_settings()},
                          indent=2).encode()
        for dst, data in [*((self.path / name, data) for name, data in entry.tok.files().items()),
                          (self.record, note)]:
            if not dst.exists() or dst.read_bytes() != data:
                _write_atomic(dst, data)

    def entry_key(self) -> str | None:
        """The key of the data cache entry the run was trained on, from tokenizer.json (also as runs
        written before the tokenizer lived in the cache kept it); None where it is missing or
        unreadable."""
        try:
            key = json.loads(self.record.read_text())["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return key if isinstance(key, str) else None

    def write_size(self, size: dict) -> None:
        """size.json: an automatic size's measurements and choice, read back into results.json
        (`read_size`)."""
        _write_atomic(self.size, json.dumps(size, indent=2) + "\n")

    def read_size(self) -> dict | None:
        """The automatic size's record, or None (a fixed size, or a damaged file)."""
        try:
            return json.loads(self.size.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def write_results(self, results: dict, hyps: list[str]) -> None:
        """test_hyps.txt and results.json, each written whole or not at all."""
        _write_atomic(self.hyps, "\n".join(hyps) + "\n")
        _write_atomic(self.results, json.dumps(results, indent=2) + "\n")

    def write_history(self, write: Callable[[BinaryIO], None]) -> None:
        """attention_history.npz, whole or not at all: `write` writes the file's bytes
        (analysis/history.py)."""
        self.path.mkdir(parents=True, exist_ok=True)  # compare-rnn's folder of one model
        _write_atomic(self.history, write)

    def read_results(self) -> dict:
        """results.json of a finished run; {} when there is none (a run that has not finished)."""
        return (json.loads(self.results.read_text(encoding="utf-8")) if self.results.is_file()
                else {})

    def tested(self, results: dict) -> Path:
        """The checkpoint a finished run tested (results.json `tested`; the best one in runs that
        predate it)."""
        return self.path / results.get("tested", self.best.name)

    def read_hyps(self) -> list[str] | None:
        """The test translations (test_hyps.txt), or None if the run has none."""
        return self.hyps.read_text(encoding="utf-8").splitlines() if self.hyps.is_file() else None

    def test_text(self, split: str, lang: str) -> Path:
        """Where the test split's sentences of one language lie (RUN/test.en: evaluate's `src`)."""
        return self.path / f"{split}.{lang}"

    def write_test_texts(self, split: str, texts: dict[str, list[str]]) -> None:
        """The test split's sources and references, language -> lines, line-aligned with
        test_hyps.txt."""
        for lang, lines in texts.items():
            _write_atomic(self.test_text(split, lang), "".join(f"{line}\n" for line in lines))

    def contrastive(self, split: str) -> Path:
        """Where the test split's contrastive set lies (score's `contrastive` file)."""
        return self.path / f"{split}.contrastive.jsonl"

    def write_contrastive(self, split: str, records: list[dict]) -> None:
        """The contrastive set (data.pronoun.contrastive_records), one JSON object a line."""
        _write_atomic(self.contrastive(split), "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                       for r in records))

    def gold_links(self, split: str) -> Path:
        """Where a split's gold word alignment lies (align's `gold` file for the test split,
        train.guided_alignment's for the training split)."""
        return self.path / f"{split}.align"

    def write_gold_links(self, split: str, lines: list[str]) -> None:
        """A split's gold word alignment (data.toy's), one Pharaoh line per pair."""
        _write_atomic(self.gold_links(split), "".join(f"{line}\n" for line in lines))

    def snapshots(self) -> list[Path]:
        """The kept evaluation checkpoints, oldest first: by the step in the name (a name of 8
        digits or more sorts before a smaller step's of 7); a name without a step first."""
        def step(path: Path) -> tuple[int, str]:
            number = path.stem.removeprefix("checkpoint_step")
            return (int(number) if number.isdigit() else -1), path.name
        return sorted(self.path.glob("checkpoint_step*.pt"), key=step)

    def keep_weights(self, state: dict) -> None:
        """Save this evaluation's weights as checkpoint_step{step}.pt (before checkpoint_last.pt:
        `trim_snapshots` after it)."""
        keys = ("model", "config", "tokenizer", "step", "epoch")
        checkpoint.save({k: state[k] for k in keys},
                        self.path / f"checkpoint_step{state['step']:07d}.pt")

    def trim_snapshots(self, step: int, n: int) -> None:
        """Delete the snapshots of steps after `step` and, of the others, all but the last `n` (0:
        keep them)."""
        kept = []
        for path in self.snapshots():
            number = path.stem.removeprefix("checkpoint_step")
            if number.isdigit() and int(number) > step:
                path.unlink(missing_ok=True)
            else:
                kept.append(path)
        for old in kept[:-n] if n else []:
            old.unlink(missing_ok=True)


def _write_atomic(path: Path, text: str | bytes | Callable[[BinaryIO], None]) -> None:
    try:
        # as checkpoint.save: the temporary files of writers killed while writing it
        remove_orphans(path)
        write_atomic(path, text)  # O_EXCL temp file: no planted link followed
    except OSError as e:
        raise TrainError(f"{path}: cannot write ({e.strerror or e})") from None
