"""A head's name, spelled one way on every surface (CLI, API, pages, pictures, docs): "decoder 2.2",
its kind (encoder, decoder or cross: encoder self-, decoder self- and cross-attention), then
layer.head, both from 1.

Tested in tests/analysis/test_heads.py.
"""

from __future__ import annotations

KINDS = ("encoder", "decoder", "cross")  # encoder self-, decoder self- and cross-attention
ALIASES = {"encoder_self": "encoder", "decoder_self": "decoder"}  # the attention maps' kinds


def head_name(kind: str, layer: int, head: int) -> str:
    """'decoder 2.2' for kind 'decoder' (or the maps' 'decoder_self'), layer 2, head 2."""
    return f"{ALIASES.get(kind, kind)} {layer}.{head}"


def module_head(module: str, head: int) -> str:
    """The name of head `head` (from 1) of an attention history's module: 'decoder 1 self' ->
    'decoder 1.4', 'decoder 2 cross' -> 'cross 2.4'; the RNN's one module, 'decoder cross' ->
    'cross 1.1'."""
    side, *layer, what = module.split()
    return head_name("cross" if what == "cross" else side, int(layer[0]) if layer else 1, head)
