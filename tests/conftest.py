"""Shared fixtures: tiny configs on the built-in toy corpus, and one tiny trained run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attn_mt.config import load_config

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny test models are many small ops: one thread is as fast on a quiet machine and ~10x faster
# than two when the 2 cores are shared (measured 2.7 s vs 36 s for the decoding tests' model).
torch.set_num_threads(1)

MULTI30K = Path(os.environ.get("MULTI30K_DIR", Path(__file__).resolve().parents[2] / "shared/data/multi30k"))

TINY = [
    "data.source=toy", "data.src_lang=en", "data.tgt_lang=de", "data.toy_size=300",
    "tokenizer.vocab_size=120", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
    "model.d_ff=64", "model.dropout=0.0", "train.lr=3e-3", "train.warmup_steps=10",
    "train.batch_tokens=600", "train.max_epochs=2", "train.bleu_sentences=20", "train.device=cpu",
    "train.precision=fp32", "train.log_every=5",
]
SHORT = ("train.max_epochs=1", "train.bleu_sentences=5")  # one epoch and a quick BLEU


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """Tests keep the data cache (attn_mt/data/cache.py) in a temporary directory, not ~/.cache/attn_mt."""
    before = os.environ.get("ATTN_MT_CACHE")
    os.environ["ATTN_MT_CACHE"] = str(tmp_path_factory.mktemp("data_cache"))
    yield
    if before is None:
        os.environ.pop("ATTN_MT_CACHE")
    else:
        os.environ["ATTN_MT_CACHE"] = before


@pytest.fixture
def tiny_cfg():
    """Build a tiny config, with extra `section.key=value` overrides."""

    def make(*overrides: str):
        return load_config(None, [*TINY, *overrides])

    return make


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """Run directory of a tiny model trained for two epochs on 300 toy pairs (a few seconds)."""
    from attn_mt.training.run import train

    run_dir = tmp_path_factory.mktemp("tiny_run")
    train(load_config(None, TINY), run_dir)
    return run_dir


@pytest.fixture
def multi30k() -> Path:
    """The shared Multi30k directory; the test is skipped where it is absent (a user's clone)."""
    if not (MULTI30K / "train.de").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set MULTI30K_DIR)")
    return MULTI30K


def cli(*args, input: str | bytes | None = None):
    """Run the CLI in this process with --quiet (no 2-second start): click's Result, stderr only the error line."""
    import logging

    from typer.testing import CliRunner

    from attn_mt.cli import app

    handlers = logging.getLogger().handlers[:]
    try:
        return CliRunner().invoke(app, ["--quiet", *map(str, args)], input=input)
    finally:
        logging.getLogger().handlers[:] = handlers  # the CLI pointed logging at the runner's stream


def write_config(path: Path, *overrides: str) -> Path:
    """The tiny config as a YAML file, with extra `section.key=value` overrides."""
    import yaml

    raw: dict = {}
    for item in [*TINY, *overrides]:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(raw))
    return path


def one_line_error(result, status: int, *texts: str) -> None:
    """The CLI ended by its error handler with `status` and one stderr line holding every text."""
    assert result.exit_code == status, result.output
    assert isinstance(result.exception, SystemExit)  # not an escaped exception
    assert len(result.stderr.splitlines()) == 1, result.stderr
    for text in texts:
        assert text in result.stderr, result.stderr


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """The bytes of every file in a run directory, to show that nothing was touched."""
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


class Evil:
    """Unpickling this creates a file: what a crafted checkpoint would do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def random_checkpoint(tiny_cfg, tiny_run: Path, path: Path, *overrides: str):
    """(model, tokenizer) of an untrained 2-layer model with noisy weights (every LayerNorm and bias
    matters), saved as a checkpoint at `path`: what the exporters' equality tests compare against."""
    from attn_mt import checkpoint
    from attn_mt.config import to_dict
    from attn_mt.data.tokenizer import Tokenizer
    from attn_mt.models import build_model

    cfg = tiny_cfg("model.n_layers=2", *overrides)
    tok = Tokenizer.from_state(checkpoint.load(tiny_run / "checkpoint_best.pt")["tokenizer"])
    if not cfg.tokenizer.joint:  # separate vocabularies: the same pieces, but two embedding tables
        tok = Tokenizer(tok.src_proto, tok.src_proto)
    torch.manual_seed(0)
    model = build_model(cfg.model, **tok.sizes())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    checkpoint.save({"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tok.state()}, path)
    return model.eval(), tok
