"""A MarianMT folder as a hostile user would give it: reports aimed at its files, crafted sizes,
damaged or mistyped files, vocabularies that do not fit its SentencePiece models. Each is refused in
one line, naming the file or field, before anything is written or allocated."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import cli, one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marian_models import build, texts

import attn_mt
from attn_mt.files import OutputError
from attn_mt.imports.marian_fields import CONFIG, GENERATION


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    return build(tmp_path_factory.mktemp("hostile") / "opus-mt-en-de", shared=True, steps=0)


@pytest.fixture
def folder(marian, tmp_path):
    """A copy of the tiny MarianMT folder, to spoil."""
    return shutil.copytree(marian, tmp_path / "opus-mt-en-de")


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("command", [
    ["explain", "--checkpoint", "{m}", "a dog.", "--json", "{m}/config.json"],
    ["heads", "--checkpoint", "{m}", "--src", "{t}/s.txt", "--ref", "{t}/r.txt", "--json",
     "{m}/vocab.json"],
    ["score", "--checkpoint", "{m}", "--src", "{t}/s.txt", "--ref", "{t}/r.txt", "--json",
     "{m}/config.json"],
    ["score", "--checkpoint", "{m}", "--src", "{t}/s.txt", "--ref", "{t}/r.txt", "--json",
     "{m}/new.json"],
    ["attention", "--checkpoint", "{m}", "a dog.", "--out", "{t}/png", "--html", "{m}/view.html"],
])
def test_a_report_is_never_written_into_the_model_folder(folder, tmp_path, command):
    (src, ref), = texts(1)
    (tmp_path / "s.txt").write_text(src + "\n")
    (tmp_path / "r.txt").write_text(ref + "\n")
    before = _snapshot(folder)
    result = cli(*(a.format(m=folder, t=tmp_path) for a in command))
    one_line_error(result, 2, "would overwrite the model folder")
    assert _snapshot(folder) == before
    attn_mt.load(folder, device="cpu")  # still loads


def test_the_api_never_writes_a_report_into_the_model_folder(folder, tmp_path):
    model = attn_mt.load(folder, device="cpu")
    before = _snapshot(folder)
    (src, _), = texts(1)
    explanation = model.explain(src)
    for write in (lambda: explanation.save_json(folder / "config.json"),
                  lambda: explanation.save_html(folder / "e.html"),
                  lambda: model.attention(src).save_png(folder / "png")):
        with pytest.raises(OutputError, match="would overwrite the model folder"):
            write()
    assert _snapshot(folder) == before
    assert explanation.save_json(tmp_path / "e.json").is_file()  # elsewhere it writes


def _edit(folder, name="config.json", **fields):
    path = folder / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


PROBE = """
import json, resource, sys
import attn_mt
attn_mt.load(sys.argv[1], device="cpu")  # everything a load imports, loaded before the limit
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + int(sys.argv[2]), resource.RLIM_INFINITY))
# in turn, under the one limit: what a refused load left behind counts against the next
for folder in sys.argv[3:]:
    try:
        attn_mt.load(folder, device="cpu")
    except attn_mt.AttnMTError as e:
        print(json.dumps({"error": str(e)}))
    else:
        print(json.dumps({"loaded": True}))
"""


def load_limited(good, folders: list, headroom: int) -> list[dict]:
    """attn_mt.load of each folder, in turn, in one child process that can allocate `headroom` bytes
    more than a load of `good` takes: for each its one-line error or {"loaded": True}; a bare
    exception or a kill fails the test. (One child, not one per folder: each would spend 2 s
    starting torch.)"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(good), str(headroom),
                          *map(str, folders)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    answers = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(folders), out.stdout[-3000:]
    return answers


CRAFTED = [
    ({"vocab_size": 100_000_000}, "config.json: vocab_size=100000000: must be >= 1 and <= 1000000"),
    ({"vocab_size": 200}, "config.json: vocab_size=200, but the weights' embeddings have 104 rows"),
    ({"decoder_vocab_size": 1_000_000}, "decoder_vocab_size=1000000, but the weights' embeddings "
     "have 104 rows"),
    ({"max_position_embeddings": 1_000_000}, "model.max_positions: the model needs"),
    ({"max_position_embeddings": 100_000_000}, "max_position_embeddings=100000000: must be >= 1 "
     "and <= 1000000"),
]
FITS = {"max_position_embeddings": 10_000}  # 0.6 MB of positions: a model that fits loads


