"""Looking inside a trained Transformer: explain.py (one head's attention for one query, step by step,
recomputed from the model's own weights) and heads.py (each head's importance and measured role; pruning);
views.py draws them and the attention maps as offline HTML (notebooks, saved pages).

May import config, checkpoint, device, data, models and decoding; never training, measure, export or serve.
"""
