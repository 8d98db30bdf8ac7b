"""`python -m attn_mt`: the command line (torchrun starts it so). Tested in tests/test_cli.py and
tests/training/test_distributed.py."""

from attn_mt.cli import app

app(prog_name="attn-mt")
