"""The history file read back (analysis/history_file.py): every hostile file the eighth audit
crafted is one InputError line naming it, fast and without allocating what it declares; only the
members used are read; and a fuzz over crafted files (sizes, types, nesting, counts, non-finite
values): each either loads and draws or is refused in one line. Seeded (`derandomize`): CI sees
the same cases every time."""

from __future__ import annotations

import io
import json
import time
import zipfile

import numpy as np
import numpy.lib.format as npy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attn_mt
from attn_mt.analysis.history import History, Probe, from_arrays, module_shape, to_arrays
from attn_mt.analysis.history_file import MAX_HEADS, MAX_HEADS_IN_ALL
from attn_mt.analysis.history_view import HistoryView
from attn_mt.analysis.roles import ROLES
from attn_mt.errors import InputError

MODULES = ["encoder 1 self", "decoder 1 cross"]


def small() -> History:
    """Two records, two modules of two heads, one probe."""
    e, a, h = 2, len(MODULES), 2
    probe = Probe("valid", "a b", "x y", ["▁a", "▁b", "</s>"], ["<s>", "▁x", "▁y"])
    maps = [[np.full((e, h, *module_shape(m, probe)), 1 / 3, np.float16) for m in MODULES]]
    roles = {r: np.full((e, a, h), 0.2, np.float32) for r in ROLES}
    entropy = np.full((e, a, h), 0.9, np.float32)
    return History("transformer", [0, 10], MODULES, h, roles, entropy, None, [None, None],
                   [None, 12.5], [probe], maps)


def declaring(modules: list[str], n_heads: int, e: int = 0) -> dict[str, np.ndarray]:
    """The arrays of a history whose every shape fits `modules` x `n_heads` and `e` records (zeros):
    a file that only its counts make hostile."""
    probe = small().probes[0]
    shape = (e, len(modules), n_heads)
    maps = [[np.zeros((e, n_heads, *module_shape(m, probe)), np.float16) for m in modules]]
    h = History("transformer", list(range(e)), modules, n_heads,
                {r: np.zeros(shape, np.float32) for r in ROLES}, np.zeros(shape, np.float32), None,
                [None] * e, [None] * e, [probe], maps)
    return to_arrays(h)


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def with_meta(**changes) -> dict[str, np.ndarray]:
    """The small history's arrays, meta's fields changed (a `Raw` value: into the JSON as is)."""
    arrays = to_arrays(small())
    meta = json.loads(str(arrays["meta"][0]))
    raw = {k: v.text for k, v in changes.items() if isinstance(v, Raw)}
    meta.update({k: f"@{k}@" if k in raw else v for k, v in changes.items()})
    text = json.dumps(meta)
    for k, v in raw.items():
        text = text.replace(json.dumps(f"@{k}@"), v)
    return {**arrays, "meta": np.array([text])}


class Raw:
    """JSON text put into meta as it is (Infinity, 1e400, 200k brackets)."""

    def __init__(self, text: str) -> None:
        self.text = text


def member(header: dict, data: bytes = b"") -> bytes:
    """An .npy member: its header as given (any shape), then `data`."""
    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, header)
    return buf.getvalue() + data


def zipped(members: dict[str, bytes], compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    return buf.getvalue()


def members_of(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    out = {}
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, a)
        out[name] = buf.getvalue()
    return out


def refused(path, data: bytes, says: str = "") -> str:
    """The one-line InputError naming `path` that loading `data` from it gives, quickly."""
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(InputError) as e:
        attn_mt.history(path)
    assert time.perf_counter() - start < 2.0
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and says in message, message
    return message


def plain_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.zeros(3))
    return buf.getvalue()


