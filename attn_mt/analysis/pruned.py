"""A pruned model's checkpoint: the dict to save, and a checkpoint's `pruned_heads` read back as
Heads.

The checkpoint keeps its shapes, since the exporters need every layer to have as many heads: pruning
removes the heads' effect, not their size or their cost. It lists them under `pruned_heads` (those
pruned before first) and the file they were pruned from under `pruned_from`.

Tested in tests/analysis/test_heads.py.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from attn_mt import checkpoint as ckpt
from attn_mt.models.transformer import Transformer

from .masking import Head
from .names import KINDS


def pruned_state(model: Transformer, state: dict, gone: list[Head], source: str) -> dict:
    """The checkpoint dict of `model`, pruned from the one `state` describes (its config, tokenizer
    and step kept; `pruned_heads` lists those pruned before and `gone`)."""
    kept = {k: state[k] for k in ("config", "tokenizer", "step", "epoch", "best_bleu")
            if k in state}
    before = pruned_heads(state.get("pruned_heads") or [], model, source)
    return {**kept, "model": {k: v.cpu() for k, v in model.state_dict().items()},
            "pruned_heads": [asdict(h) for h in [*before, *gone]], "pruned_from": source}


def pruned_heads(listed: object, model: Transformer, path: Path | str) -> list[Head]:
    """A checkpoint's `pruned_heads` as Heads; CheckpointError names the file and the entry that is
    not a head of this model ({"kind": one of KINDS, "layer": 1..layers, "head": 1..heads})."""
    cfg, out = model.cfg, []
    for i, h in enumerate(listed if isinstance(listed, list) else [listed]):
        ok = (isinstance(h, dict) and set(h) == {"kind", "layer", "head"} and h["kind"] in KINDS
              and all(type(h[k]) is int for k in ("layer", "head"))
              and 1 <= h["layer"] <= cfg.n_layers and 1 <= h["head"] <= cfg.n_heads)
        if not ok:
            raise ckpt.CheckpointError(f"{path}: pruned_heads[{i}] is not a head of this model "
                                       f"({str(h)[:60]}); a list of {{kind, layer "
                                       f"(1-{cfg.n_layers}), head (1-{cfg.n_heads})}}")
        out.append(Head(**h))
    return out
