"""attn-mt: a small, readable Transformer translation trainer, measured against an RNN baseline."""

__version__ = "0.1.0"
