"""Data: source files -> tokenizer -> tokenized cache -> batches.

Owns where parallel text comes from (local files, the Hugging Face hub, the built-in toy corpus,
`attn-mt download`), the SentencePiece tokenizer, the on-disk cache of tokenized corpora and the
token-count batches training reads. May import `attn_mt.config`; never models, training,
decoding, measure, export or serve.
"""
