"""Data: source files -> tokenizer -> tokenized cache -> batches, each stage taking only what the
one before gives.

sources.py reads parallel text (local files, JSONL, the Hugging Face hub, the built-in toy corpus of
toy.py; `attn-mt download` is download.py) and says what identifies it; tokenizer.py trains and
holds the SentencePiece models; cache.py keeps the training split tokenized on disk, one entry per
data and tokenizer settings (built by build.py under lock.py's lock; tidy.py lists and cleans it);
corpus.py maps it and holds validation and test; batching.py plans and collates the batches training
reads. checks.py holds the argument checks the public API and the analysis functions share.
May import `attn_mt.config`; never models, training, decoding, measure, export or serve.
"""
