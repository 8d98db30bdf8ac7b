"""The cache survey and its cleaning (`attn-mt prepare`): what the data cache holds, and removing
what no run can use.

The cache directory holds entries (`<key>/`), builds in progress or left by a build that was stopped
(`<key>.tmp-<pid>/`) and the lock of a key being built (`<key>.lock`). Cleaning takes each key's
lock, so it never touches a build in progress, and removes damaged entries, what stopped builds left
and lock files no process holds; complete entries stay (delete one by hand when no run needs it any
more), and so do entries of another layout version (another attn-mt's, which this one cannot check).

Tested in tests/data/test_cache.py (listing and cleaning the cache).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from attn_mt.data.cache import MARKER, VERSION, Damaged, Entry
from attn_mt.data.lock import exclusive, holder

# what the cache writes (a key is 32 hex digits)
NAME = re.compile(r"^([0-9a-f]{32})(\.tmp-\d+|\.lock)?$")


def survey(root: Path) -> list[str]:
    """One line per entry, leftover and lock in the cache directory `root`."""
    lines = []
    for key, names in _by_key(root).items():
        pid = holder(root / f"{key}.lock")
        for name in names:
            if name == key:
                lines.append(f"{name}  {_describe(root / name)}")
            elif name.endswith(".lock"):
                lines.append(f"{name}  " + (f"held by process {pid}" if pid is not None
                                            else "held by no process"))
            else:
                lines.append(f"{name}  " + (f"being built by process {pid}" if pid is not None
                                            else "left by a build that was stopped"))
    return [f"data cache {root}" + ("" if lines else ": empty"), *lines]


def clean(root: Path) -> list[str]:
    """Remove damaged entries, what stopped builds left and lock files no process holds; one line
    each (and one per key kept because a process is building it)."""
    lines = []
    for key, names in _by_key(root).items():
        with exclusive(root / f"{key}.lock", key, wait=False) as mine:
            if not mine:
                lines.append(f"kept {key}: process {holder(root / f'{key}.lock') or '?'} is "
                             "building it")
                continue
            for name in names:
                path = root / name
                if name == key and (version := _other_layout(path)) is not None:
                    lines.append(f"kept {key}: an entry of layout version {version}, another "
                                 "attn-mt's")
                    continue
                if name == key:
                    try:
                        Entry.open(path)
                        continue
                    except Damaged as e:
                        why = f"damaged: {e}"
                elif name.endswith(".lock"):
                    why = "held by no process"  # removed as `exclusive` lets go
                else:
                    why = "left by a build that was stopped"
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif not name.endswith(".lock"):
                    path.unlink()
                lines.append(f"removed {name} ({why})")
    return [f"data cache {root}" + ("" if lines else ": nothing to remove"), *lines]


def _by_key(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if m := NAME.match(path.name):
            found.setdefault(m.group(1), []).append(path.name)
    return found


def _other_layout(path: Path) -> int | None:
    """The layout version of an entry written by another attn-mt (not VERSION), or None."""
    try:
        version = json.loads((path / MARKER).read_bytes())["version"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return version if type(version) is int and 0 < version != VERSION else None


def _describe(path: Path) -> str:
    if (version := _other_layout(path)) is not None:
        return (f"an entry of layout version {version} (another attn-mt's; this one reads version "
                f"{VERSION})")
    try:
        entry = Entry.open(path)
    except Damaged as e:
        return f"damaged: {e}"
    size = sum(f["bytes"] for f in entry.marker["files"].values())
    cfg = entry.marker.get("config", {})
    data, tok = cfg.get("data", {}), cfg.get("tokenizer", {})
    where = (data.get("dir") or data.get("name") or f"size {data.get('toy_size')}, seed "
             f"{data.get('toy_seed')}")
    return (f"{entry.pairs} pairs, {size / 2**20:.1f} MiB; {data.get('source')} {where} "
            f"{data.get('src_lang')}-{data.get('tgt_lang')}; {tok.get('type')} vocab "
            f"{tok.get('vocab_size')}")