@pytest.fixture(scope="module")
def limited(marian, tmp_path_factory) -> dict:
    """load_limited's answers under a 160 MiB limit beyond a load of the tiny model, in one child:
    for CRAFTED's folders ("crafted"), (folder, answer) for each folder with one file READ a link
    to /dev/zero ("links"), and last for FITS's folder ("fits": so that nothing it holds counts
    against the others)."""
    def copy(name: str):
        return shutil.copytree(marian, tmp_path_factory.mktemp(name) / "opus-mt-en-de")

    crafted, links = [], []
    for i, (fields, _) in enumerate(CRAFTED):
        crafted.append(copy(f"crafted{i}"))
        _edit(crafted[-1], **fields)
    for name in READ if os.path.exists("/dev/zero") else []:
        links.append(copy(f"link_{name}"))
        (links[-1] / name).unlink()
        (links[-1] / name).symlink_to("/dev/zero")
    fits = copy("fits")
    _edit(fits, **FITS)
    answers = load_limited(marian, [*crafted, *links, fits], 160 << 20)
    return {"crafted": answers[: len(crafted)],
            "links": list(zip(links, answers[len(crafted):-1], strict=True)), "fits": answers[-1]}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux: RLIMIT_AS and /proc")
@pytest.mark.parametrize("case", range(len(CRAFTED)), ids=[f"fields{i}-{says}" for i,
                                                           (_, says) in enumerate(CRAFTED)])
def test_crafted_sizes_are_refused_before_allocation(limited, case):
    """Under a 160 MiB limit beyond a load of the tiny model: a position table of 1e6 x 16 floats
    (64 MB, its float64 sinusoids 3 times that) is refused by the memory check, a vocabulary of 1e8
    pieces by its limit."""
    says, answer = CRAFTED[case][1], limited["crafted"][case]
    assert says in answer.get("error", ""), answer


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux: RLIMIT_AS and /proc")
def test_the_limit_of_the_crafted_sizes_leaves_room_for_the_model(limited):
    assert limited["fits"] == {"loaded": True}


