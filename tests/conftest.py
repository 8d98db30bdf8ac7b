"""Shared fixtures: tiny configs on the built-in toy corpus, and one tiny trained run."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from attn_mt.config import load_config

if TYPE_CHECKING:
    import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny test models are many small ops: one thread is as fast on a quiet machine and ~10x faster than
# two when the 2 cores are shared (measured 2.7 s vs 36 s for the decoding tests' model). The
# commands tests start get one thread too (torch reads OMP_NUM_THREADS when it loads): two pytest
# workers each running a 2-thread command is 4 threads on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items):
    """Files with slow tests first (the most first), then the others (the largest first).
    pytest-xdist hands out whole files in this order (the Makefile's --dist loadfile
    --no-loadscope-reorder), so the long files start early and the short ones fill the end: by
    number of tests alone, a 30-second one-test file ran last on one worker while the other stood
    idle."""
    def file(item) -> str:
        return item.nodeid.split("::")[0]

    size, slow = Counter(map(file, items)), Counter(file(i) for i in items
                                                    if i.get_closest_marker("slow"))
    # stable within a file
    items.sort(key=lambda item: (-slow[file(item)], -size[file(item)], file(item)))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # a fixture, not an import here: pytest-xdist's controller loads this file too, and needs no
    # torch (2 s)
    import torch

    torch.set_num_threads(1)


MULTI30K = Path(os.environ.get("MULTI30K_DIR", Path(__file__).resolve().parents[2]
                               / "shared/data/multi30k"))

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
    """Tests keep the data cache (attn_mt/data/cache.py) in a temporary directory, not
    ~/.cache/attn_mt."""
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


@pytest.fixture(scope="session")
def tiny_ct2(tiny_run, tmp_path_factory) -> Path:
    """tiny_run's best checkpoint exported for CTranslate2, once per session (tests read it; one
    that damages an export damages a copy); skipped where ctranslate2 is not installed."""
    pytest.importorskip("ctranslate2")
    from attn_mt.export.ctranslate2 import export_ct2

    out = tmp_path_factory.mktemp("ct2") / "tiny"
    export_ct2(tiny_run / "checkpoint_best.pt", out)
    return out


@pytest.fixture(scope="session")
def prestarted_bin(tmp_path_factory) -> Path:
    """A folder whose `attn-mt` and `python/python` run each command in a fork of one process that
    imported torch and attn-mt (tests/prestarted.py), started once per session."""
    from prestarted import prestarted

    with prestarted(tmp_path_factory.mktemp("prestarted")) as folder:
        yield folder


@pytest.fixture
def multi30k() -> Path:
    """The shared Multi30k directory; the test is skipped where it is absent (a user's clone)."""
    if not (MULTI30K / "train.de").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set MULTI30K_DIR)")
    return MULTI30K


def cli(*args, input: str | bytes | None = None, quiet: bool = True):
    """Run the CLI in this process (no 2-second start), with --quiet first unless `quiet` is False:
    click's Result, stderr only the error line."""
    import logging

    from typer.testing import CliRunner

    from attn_mt.cli import app

    handlers = logging.getLogger().handlers[:]
    try:
        return CliRunner().invoke(app, [*(["--quiet"] if quiet else []), *map(str, args)],
                                  input=input)
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
    matters), saved as a checkpoint at `path`: what the exporters' equality tests compare
    against."""
    import torch

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
    checkpoint.save({"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tok.state()},
                    path)
    return model.eval(), tok


# ---- toy data as files ----

def toy_files(d: Path) -> Path:
    """The tiny toy corpus as {split}.{en,de} files in `d`."""
    from attn_mt.data.toy import make_toy_corpus

    d.mkdir()
    for split, pairs in make_toy_corpus(300).items():
        (d / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs))
        (d / f"{split}.de").write_text("".join(t + "\n" for _, t in pairs))
    return d


def toy_test_files(tmp_path: Path, n: int = 12) -> tuple[Path, Path]:
    """The toy corpus's first n test pairs as src (en) and ref (de) files."""
    from attn_mt.data.toy import make_toy_corpus

    pairs = make_toy_corpus(300)["test"][:n]
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(s + "\n" for s, _ in pairs))
    ref.write_text("".join(t + "\n" for _, t in pairs))
    return src, ref


def cfg_for(files: Path, tmp_path: Path, *extra: str):
    """The tiny config reading `files` (from toy_files), with its data cache in tmp_path/cache."""
    return load_config(None, [*TINY, "data.source=files", f"data.dir={files}",
                              f"data.cache_dir={tmp_path / 'cache'}", *extra])


# ---- a toy reverser: a real Transformer on a tiny search space (decoding and GPU tests) ----

PAD, BOS, EOS, V = 0, 2, 3, 16


