"""README's shell and Python examples run as written, so an example that stops working fails `make
test`.

The ```python blocks of a document run in order as one script (later blocks use what earlier ones
made), in the same folder as the shell examples, with the same markers, started as the commands are
(below).

Every ```sh / ```bash block of README.md (and of the docs in DOCS, whose blocks can run offline)
runs in bash (`set -euo pipefail`) in a temporary folder, with this venv's `attn-mt` and `python`
first on PATH, and must exit 0. Its `attn-mt` commands are forks of a pre-started process that has
imported torch (tests/prestarted.py: the same command without 2-3 s of imports each;
tests/test_cli.py runs the installed one). A line directly above a block marks it:

    <!-- example: needs multi30k -->     skipped without Multi30k (MULTI30K_DIR); so is a block
                                         naming /path/to/multi30k
    <!-- example: needs gpu -->          skipped without CUDA
    <!-- example: not run (why) -->      never run

Placeholders become real files: `runs/toy` a copy of a toy run made once per session
(configs/toy.yaml with a tiny model for 2 epochs: like the demo's run it keeps snapshots and writes
test.en/test.de); `/path/to/multi30k` (and $MULTI30K_DIR) the first 3000 training and 200 other
lines of each Multi30k file; `/path/to/checkpoint.pt` runs/toy/checkpoint_best.pt; `sentences.txt`
and `refs.txt` three English toy sentences and their references. `configs/` and `scripts/` are the
repository's.

Long examples are shortened: a Python example's `attn_mt.train` gets a tiny model and short
outputs first in its overrides (PYTHON_TRAIN; its own steps and data come after them and win);
`attn-mt train|prepare|compare-rnn|bench` get SHORTEN's overrides inserted right after the
subcommand (a tiny model, a few steps, a small vocabulary, translations of at most 4 subwords: an
untrained model translates up to the length limit; the example's own `--set`s come later and win);
`attn-mt serve` runs in the background on a free port until the block ends (the
example's curl retries until it answers), and `localhost:8000` becomes that port; `curl -s` becomes
`curl -sf`, so an HTTP error fails the example.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K, TINY

ROOT = Path(__file__).resolve().parents[1]
# README and the linked docs whose examples run offline or are marked (the others' blocks are
# commands of an hour's training on Multi30k, or need internet, or are run by their own tests)
DOCS = ("README.md", "docs/compare-rnn.md", "docs/performance.md", "docs/results.md", "docs/api.md",
        "docs/speedrun.md", "docs/history.md", "docs/alignment.md")
BIN = Path(sys.executable).parent
MARK = re.compile(r"<!--\s*example:\s*(needs multi30k|needs gpu|not run\b[^>]*?)\s*-->")

_model = [s for s in TINY if s.startswith(("model.", "train.lr", "train.warmup", "train.batch",
                                           "train.device", "train.precision"))]
TOY_RUN = ["data.toy_size=300", "tokenizer.vocab_size=120", *_model, "train.max_epochs=2",
           "train.bleu_sentences=20"]
# an untrained model decodes to the length limit
_short_outputs = ["decode.max_len_a=0", "decode.max_len_b=4"]
SHORTEN = {  # subcommand -> arguments inserted after it
    "train": [*_model, *_short_outputs, "tokenizer.vocab_size=300", "data.toy_size=1000",
              "train.max_steps=3", "train.max_minutes=0", "train.bleu_sentences=5",
              "train.eval_every=3"],
    "prepare": ["tokenizer.vocab_size=300"],
    "compare-rnn": ["compare.budget_minutes=0.005", "compare.eval_every_minutes=0.005",
                    "compare.lengths=[8]", "compare.length_batch_tokens=256", "compare.repeats=1",
                    "compare.decode_sentences=4", "compare.decode_repeats=1",
                    "tokenizer.vocab_size=300", "data.toy_size=1000", "train.bleu_sentences=5",
                    "transformer.model.d_model=32", "transformer.model.n_heads=2",
                    "transformer.model.n_layers=1", "transformer.model.d_ff=64",
                    "rnn.model.d_embed=32", "rnn.model.d_hidden=24", "rnn.model.d_attn=32",
                    "train.batch_tokens=500", *_short_outputs],
    "bench": [*_model, "tokenizer.vocab_size=300", "data.toy_size=1000"],
}
BENCH_FLAGS = "--repeats 1 --steps 1 --sentences 4"
# put first in the overrides of a Python example's attn_mt.train (its own come later and win)
PYTHON_TRAIN = [*_model, *_short_outputs, "train.bleu_sentences=5"]


def blocks(doc: str, kinds: tuple[str, ...] = ("```sh", "```bash")) -> list[tuple[str, str, str]]:
    """(id, marker or "", text) of every sh/bash block (or block of `kinds`) in `doc`."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() in kinds:
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            mark = MARK.search(lines[start - 1]) if start else None
            found.append((f"{doc}:{start + 1}", mark.group(1).strip() if mark else "",
                          "\n".join(body)))
        i += 1
    return found


def commands(text: str) -> str:
    """A block's commands without comments: two blocks that differ only in comments run once."""
    return "\n".join(line.split(" #")[0].strip() for line in text.splitlines() if line.strip())


EXAMPLES = [b for doc in DOCS for b in blocks(doc)]
PYTHON = {doc: found for doc in DOCS if (found := [b for b in blocks(doc, ("```python",))
                                                   if not b[1]])}