def _truncate(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGED = {
    "truncated weights": (_truncate, "model.safetensors: not readable weights (truncated or "
                          "damaged"),
    "garbage weights": (lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 100),
                        "model.safetensors: not readable weights"),
    "config a list": (lambda f: (f / "config.json").write_text("[1, 2]"),
                      "config.json: holds a JSON list, not an"),
    "vocab a list": (lambda f: (f / "vocab.json").write_text('["a"]'),
                     "vocab.json: holds a JSON list, not an"),
    "tokenizer_config a list": (lambda f: (f / "tokenizer_config.json").write_text("[]"),
                                "tokenizer_config.json: holds a JSON list"),
    "deep JSON": (lambda f: (f / "config.json").write_text("[" * 100_000 + "]" * 100_000),
                  "config.json: not valid JSON"),
    "d_model a string": (lambda f: _edit(f, d_model="16"),
                         "config.json: d_model='16': expected int, got str"),
    "dropout a string": (lambda f: _edit(f, dropout="x"),
                         "config.json: dropout='x': expected float, got str"),
    "dropout a bool": (lambda f: _edit(f, dropout=True),
                       "config.json: dropout=True: expected float, got bool"),
    "bad_words_ids of text": (lambda f: _edit(f, "generation_config.json", bad_words_ids=[["x"]]),
                              "generation_config.json: bad_words_ids holds ['x']: expected lists "
                              "of token ids"),
    "bad_words_ids too large": (lambda f: _edit(f, "generation_config.json",
                                                bad_words_ids=[[1_000_000_000]]),
                                "generation_config.json: bad_words_ids holds [1000000000]"),
    "separate_vocabs a string": (lambda f: _edit(f, "tokenizer_config.json", separate_vocabs="yes"),
                                 "tokenizer_config.json: separate_vocabs='yes': expected bool"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_or_mistyped_file_is_one_line_naming_it(folder, case):
    spoil, says = DAMAGED[case]
    spoil(folder)
    result = cli("translate", "--checkpoint", folder, "a dog.")
    one_line_error(result, 1, says)


class Hung(BaseException):
    """Raised by `deadline`: a BaseException, which no `except OSError` or `except Exception` of the
    code under test swallows (a TimeoutError was caught as an OSError, and the load went on to block
    again)."""


@contextlib.contextmanager
def deadline(seconds: int):
    """Fails what is still running after `seconds` (SIGALRM interrupts a blocked open or read): a
    load that blocks ends the test, not the suite."""
    def stop(*_):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


READ = ["config.json", "generation_config.json", "tokenizer_config.json", "vocab.json",
        # every file the loader reads (target_vocab.json: tests/marian/test_marian.py's)
        "source.spm", "target.spm", "model.safetensors"]


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not hasattr(signal, "alarm"),
                    reason="POSIX: FIFOs and SIGALRM")
@pytest.mark.parametrize("name", READ)
def test_a_fifo_in_place_of_a_file_is_refused_at_once(folder, name):
    """config.json as a FIFO hung the loader until it was killed (an open for reading waits for a
    writer)."""
    (folder / name).unlink()
    os.mkfifo(folder / name)
    with deadline(20):
        result = cli("translate", "--checkpoint", folder, "a dog.")
    one_line_error(result, 1, f"{folder / name}: not a regular file")


@pytest.mark.skipif(not os.path.exists("/dev/zero") or not os.path.exists("/proc/self/statm"),
                    reason="Linux: /dev/zero, RLIMIT_AS and /proc")
def test_a_link_to_a_device_in_place_of_a_file_is_refused_unread(limited):
    """config.json as a link to /dev/zero was read until memory ran out (a MemoryError traceback
    under a 3 GB limit); here under a limit of 160 MiB beyond a load of the tiny model, for each
    file read."""
    for (folder, answer), name in zip(limited["links"], READ, strict=True):
        assert answer.get("error") == f"{folder / name}: not a regular file", answer


def test_a_json_file_or_sentencepiece_model_above_its_size_limit_is_refused_unread(
        folder, monkeypatch):
    from attn_mt.imports import folder_files

    monkeypatch.setattr(folder_files, "FILE_MOST", 1000)
    size = (folder / "vocab.json").stat().st_size
    with pytest.raises(attn_mt.AttnMTError, match=f"vocab.json: {size} bytes, more than the 1000 "
                       "it may have$"):
        attn_mt.load(folder, device="cpu")


def _vocab(folder) -> dict:
    return json.loads((folder / "vocab.json").read_text())


def _foreign_pieces(folder):
    vocab = _vocab(folder)  # another model's pieces under the same ids (Q5, Q26, ...)
    (folder / "vocab.json").write_text(json.dumps({(p if p.startswith("<") else f"Q{i}"): i for p,
                                                   i in vocab.items()}))


def _duplicate_id(folder):
    vocab = _vocab(folder)
    piece = next(p for p in vocab if p.startswith("▁"))
    (folder / "vocab.json").write_text(json.dumps({**vocab, piece: vocab["<unk>"] + 4}))


@pytest.mark.parametrize("spoil,says", [
    (_foreign_pieces, "vocab.json: lacks"),
    (lambda f: (f / "vocab.json").write_text(json.dumps({**_vocab(f), "Zzz": 5})),
     "id 5 is given to both"),
    (_duplicate_id, "is given to both"),
])
def test_a_vocabulary_that_is_not_the_sentencepiece_models_is_refused(folder, spoil, says):
    spoil(folder)
    one_line_error(cli("translate", "--checkpoint", folder, "a dog."), 1, says)


def test_a_missing_file_in_a_missing_folder_is_not_a_hub_name(tmp_path, monkeypatch):
    from attn_mt.imports.marian import is_marian

    monkeypatch.chdir(tmp_path)
    assert not is_marian("nosuchdir/checkpoint_best.pt") and not is_marian("nosuchdir/config.json")
    assert is_marian("Helsinki-NLP/opus-mt-en-de")
    one_line_error(cli("translate", "--checkpoint", "nosuchdir/checkpoint_best.pt", "a dog."), 1,
                   "nosuchdir/checkpoint_best.pt: checkpoint not found")


# --- fuzz: any JSON value in any field the reader takes
# -----------------------------------------------------
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                              st.sampled_from([0, 1, 2, 16, 103, 104, 10**6, 10**9,
                    -1]), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _load_or_refuse(folder, named: tuple[str, ...]) -> None:
    """The folder loads and translates, or is refused by an AttnMTError naming one of `named`."""
    try:
        model = attn_mt.load(folder, device="cpu")
    except attn_mt.AttnMTError as e:
        assert any(n in str(e) for n in named), str(e)
        assert len(str(e).splitlines()) == 1, str(e)
        return
    assert isinstance(model.translate("a dog runs.", max_len_b=8, max_len_a=0.0), str)


@FUZZ
@given(field=st.sampled_from([*CONFIG, *GENERATION, "vocab_size", "d_model", "pad_token_id"]),
       value=JSON)
def test_fuzz_any_config_field_loads_or_is_refused_naming_it(folder, field, value):
    name = "generation_config.json" if field in GENERATION else "config.json"
    saved = (folder / name).read_bytes()
    try:
        _edit(folder, name, **{field: value})
        _load_or_refuse(folder, (field,))
    finally:
        (folder / name).write_bytes(saved)


@FUZZ
@given(piece=st.one_of(st.sampled_from(["<unk>", "<pad>", "</s>", "▁a", ">>de<<"]),
                       st.text(max_size=4)), value=JSON)
def test_fuzz_any_vocab_entry_loads_or_is_refused_naming_the_file(folder, piece, value):
    saved = (folder / "vocab.json").read_bytes()
    try:
        (folder / "vocab.json").write_text(json.dumps({**json.loads(saved), piece: value}))
        _load_or_refuse(folder, ("vocab.json",))
    finally:
        (folder / "vocab.json").write_bytes(saved)