def sources(n: int, seed: int, vocab: int = V) -> list[list[int]]:
    """Random source ids of 1..11 tokens, eos-terminated."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 12, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (k,), generator=g).tolist() + [EOS] for k in lens]


@functools.cache  # one training per session, shared by the decoding tests
def train_reverser(vocab: int = V, steps: int = 100, **layers) -> torch.nn.Module:
    """A small Transformer half-trained to reverse its input: confident enough to end with eos,
    unsure enough that beam search and greedy often disagree. `layers`: TransformerConfig
    options."""
    import torch
    import torch.nn.functional as F

    from attn_mt.config import TransformerConfig
    from attn_mt.data.batching import pad
    from attn_mt.models import build_model

    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
                            max_positions=64, **layers)
    model = build_model(cfg, src_vocab=vocab, tgt_vocab=vocab, pad_id=PAD, shared_vocab=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        xs = [s[:-1] for s in sources(32, 1000 + step, vocab)]
        src = pad([x + [EOS] for x in xs], PAD)
        tgt_in, tgt_out = pad([[BOS] + x[::-1]
                               for x in xs], PAD), pad([x[::-1] + [EOS] for x in xs], PAD)
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(),
                               ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def batch(srcs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded sources and their output limits 1.5 |src| + 3."""
    import torch

    from attn_mt.data.batching import pad

    lens = torch.tensor([len(s) for s in srcs])
    return pad(srcs, PAD), (lens * 1.5 + 3).long()


def with_distance_bias(model, slopes: tuple[float, ...] | None = None):
    """`model` (a Transformer, changed in place) with a position scheme that only adds a bias to
    self-attention's scores, in place of its own: -slope_h |i - j| on head h (ALiBi's form, both
    directions; slopes 1/2, 1/4, ... unless given, one per head)."""
    import torch

    slopes = slopes or tuple(0.5 ** (h + 1) for h in range(model.cfg.n_heads))

    from attn_mt.models.positions import InAttention, Positions

    class DistanceBias(Positions):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("slopes", torch.tensor(slopes), persistent=False)

        def attending(self, offset, t: int, s: int, device) -> InAttention:
            queries = torch.arange(s - t, s, device=device)  # the last t of the s keys
            distance = (queries[:, None] - torch.arange(s, device=device)).abs()  # (T, S)
            return InAttention(bias=-self.slopes[:, None, None] * distance)  # (H, T, S)

    model.pos = model.tgt_pos = DistanceBias()
    return model


# ---- waiting for another thread or process ----

def wait_until(pred, timeout: float = 30.0, interval: float = 0.01, what: str = "the condition"):
    """Poll `pred()` until it is truthy and return its value; fail after `timeout` seconds. The
    deadline is generous (a loaded machine), the interval short (a quiet one does not wait):
    `wait_until(lambda: x.done)`."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)
    return value


def ctrl_c_able() -> None:
    """A subprocess's `preexec_fn` for tests that Ctrl-C it: SIGINT as a terminal gives it (a runner
    started in the background, e.g. `nohup make test &`, passes SIGINT on ignored, and a child keeps
    ignoring it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---- the serve app in-process (tests/serve) ----

LOCAL = "http://localhost"  # the Host the server allows (TestClient sends "testserver" by default)
# of `client`
SERVE_LIMITS = {"max_texts": 4, "max_chars": 200, "max_attention_chars": 100, "max_beam": 6}


@pytest.fixture(scope="module")
def ckpt(tiny_run) -> Path:
    """The tiny run's best checkpoint."""
    return tiny_run / "checkpoint_best.pt"


@pytest.fixture(scope="module")
def client(ckpt):
    """The serve app on `ckpt` with SERVE_LIMITS, through fastapi's TestClient (skipped without the
    serve extra)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from attn_mt.serve import Limits, create_app

    with TestClient(create_app(ckpt, Limits(**SERVE_LIMITS), device="cpu"), base_url=LOCAL) as c:
        yield c


# ---- a server on a real socket ----

@contextmanager
def serving(app, header_timeout_s: float = 10.0):
    """`app` on a real server (as `attn-mt serve` runs it) in a thread, on a free port of 127.0.0.1;
    yields the base URL; `app.state.server` is the uvicorn server, `app.state.thread` its thread."""
    from attn_mt.serve import listen
    from attn_mt.serve.server import make_server

    sock = listen("127.0.0.1", 0)
    server = app.state.server = make_server(app, header_timeout_s)
    thread = app.state.thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                                 daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the server to start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


@contextmanager
def chromium(*flags: str):
    """Debian's headless Chromium through chromedriver (selenium), its console log kept, with
    `flags` too (a window size, a dead proxy: no network); the test skips where either is
    missing."""
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("no Chromium and chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    profile = tempfile.mkdtemp(prefix="attn-mt-chromium-")
    for flag in [*CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
