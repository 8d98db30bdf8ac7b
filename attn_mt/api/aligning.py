"""Word alignment from a loaded model: `Model.align` (words and links), `Model.align_report` (AER
against a gold file, one method or every layer, head and method). decoding/alignment.py does the
work (and gives the links that `attn-mt translate --align` and the server add to translations).

Tested in tests/decoding/test_alignment.py and tests/api/test_aligning.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from attn_mt.data import checks
from attn_mt.decoding.alignment import (
    Alignment,
    Attended,
    align_texts,
    all_methods,
    attend,
    cross_shape,
    default_method,
    parse_method,
)
from attn_mt.errors import InputError

from .analyses import Lines, Loaded, pairs, transformer

if TYPE_CHECKING:
    from attn_mt.analysis.aer import AlignmentReport


def attention_of(model: Loaded, sources: list[str], targets: list[str], batch_size: int,
                 ) -> list[Attended]:
    """The pairs' cross-attention, teacher-forced, read as translation reads the module."""
    net = transformer(model, "align", any_kind=True)
    with model.shared.reading():
        t = model.translator
        return attend(net, t.tok, sources, targets, t.device, batch_size)


def aligned(model: Loaded, sources: list[str], targets: list[str], method: str | None = None,
            reverse: Loaded | None = None, batch_size: int = 64) -> list[Alignment]:
    """Each pair's words and links by `method` (reverse: a target -> source model for the
    combinations)."""
    net = transformer(model, "align", any_kind=True)
    back = None if reverse is None else (transformer(reverse, "align", any_kind=True),
                                         reverse.translator.tok)
    t = model.translator
    with model.shared.reading():
        return align_texts(net, t.tok, sources, targets, method, t.device, batch_size, back)


def report(model: Loaded, sources: Lines, targets: Lines, gold: str | os.PathLike, *,
           method: str | None = None, by_head: bool = False, reverse: Loaded | None = None,
           one_indexed: bool = False, batch_size: int = 64) -> AlignmentReport:
    """AER, precision and recall against `gold` (a Pharaoh file, line-aligned with the pairs): of
    `method`, or with `by_head` of every layer, head and method (and their combinations, given
    `reverse`)."""
    from attn_mt.analysis.aer import report as scored
    from attn_mt.decoding.pharaoh import read_gold

    srcs, tgts = pairs(sources, targets)
    checks.boolean(by_head, "by_head")
    checks.boolean(one_indexed, "one_indexed")
    checks.integer(batch_size, "batch_size")
    golden = read_gold(Path(checks.path(gold)), srcs, tgts, one_indexed)
    layers, heads = cross_shape(transformer(model, "align", any_kind=True))
    back_shape = None if reverse is None else cross_shape(transformer(reverse, "align", True))
    if by_head:
        if back_shape not in (None, (layers, heads)):
            raise InputError("`by_head` pairs each layer and head with the reverse model's: give a "
                             "reverse model of the same layers and heads, or name one `method`",
                             "reverse")
        methods = all_methods(layers, heads, combined=reverse is not None)
    else:
        name = default_method(layers) if method is None else method
        methods = [parse_method(name, layers, heads)]
        if back_shape is not None and methods[0].combine:
            parse_method(methods[0].base.name, *back_shape)
    found = attention_of(model, srcs, tgts, batch_size)
    combined = reverse is not None and any(m.combine for m in methods)
    back = attention_of(reverse, tgts, srcs, batch_size) if combined else None
    return scored(found, golden, methods, back)




def align_command(model, src: Path, tgt: Path, gold: Path | None, *, method: str | None,
                  by_head: bool, reverse: str | os.PathLike | None, one_indexed: bool,
                  batch_size: int) -> str:
    """`attn-mt align`'s output: a Pharaoh line per pair, or with `gold` the AER table."""
    if gold is None:
        if by_head or one_indexed:
            flag = "by_head" if by_head else "one_indexed"
            raise InputError(f"`{flag}` scores against a gold file: give `gold`", "gold")
        return "\n".join(a.pharaoh for a in model.align(src, tgt, method=method, reverse=reverse,
                                                        batch_size=batch_size))
    return model.align_report(src, tgt, gold, method=method, by_head=by_head, reverse=reverse,
                              one_indexed=one_indexed, batch_size=batch_size).table()
