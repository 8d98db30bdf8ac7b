"""Property tests: random configs, random bytes as data files and random text to translate.

Whatever the input, the CLI ends with status 0, 1, 2 or 130 and no traceback, writes nothing
outside its run directory, and never changes an earlier run without --resume. Seeded
(`derandomize`), so CI sees the same cases every time.

These properties stay together rather than in the module test files: each random case goes through
the whole CLI (config, data, tokenizer, training, run directory, checkpoint, decoding), so a failure
belongs to no single module, and the cases share one earlier run and one set of strategies. Each
test runs 12 CLI invocations: marked slow (`make test` runs them, `make test-fast` does not).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attn_mt.cli import app

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
KEYS = ["model.d_model", "model.n_heads", "model.n_layers", "model.d_ff", "model.dropout",
        "model.max_positions", "model.kind", "train.lr", "train.batch_tokens", "train.accum_steps",
        "train.warmup_steps", "train.clip_norm", "train.keep_last", "train.eval_every",
        "train.patience", "train.schedule", "train.seed", "tokenizer.vocab_size", "tokenizer.type",
        "data.max_len", "decode.beam_size", "decode.nbest", "decode.alpha", "decode.max_len_a",
        "decode.max_len_b", "decode.batch_size", "train.unknown", "nosuch.key"]
VALUES = st.one_of(st.integers(0, 64), st.sampled_from(["rnn", "transformer", "linear", "bpe",
                                                        "unigram", "", "nan", "1e9", "[1, 2]",
                                                        "{a: 1}", "*x", "&x [1]",
                                                        "!!python/object:os.system x"]),
                   st.integers(-10**15, 10**15), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=12), st.booleans())
OVERRIDES = st.one_of(st.just([]), st.lists(st.tuples(st.sampled_from(KEYS), st.integers(1, 64)),
                                            max_size=2),
                      st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=3))
WORDS = st.text(alphabet="abcdefghij klmnop.,äöü", min_size=1, max_size=30)


def _corpus(n: int):
    """Six line-aligned files of n lines (train/valid/test x en/de), one of them maybe random
    bytes."""
    clean = st.lists(
        st.lists(WORDS, min_size=n, max_size=n).map(lambda lines: "\n".join(lines).encode()),
                     min_size=6, max_size=6)
    garbage = st.tuples(st.integers(0, 5), st.binary(max_size=200))
    return st.tuples(clean, st.one_of(st.none(), st.none(), garbage)).map(
        lambda c: [c[1][1] if c[1] and i == c[1][0] else f for i, f in enumerate(c[0])])


DATA = st.integers(1, 12).flatmap(_corpus)
BASE = [o for o in TINY if not o.startswith("data.")] + [
    "data.source=files", "data.src_lang=en", "data.tgt_lang=de", "train.max_steps=2",
    "train.max_epochs=1", "train.bleu_sentences=3", "decode.max_len_b=5"]


def run_cli(*args: str, input: bytes | None = None):
    handlers = logging.getLogger().handlers[:]
    try:
        return CliRunner().invoke(app, ["--quiet", *args], input=input)
    finally:
        logging.getLogger().handlers[:] = handlers


def files_of(folder: Path, skip: Path | None = None) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file() and (skip is None or skip not in p.parents)}


def assert_clean_exit(result) -> None:
    assert result.exit_code in (0, 1, 2, 130), (result.exit_code, result.output[-2000:])
    assert (result.exception is None
            or isinstance(result.exception, SystemExit)), repr(result.exception)
    assert "Traceback" not in result.output


def _value(v) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return str(v).lower() if isinstance(v, bool) else str(v)


@pytest.fixture(scope="module")
def earlier_run(tiny_run) -> Path:
    return tiny_run


@pytest.mark.slow
@SETTINGS
@given(overrides=OVERRIDES, data=DATA, into_earlier=st.booleans())
def test_random_configs_and_data_never_crash_or_write_elsewhere(
        overrides, data, into_earlier, earlier_run):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = work / "old_run"
        shutil.copytree(earlier_run, old)
        data_dir = work / "data"
        data_dir.mkdir()
        for (split, lang), raw in zip([(s, lang) for s in ("train", "valid", "test")
                                       for lang in ("en", "de")], data,
                                      strict=True):
            (data_dir / f"{split}.{lang}").write_bytes(raw)
        out = old if into_earlier else work / "run"
        config = work / "fuzz.yaml"
        config.write_text("name: fuzz\n")
        before_old, before = files_of(old), files_of(work, skip=out)
        args = ["--config", str(config), *[f"--set={o}" for o in BASE],
                f"--set=data.dir={data_dir}"]
        args += [f"--set={k}={_value(v)}" for k, v in overrides]
        cwd = os.getcwd()
        os.chdir(work)
        try:
            result = run_cli("train", "--out", str(out), *args)
        finally:
            os.chdir(cwd)
        assert_clean_exit(result)
        assert files_of(work, skip=out) == before  # nothing outside the run directory
        assert files_of(old) == before_old  # the earlier run untouched (no --resume given)
        if into_earlier:
            assert result.exit_code != 0


@pytest.mark.slow
@SETTINGS
@given(texts=st.lists(st.text(max_size=80), max_size=4), stdin=st.binary(max_size=300),
       beam=st.integers(-2, 6), fmt=st.sampled_from(["text", "jsonl", "xml"]))
def test_random_text_to_translate_never_crashes(texts, stdin, beam, fmt, earlier_run):
    args = ["translate", "--checkpoint", str(earlier_run / "checkpoint_best.pt"), "--device", "cpu",
            "--beam", str(beam), "--format", fmt]
    result = run_cli(*args, *[t for t in texts if not t.startswith("-")], input=stdin)
    assert_clean_exit(result)
    # one output line per input line
    if result.exit_code == 0 and fmt == "text" and beam == 1 and not texts:
        assert (result.stdout.count("\n") == stdin.count(b"\n")
                + (0 if stdin.endswith(b"\n") or not stdin else 1))
