"""Publishing an export folder safely: written whole beside the target, then renamed into place.

`publish(out, write)` lets `write` fill a fresh temporary folder next to `out`, records what it
wrote in a manifest, and only then moves it to `out`. It replaces `out` only when `out` is absent,
empty, or holds exactly the files a previous export listed in its manifest: a checkpoint, notes or
anything else a user put there is never deleted, and a failed write leaves the previous export as it
was. An `out` that is the working directory (`.`) or holds it is not renamed (the shell would be
left in a deleted folder): its entries are swapped for the new ones instead.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from attn_mt.errors import InputError
from attn_mt.files import replace_entries, replace_folder

# what the export wrote, so a later one knows what it may replace
MANIFEST = "attn_mt_manifest.json"


class FolderError(InputError):
    """An export folder that cannot be written or replaced; one line names the folder and why."""


def _entries(folder: Path) -> set[str]:
    """Every file, link and directory under `folder`, as posix paths relative to it (links not
    followed)."""
    out = set()
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        out.update((rel / name).as_posix() for name in dirs + files)
    return out


def _written_files(folder: Path) -> list[str]:
    return sorted(p for p in _entries(folder) if not (folder / p).is_dir()
                  or (folder / p).is_symlink())


def _manifest_files(out: Path) -> set[str] | None:
    """The files a previous export's manifest lists, or None when `out` holds no readable
    manifest."""
    try:
        files = json.loads((out / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def _in_the_way(out: Path) -> str | None:
    """What stops `out` from being replaced (a one-line description), or None when it may be."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return "exists and is not a directory"
    if not out.exists():
        return None
    found = _entries(out)
    if not found:
        return None
    listed = _manifest_files(out)
    if listed is None:
        return f"is not empty and holds no {MANIFEST} of an earlier export ({_few(found)})"
    allowed = listed | {MANIFEST} | {p.as_posix() for f in listed for p in Path(f).parents
                                     if p != Path(".")}
    extra = found - allowed
    if extra:
        return f"holds files an earlier export did not write: {_few(extra)}"
    return None


def _few(names: set[str], n: int = 3) -> str:
    shown = sorted(names)[:n]
    return ", ".join(shown) + (f" and {len(names) - n} more" if len(names) > n else "")


def _check(out: Path, reads: Sequence[Path]) -> None:
    target = out.resolve()
    for read in reads:
        if Path(read).resolve().is_relative_to(target):
            raise FolderError(f"{out}: holds {read}, which this export reads; choose another `out`")
    why = _in_the_way(out)
    if why:
        raise FolderError(f"{out}: {why}; choose another `out` or remove them")


def check_out(out: Path, reads: Sequence[Path] = ()) -> None:
    """Refuse (FolderError) an `out` that `publish` would refuse, before the export's work: one that
    holds one of `reads` or files of anything but an earlier export."""
    _check(Path(out), [Path(r) for r in reads])


def publish(out: Path, write: Callable[[Path], None], *, reads: Sequence[Path] = ()) -> Path:
    """Write an export to `out` through a temporary folder beside it; returns `out`.

    `write(tmp)` fills the fresh folder `tmp`; its files are listed in `tmp/MANIFEST`, then `tmp`
    replaces `out`. Raises FolderError (before anything is written) when `out` holds anything but a
    previous export's files or contains one of `reads`; any exception from `write` leaves `out` as
    it was.
    """
    out = Path(out)
    _check(out, reads)
    # "." has no name and no parent of its own: temp folders go beside it
    place = Path(os.path.abspath(out))
    place.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{place.name}.", suffix=".tmp", dir=place.parent))
    try:
        write(tmp)
        files = _written_files(tmp)
        (tmp / MANIFEST).write_text(json.dumps({"format": "attn-mt-export", "files": files},
                                               indent=2) + "\n")
        _check(out, reads)  # again: `out` may have changed while `write` ran
        if place.is_dir() and Path.cwd().is_relative_to(place.resolve()):
            replace_entries(tmp, place)
        else:
            replace_folder(tmp, place)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
