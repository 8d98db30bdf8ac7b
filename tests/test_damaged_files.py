"""Property tests: damaged and crafted checkpoints and exports.

A checkpoint or an export that is truncated, has bytes flipped, keys dropped or values of another
type makes `translate` and `evaluate` end with status 1 and one line naming the file, never a
traceback. A damage that leaves a valid file (a flipped bit inside a weight, a decode setting
dropped for its default) may translate (status 0); truncation and every other structural change must
fail. A config that asks for a larger model than its weights (up to ~10^12 parameters, within the
config's bounds) is refused before any model is built: these run under an address-space limit, so a
build would fail, not swap. Seeded (`derandomize`), so CI sees the same cases every time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import resource
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import cli, random_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
DROP = "<drop>"  # stands for deleting the key
VALUES = st.sampled_from([DROP, None, 0, -5, 1.5, "x", b"junk", [], [1, 2], {}, {"a": 1}])
BYTES = st.tuples(st.sampled_from(["truncate", "flip"]), st.floats(0, 1, exclude_max=True),
                  st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
                           min_size=1, max_size=8))
COMMANDS = st.sampled_from(["translate", "evaluate"])
CHECKPOINT_KEYS = [("model",), ("config",), ("tokenizer",), ("format_version",),
                   ("tokenizer", "src_proto"), ("config", "model"), ("config", "model", "d_model"),
                   ("config", "decode", "beam_size"), ("model", "src_embed.weight"),
                   ("model", "out_proj.weight")]
SIZES = st.fixed_dictionaries({}, optional={"d_model": st.sampled_from([64, 4096, 16_384]),
                                            "n_layers": st.sampled_from([2, 64, 256]),
                                            "d_ff": st.sampled_from([128, 65_536, 131_072]),
                                            "max_positions": st.sampled_from([512, 1_000_000])})
EXPORT_KEYS = [(), ("sentencepiece",), ("max_positions",), ("decode",), ("decode", "beam_size"),
               ("decode", "max_len_a")]


@pytest.fixture(scope="module", autouse=True)
def one_ct2_thread():
    """CTranslate2 with one thread, as conftest gives torch: on 2 shared cores its default threads
    spin and wait (a tiny export's first translation took 8 s with 2 threads, 0.07 s with one)."""
    from attn_mt.imports import ct2_translator

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ct2_translator, "load_exported",
                   functools.partial(ct2_translator.load_exported, threads=1))
        yield


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("texts")
    (folder / "src.txt").write_text("the dog sees a cat.\na man walks.\n")
    (folder / "ref.txt").write_text("der Hund sieht eine Katze.\nein Mann geht.\n")
    return folder / "src.txt", folder / "ref.txt"


def _damage_bytes(path: Path, damage) -> None:
    kind, where, flips = damage
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        data = data[: int(where * len(data))]
    else:
        for at, mask in flips:
            data[int(at * len(data))] ^= mask
    path.write_bytes(bytes(data))


def _set(obj, keys: tuple, value) -> None:
    *parents, last = keys
    for key in parents:
        obj = obj[key]
    if value == DROP:
        del obj[last]
    else:
        obj[last] = value


def _decode_setting(keys: tuple) -> bool:
    """A key inside a decode section: dropped it has a default, and 0 or 1.5 may be valid values."""
    return "decode" in keys[:-1]


def _run(command: str, target: Path, texts: tuple[Path, Path]):
    if command == "translate":
        return cli("translate", "--checkpoint", target, "--beam", "2", "hello world", "the cat.")
    return cli("evaluate", "--checkpoint", target, "--src", texts[0], "--ref", texts[1])


def _check(result, target: Path, must_fail: bool) -> None:
    """Status 0, or 1 with one line naming the file; never an escaped exception."""
    assert (isinstance(result.exception, SystemExit)
            or result.exception is None), repr(result.exception)
    assert "Traceback" not in result.output
    if must_fail or result.exit_code != 0:
        assert result.exit_code == 1, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {target}"), result.stderr


@SETTINGS
@given(damage=BYTES, command=COMMANDS)
def test_checkpoint_with_damaged_bytes(tiny_run, texts, tmp_path, damage, command):
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        path = Path(folder) / "damaged.pt"
        shutil.copyfile(tiny_run / "checkpoint_best.pt", path)
        _damage_bytes(path, damage)
        _check(_run(command, path, texts), path, must_fail=damage[0] == "truncate")


@SETTINGS
@given(keys=st.sampled_from(CHECKPOINT_KEYS), value=VALUES, command=COMMANDS)
def test_crafted_checkpoint(tiny_run, texts, tmp_path, keys, value, command):
    state = torch.load(tiny_run / "checkpoint_best.pt", weights_only=True)
    _set(state, keys, value)
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        path = Path(folder) / "crafted.pt"
        torch.save(state, path)
        _check(_run(command, path, texts), path, must_fail=not _decode_setting(keys))


