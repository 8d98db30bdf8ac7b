"""Looking inside a trained Transformer: explain.py (one head's attention for one query, step by
step, recomputed from the model's own weights by recompute.py; explanation.py holds, prints and
draws it) and heads.py (each head's importance and measured role; which to prune; overview.py holds,
prints and draws the report), with masking.py (masking and pruning a head) and pruned.py (the pruned
checkpoint); views.py makes offline HTML views (notebooks, saved pages) of them and of the attention
maps. tensors.py hands research code (and docs/tutorial.ipynb) one module's inputs and weights as
tensors, and masks named heads of a loaded model; modelview.py draws every head at once: `from
attn_mt.analysis import inside, model_view, without`.

May import config, checkpoint, device, data, models, decoding and rundir (history.py: a run's
attention history); never training, measure, export or serve.
"""

import importlib

__all__ = ["Inside", "ModelView", "inside", "model_view", "without"]
_HOMES = {"Inside": "tensors", "inside": "tensors", "without": "tensors", "ModelView": "modelview",
          "model_view": "modelview"}


# loaded on first use: importing a sibling (views.py) stays free of torch
def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'attn_mt.analysis' has no attribute {name!r}")