BASE = to_arrays(small())
HOSTILE = {  # the eighth audit's files, each a traceback (or minutes, or a MemoryError) before
    "a plain .npy named .npz": (plain_npy(), "not an attention history"),
    "meta nested 200k deep": (npz(with_meta(items=Raw("[" * 200_000 + "]" * 200_000))), "nested"),
    "n_heads Infinity": (npz(with_meta(n_heads=Raw("Infinity"))), "n_heads"),
    "n_heads 1e400": (npz(with_meta(n_heads=Raw("1e400"))), "n_heads"),
    "n_heads 2,000": (npz(declaring(["decoder cross"], 2000)), "n_heads"),  # 2 KB: drew for 30 s
    "modules not strings": (npz(with_meta(modules=[1, 2])), "modules"),
    "no modules": (npz(declaring([], 2, e=2)), "modules"),
    "modules x heads": (npz(declaring(["decoder cross"] * 96, MAX_HEADS)), "n_heads"),
    "a member not an array": (zipped({**members_of(BASE), "steps": b"not an array"}), "magic"),
    "a member of 2**40 floats": (zipped({**members_of(BASE), "entropy": member(
        {"descr": "<f4", "fortran_order": False, "shape": (2, 2, 2**38)})}), "entropy has shape"),
    "steps of 2**40 records": (zipped({**members_of(BASE), "steps": member(
        {"descr": "<i8", "fortran_order": False, "shape": (2**40,)})}), "steps"),
    "a map declaring more than it holds": (zipped({**members_of(BASE), "map_0_0": member(
        {"descr": "<f2", "fortran_order": False, "shape": (2, 2, 3, 3)})}), "holds 0 bytes"),
    "a compressed member": (zipped(members_of(BASE), compressed=True), "compressed"),
    "an infinite BLEU": (npz({**BASE, "bleu": np.array([np.nan, np.inf])}), "bleu"),
    "a BLEU above 100": (npz({**BASE, "bleu": np.array([np.nan, 1e9])}), "bleu"),
    "an object meta": (npz({**BASE, "meta": np.array([{}], dtype=object)}), "meta"),
    "steps descending": (npz({**BASE, "steps": np.array([10, 0])}), "ascending"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_every_hostile_file_of_the_audit_is_one_line_naming_it(case, tmp_path):
    data, says = HOSTILE[case]
    refused(tmp_path / "attention_history.npz", data, says)


def test_only_the_members_used_are_read_and_an_unknown_one_is_never_opened(tmp_path):
    """Every member was loaded, used or not (a 196 KB file added 195 MB); one that is not even an
    array now costs nothing, and NaN everywhere (BLEU unknown, roles that do not apply) loads and
    draws."""
    path = tmp_path / "attention_history.npz"
    nan = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in BASE.items()}
    path.write_bytes(zipped({**members_of(nan), "junk": b"\0" * 999}))
    h = attn_mt.history(path)
    assert h.bleu == [None, None] and h.steps == [0, 10]
    view = HistoryView(h)
    assert view.png().startswith(b"\x89PNG") and 'data-view="history"' in view.to_html()


def test_the_bounds_hold_a_large_real_model():
    """A Transformer-big's history (6 + 6 layers of 16 heads: 18 modules x 16 heads) fits."""
    assert 18 * 16 <= MAX_HEADS_IN_ALL and 16 <= MAX_HEADS


# ---- the fuzz: crafted files ----

LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=8))
JSON = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
PLAUSIBLE = {  # values near the real ones: counts and names that may pass or just miss the bounds
    "format": st.sampled_from([1, 1.0, 2, True]),
    "model_kind": st.sampled_from(["transformer", "rnn", "lstm"]),
    "modules": st.lists(st.sampled_from([*MODULES, "decoder 1 self", "decoder cross",
                                         "encoder 1 cross", "x"]), max_size=3),
    "n_heads": st.one_of(st.integers(-1, 3000), st.sampled_from([2.0, 1e400, float("nan"), "2"])),
    "roles": st.sampled_from([list(ROLES), list(ROLES)[::-1], [*ROLES, "x"], [*ROLES, "prev"],
                              list(ROLES)[1:]]),
    "probes": st.sampled_from([[], [{"kind": "valid"}]]),
    "items": st.sampled_from([[], [{}], [None]]),
}
DTYPES = ["<f2", "<f4", "<f8", "<i8", "<u1", "|b1", "<U3", ">f4", "<c8"]
SHAPES = st.lists(st.one_of(st.integers(0, 4), st.sampled_from([2**31, 2**62])), max_size=4)
VALUES = st.sampled_from([0.0, 0.5, 1.0, -1.0, 1e9, np.nan, np.inf, -np.inf])


@st.composite
def crafted(draw) -> bytes:
    """The small history's file with one to three changes: a meta field, a member's values, dtype or
    shape (its header may declare more than it holds), a member gone or garbage, a fortran order, or
    the whole cut short."""
    arrays = dict(BASE)
    meta = json.loads(str(arrays["meta"][0]))
    members = {}
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["meta", "json", "values", "values", "header", "gone",
                                     "garbage", "fortran"]))
        name, key = draw(st.sampled_from(sorted(arrays))), draw(st.sampled_from(sorted(PLAUSIBLE)))
        if kind in ("meta", "json"):
            meta[key] = draw(PLAUSIBLE[key] if kind == "meta" else JSON)
        elif kind == "values" and arrays[name].dtype.kind == "f" and arrays[name].size:
            a = arrays[name].copy()
            with np.errstate(over="ignore"):  # 1e9 is inf in float16: the point
                a.flat[draw(st.integers(0, a.size - 1))] = draw(VALUES)
            arrays[name] = a
        elif kind == "header":
            header = {"descr": draw(st.sampled_from(DTYPES)), "fortran_order": draw(st.booleans()),
                      "shape": tuple(draw(SHAPES))}
            members[name] = member(header, draw(st.binary(max_size=64)))
        elif kind == "gone":
            arrays.pop(name)
        elif kind == "garbage":
            members[name] = draw(st.binary(max_size=40))
        elif kind == "fortran" and arrays[name].ndim > 1:
            arrays[name] = np.asfortranarray(arrays[name])
    arrays["meta"] = np.array([json.dumps(meta)])
    data = zipped({**members_of(arrays), **members})
    cut = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=crafted())
def test_crafted_history_files_load_and_draw_or_are_one_line(data, tmp_path):
    path = tmp_path / "attention_history.npz"
    path.write_bytes(data)
    start = time.perf_counter()
    try:
        h = attn_mt.history(path)
    except InputError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
    else:
        page = HistoryView(h, "fuzz").to_html(picture=b"")  # its data (PNGs: above, 1 s each)
        assert 'data-view="history"' in page or "no evaluations recorded yet" in page
        assert from_arrays(to_arrays(h)).steps == h.steps  # writes back as read
    assert time.perf_counter() - start < 5.0
