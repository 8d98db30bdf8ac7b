"""A run's attention history drawn (analysis/history_view.py): the files the heads command writes
for a run's history, and the page the server answers at /history when the checkpoint's run recorded
one.

    >>> draw_history("runs/pronoun", html="history.html", png="history.png")

Tested in tests/analysis/test_history_view.py.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from attn_mt.data import checks
from attn_mt.errors import InputError
from attn_mt.files import check_outputs
from attn_mt.rundir import RunDir


def _name(path: Path) -> str:
    """The run's name for titles: its folder's."""
    return (path.parent if path.suffix == ".npz" else path).resolve().name


def draw_history(run_dir: str | os.PathLike, *, html: str | os.PathLike | None = None,
                 png: str | os.PathLike | None = None) -> list[Path]:
    """Draw the attention history a run recorded (RUN/attention_history.npz, or that file named):
    the page with a step slider to `html`, the summary picture to `png` (at least one); returns the
    files written. Both outputs are checked before the history is read."""
    from attn_mt.analysis.history import history_path, load_history
    from attn_mt.analysis.history_view import HistoryView

    run = checks.path(run_dir, "run_dir")
    outputs = [(name, None if p is None else checks.path(p, name)) for name,
               p in (("html", html), ("png", png))]
    if html is None and png is None:
        raise InputError("give `html` or `png`: where to draw the history", "html")
    check_outputs([("html", outputs[0][1], (".html", ".htm")), ("png", outputs[1][1], (".png",))],
                  [history_path(run)])
    view = HistoryView(load_history(run), _name(run))
    return ([view.save_html(outputs[0][1])] if html is not None else []) + \
        ([view.save_png(outputs[1][1])] if png is not None else [])


def history_file(model) -> Path | None:
    """The attention history of the run a loaded checkpoint belongs to (its folder's
    attention_history.npz), or None: an export, a checkpoint outside a run, a run that recorded
    none."""
    path = getattr(model, "path", None)
    if getattr(model, "kind", None) != "checkpoint" or path is None:
        return None
    found = RunDir(Path(path).parent).history
    return found if found.is_file() else None


def history_page(path: Path) -> str:
    """The whole page (views.document) of the history in `path` (attention_history.npz), drawn once
    per version of the file (its inode, size and times: each record replaces the file whole); a few
    pages are kept."""
    info = Path(path).stat()
    return _page(str(path), (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))


@functools.lru_cache(maxsize=4)
def _page(path: str, version: tuple[int, ...]) -> str:
    from attn_mt.analysis.history import load_history
    from attn_mt.analysis.history_view import HistoryView
    from attn_mt.analysis.views import document

    view = HistoryView(load_history(path), _name(Path(path)))
    return document(view.to_html(), f"attn-mt history: {view.name}")
