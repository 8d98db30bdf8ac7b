from attn_mt.cli import app

app(prog_name="attn-mt")
