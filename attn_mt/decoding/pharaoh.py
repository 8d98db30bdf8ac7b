"""Word alignments in Pharaoh format: `i-j` links source word i to target word j (0-indexed, words
as the whitespace-separated tokens of the text), one line per sentence pair; gold sets mark a
possible link `ipj`.

Read carefully: a gold file whose line count differs from the texts, a link out of range or an
unknown mark (`i?j`) is refused with one line naming the file and line. Common gold sets (the
German-English one of Vilar et al., the Europarl sets) count from 1: `one_indexed` reads them.

Tested in tests/decoding/test_alignment.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from attn_mt.errors import InputError

Link = tuple[int, int]  # (source word, target word), from 0
LINK = re.compile(r"(\d+)([-p])(\d+)")


@dataclass(frozen=True)
class Gold:
    """One sentence pair's gold links: `sure` ones and `possible` ones (Och and Ney 2003: every sure
    link is also possible; `possible` holds both)."""

    sure: frozenset[Link]
    possible: frozenset[Link] = field(default=frozenset())

    def __post_init__(self) -> None:
        object.__setattr__(self, "possible", self.possible | self.sure)


def format_links(links: set[Link] | frozenset[Link]) -> str:
    """Links as one Pharaoh line, sorted: "0-0 1-2 2-1"."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def parse_line(line: str, where: str, sizes: tuple[int, int] | None = None,
               one_indexed: bool = False) -> Gold:
    """One Pharaoh line (`i-j` sure, `ipj` possible); `sizes` (source words, target words) checks
    the range. InputError names `where` (file and line) and the link at fault."""
    sure, possible = set(), set()
    for token in line.split():
        found = LINK.fullmatch(token)
        if found is None:
            raise InputError(f"{where}: {token!r} is not a link: expected i-j (sure) or ipj "
                             "(possible)", "gold", named=True)
        i, j = int(found[1]) - one_indexed, int(found[3]) - one_indexed
        if i < 0 or j < 0:
            raise InputError(f"{where}: link {token} has an index 0, but the file is read counted "
                             "from 1", "gold", named=True)
        if sizes is not None and not (i < sizes[0] and j < sizes[1]):
            counted = "from 1" if one_indexed else "from 0"
            raise InputError(f"{where}: link {token} is out of range: {sizes[0]} source and "
                             f"{sizes[1]} target words (counted {counted})", "gold", named=True)
        (sure if found[2] == "-" else possible).add((i, j))
    return Gold(frozenset(sure), frozenset(possible))


def read_gold(path: Path, sources: list[str], targets: list[str], one_indexed: bool = False,
              ) -> list[Gold]:
    """A gold alignment file, line i the links of sources[i] and targets[i]; every line checked."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: gold file not found", "gold", named=True) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the gold file ({e})", "gold", named=True) from None
    if len(lines) != len(sources):
        n = min(len(lines), len(sources)) + 1
        raise InputError(f"{path} line {n}: the gold file has {len(lines)} lines, the texts "
                         f"{len(sources)}", "gold", named=True)
    return [parse_line(line, f"{path} line {n}", (len(s.split()), len(t.split())), one_indexed)
            for n, (line, s, t) in enumerate(zip(lines, sources, targets, strict=True), 1)]
