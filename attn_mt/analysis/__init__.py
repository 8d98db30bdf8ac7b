"""Looking inside a trained Transformer: explain.py (one head's attention for one query, step by step,
recomputed from the model's own weights by recompute.py; explain_text.py prints it) and heads.py (each head's
importance and measured role; which to prune), with masking.py (masking and pruning a head) and pruned.py (the
pruned checkpoint); views.py draws them and the attention maps as offline HTML (notebooks, saved pages).

May import config, checkpoint, device, data, models and decoding; never training, measure, export or serve.
"""