def _retyped(w: torch.Tensor, kind: str) -> torch.Tensor:
    """`w` as another kind of tensor of its shape: another layout, device or dtype."""
    return {"sparse": w.to_sparse, "meta": lambda: w.to("meta"), "bool": lambda: w > 0}.get(
        kind, lambda: w.to(getattr(torch, kind)))()


@SETTINGS
@given(key=st.sampled_from(["src_embed.weight", "out_proj.weight",
                            "encoder.0.self_attn.out_proj.bias"]),
       kind=st.sampled_from(["sparse", "meta", "complex64", "int64", "float64", "bool", "bfloat16",
                             "float16"]),
       command=COMMANDS)
def test_a_weight_of_another_kind(tiny_run, texts, tmp_path, key, kind, command):
    """A weight turned sparse, meta, complex, integer, bool or float64 is refused in one line
    (sparse and meta were tracebacks, the others loaded); bfloat16 and float16, as a model saved in
    them, translate."""
    state = torch.load(tiny_run / "checkpoint_best.pt", weights_only=True)
    state["model"][key] = _retyped(state["model"][key], kind)
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        path = Path(folder) / "retyped.pt"
        torch.save(state, path)
        result = _run(command, path, texts)
        _check(result, path, must_fail=kind not in ("bfloat16", "float16"))
        assert result.exit_code == (0 if kind in ("bfloat16", "float16") else 1), result.output


@SETTINGS
@given(file=st.sampled_from(["attn_mt.json", "spm.model", "model.bin", "config.json",
                             "shared_vocabulary.json"]),
       damage=BYTES, command=COMMANDS)
def test_export_with_damaged_bytes(tiny_ct2, texts, tmp_path, file, damage, command):
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        out = shutil.copytree(tiny_ct2, Path(folder) / "ct2")
        whole = (out / file).read_bytes()
        _damage_bytes(out / file, damage)
        # a JSON file's last newline alone is no damage
        cut = whole[len((out / file).read_bytes()):]
        _check(_run(command, out, texts), out, must_fail=damage[0] == "truncate"
               and file != "model.bin" and not (file.endswith(".json") and not cut.strip()))


@SETTINGS
@given(keys=st.sampled_from(EXPORT_KEYS), value=VALUES, command=COMMANDS)
def test_crafted_export(tiny_ct2, texts, tmp_path, keys, value, command):
    meta = json.loads((tiny_ct2 / "attn_mt.json").read_text())
    if not keys:  # the whole file
        meta = {"": value} if value == DROP else value
    else:
        _set(meta, keys, value)
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        out = shutil.copytree(tiny_ct2, Path(folder) / "ct2")
        (out / "attn_mt.json").write_text(json.dumps(meta, default=lambda b: b.decode()))
        _check(_run(command, out, texts), out, must_fail=not _decode_setting(keys))


@contextlib.contextmanager
def address_space(extra_gib: float):
    """This process may map only `extra_gib` GiB more meanwhile: building a huge model fails at
    once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = (int(re.search(r"VmSize:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))
              * 1024)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + int(extra_gib * 2**30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.slow
@SETTINGS
@given(sizes=SIZES, command=COMMANDS)
def test_a_config_asking_for_a_huge_model_is_refused_before_it_is_built(
        tiny_run, texts, tmp_path, sizes, command):
    state = torch.load(tiny_run / "checkpoint_best.pt", weights_only=True)
    state["config"]["model"].update(sizes)
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        path = Path(folder) / "huge.pt"
        torch.save(state, path)  # the tiny model's weights: a file of a few hundred KB
        with address_space(3):
            result = _run(command, path, texts)
        _check(result, path, must_fail=bool(sizes.keys() - {"max_positions"}))


def test_the_issue_s_81_billion_parameter_config_and_a_huge_position_table_are_one_line(
        tiny_cfg, tiny_run, tmp_path):
    state = torch.load(tiny_run / "checkpoint_best.pt", weights_only=True)
    # ~81e9 parameters, 324 GB
    state["config"]["model"].update(d_model=4096, n_layers=64, d_ff=65536)
    torch.save(state, tmp_path / "huge.pt")
    random_checkpoint(tiny_cfg, tiny_run, tmp_path / "wide.pt", "model.d_model=512",
                      "model.n_layers=1", "model.d_ff=32", "model.max_positions=16")
    wide = torch.load(tmp_path / "wide.pt", weights_only=True)  # 512 x 1M positions: a 2 GB table
    wide["config"]["model"]["max_positions"] = 1_000_000
    torch.save(wide, tmp_path / "wide.pt")
    for path, why in [(tmp_path / "huge.pt", "do not fit the model"),
                      (tmp_path / "wide.pt", "max_positions")]:
        with address_space(1.5):
            result = cli("translate", "--checkpoint", path, "a dog")
        _check(result, path, must_fail=True)
        assert why in result.stderr
