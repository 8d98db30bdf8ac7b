"""Looking inside a trained Transformer: explain.py (one head's attention for one query, step by step,
recomputed from the model's own weights by recompute.py; explanation.py holds, prints and draws it) and heads.py
(each head's importance and measured role; which to prune; overview.py holds, prints and draws the report), with
masking.py (masking and pruning a head) and pruned.py (the pruned checkpoint); views.py makes offline HTML views
(notebooks, saved pages) of them and of the attention maps.

May import config, checkpoint, device, data, models and decoding; never training, measure, export or serve.
"""