SEEN = {}
for where, _, text in EXAMPLES:
    SEEN.setdefault(commands(text), where)


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory) -> Path:
    """A short toy run from configs/toy.yaml (tiny model, 2 epochs, 2 snapshots kept), made once."""
    from attn_mt.config import load_config
    from attn_mt.training.run import train

    run_dir = tmp_path_factory.mktemp("readme") / "toy"
    train(load_config(ROOT / "configs/toy.yaml", TOY_RUN), run_dir)
    return run_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shorten(script: str) -> str:
    """The example with SHORTEN's overrides, a background server on a free port and failing
    curls."""
    for command, sets in SHORTEN.items():
        extra = " ".join(f"--set '{s}'" for s in sets) + (f" {BENCH_FLAGS}" if command == "bench"
                                                          else "")
        script = re.sub(rf"\battn-mt {command}(?=\s)", f"attn-mt {command} {extra}", script)
    port = free_port()
    script = re.sub(r"^(\s*attn-mt serve .*?)\s*&?\s*(#.*)?$",
                    rf"\1 --port {port} >serve.log 2>&1 &\nserver=$!; trap 'kill $server' EXIT",
                    script, flags=re.M)
    return script.replace("localhost:8000", f"localhost:{port}").replace("curl -s ", "curl -sf ")


def shorten_python(script: str) -> str:
    """The Python examples with PYTHON_TRAIN first in each `attn_mt.train(..., overrides=[...])`:
    the example's own steps and data, with the shell examples' tiny model and short outputs."""
    sets = "".join(f"{s!r}, " for s in PYTHON_TRAIN)
    shortened, n = re.subn(r"\battn_mt\.train\([^()]*?\boverrides=\[", lambda m: m.group(0) + sets,
                           script)
    assert n == script.count("attn_mt.train("), "an attn_mt.train example without overrides=[...]"
    return shortened


def workdir(tmp_path: Path, toy_run: Path) -> Path:
    """The folder an example runs in: runs/toy, configs/, scripts/, sentences.txt and refs.txt."""
    shutil.copytree(toy_run, tmp_path / "runs/toy")
    for name in ("configs", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    for name, split in (("sentences.txt", "test.en"), ("refs.txt", "test.de")):
        lines = (toy_run / split).read_text(encoding="utf-8").splitlines()[:3]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("doc", PYTHON)
def test_python_examples_run_as_one_script(doc, toy_run, prestarted_bin, tmp_path):
    cwd = workdir(tmp_path, toy_run)
    script = shorten_python("\n\n".join(f"# {where}\n{text}" for where, _, text in PYTHON[doc]))
    (cwd / "examples.py").write_text(script, encoding="utf-8")
    result = subprocess.run([prestarted_bin / "python" / "python", "examples.py"], cwd=cwd,
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert (result.returncode == 0), (f"{doc}:\n--- stdout\n{result.stdout[-2000:]}\n--- "
                                      f"stderr\n{result.stderr[-3000:]}")


def test_every_block_is_found_and_marked_known():
    assert len(EXAMPLES) >= 8, "README's examples were not found"
    assert "README.md" in PYTHON and "docs/api.md" in PYTHON, "the Python examples were not found"
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert (len(MARK.findall(text))
                == text.count("<!-- example:")), f"{doc}: a marker this test does not know"


@pytest.fixture(scope="session")
def multi30k_sample(tmp_path_factory) -> Path:
    """The first lines of every Multi30k file (real data, aligned): what /path/to/multi30k becomes,
    so that an example's tokenizer and cache take seconds, not the minute the full 29k pairs
    would."""
    out = tmp_path_factory.mktemp("multi30k_sample")
    for f in MULTI30K.iterdir():
        if f.suffix in (".de", ".en", ".fr", ".cs"):
            lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
            (out / f.name).write_text("".join(lines[: 3000 if f.stem == "train" else 200]),
                                      encoding="utf-8")
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("where", "mark", "text"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_runs(where, mark, text, toy_run, prestarted_bin, tmp_path, request):
    if mark.startswith("not run"):
        pytest.skip(mark)
    if SEEN[commands(text)] != where:
        pytest.skip(f"the same commands as {SEEN[commands(text)]}")
    if ((mark == "needs multi30k" or "/path/to/multi30k" in text)
        and not (MULTI30K / "train.de").exists()):
        pytest.skip("needs Multi30k (MULTI30K_DIR)")
    if mark == "needs gpu" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sample = (request.getfixturevalue("multi30k_sample") if (MULTI30K / "train.de").exists()
              else MULTI30K)
    cwd = workdir(tmp_path, toy_run)
    script = shorten(text.replace("/path/to/multi30k", str(sample))
                     .replace("/path/to/checkpoint.pt", "runs/toy/checkpoint_best.pt")
                     .replace("/path/to/checkpoint_best.pt", "runs/toy/checkpoint_best.pt"))
    env = {**os.environ,
           "PATH": os.pathsep.join(map(str, (prestarted_bin, BIN, os.environ["PATH"]))),
           "MULTI30K_DIR": str(sample)}
    result = subprocess.run(["bash", "-c", f"set -euo pipefail\n{script}"], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert (result.returncode
            == 0), f"{where}:\n{script}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n" \
                                   f"{result.stderr[-3000:]}"
