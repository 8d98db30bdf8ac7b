"""Property: whatever damage a cache entry suffers (truncated or flipped files, keys dropped or
retyped in complete.json, arrays rewritten in another type), `attn-mt prepare` rebuilds it exactly
as it was, or ends with one line and exit 1, never a traceback."""

import json
import shutil

import numpy as np
import pytest
from conftest import cli, write_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_mt.data.toy import make_toy_corpus

FILES = ["complete.json", "spm.model", "src.ids", "tgt.ids", "src.offsets", "tgt.offsets",
         "src.lengths", "tgt.lengths"]
# a path into complete.json, taken modulo each level
WHERE = st.lists(st.integers(0, 40), min_size=1, max_size=4)
DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.sampled_from(FILES), st.floats(0, 0.999)),
    st.tuples(st.just("flip"), st.sampled_from(FILES), st.floats(0, 0.999), st.integers(1, 255)),
    st.tuples(st.just("drop"), WHERE),
    st.tuples(st.just("retype"), WHERE, st.sampled_from(["x", None, [], {}, 1.5, -1, True, 2**70])),
    st.tuples(st.just("array"), st.sampled_from(FILES[2:]),
              st.sampled_from(["float32", "int64", "uint8", "int32"])),
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A config over toy files, and a pristine copy of its cache entry."""
    tmp = tmp_path_factory.mktemp("damage")
    data = tmp / "data"
    data.mkdir()
    for split, pairs in make_toy_corpus(200).items():
        for i, lang in enumerate(("en", "de")):
            (data / f"{split}.{lang}").write_text("".join(p[i] + "\n" for p in pairs))
    config = write_config(tmp / "c.yaml", "data.source=files", f"data.dir={data}",
                          f"data.cache_dir={tmp / 'cache'}")
    assert cli("prepare", "-c", config).exit_code == 0
    (entry,) = (tmp / "cache").iterdir()
    shutil.copytree(entry, tmp / "pristine")
    return config, entry, tmp / "pristine"


def damage(entry, how) -> None:
    kind, *args = how
    if kind in ("truncate", "flip"):
        path = entry / args[0]
        raw = bytearray(path.read_bytes())
        at = int(args[1] * len(raw))
        if kind == "truncate":
            del raw[at:]
        elif raw:
            raw[at] ^= args[2]
        path.write_bytes(bytes(raw))
    elif kind == "array":
        path = entry / args[0]
        wide = (np.int64 if args[0].endswith(".offsets") else np.int32
                if args[0].endswith(".lengths") else np.uint16)
        np.fromfile(path, wide).astype(args[1]).tofile(path)
    else:
        marker = json.loads((entry / "complete.json").read_text())
        node, steps = marker, args[0]
        for i, step in enumerate(steps):
            keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            key = keys[step % len(keys)]
            if i == len(steps) - 1 or not isinstance(node[key], dict | list):
                if kind == "drop":
                    del node[key]
                else:
                    node[key] = args[1]
                break
            node = node[key]
        (entry / "complete.json").write_text(json.dumps(marker))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=DAMAGE)
def test_a_damaged_entry_is_rebuilt_or_one_line(built, how):
    config, entry, pristine = built
    shutil.rmtree(entry, ignore_errors=True)
    shutil.copytree(pristine, entry)
    damage(entry, how)
    result = cli("prepare", "-c", config)
    if result.exit_code == 0:
        for name in FILES[1:]:
            assert (entry / name).read_bytes() == (pristine / name).read_bytes(), (how, name)
        assert json.loads((entry / "complete.json").read_text())["files"] == \
            json.loads((pristine / "complete.json").read_text())["files"]
    else:
        assert (result.exit_code == 1
                and isinstance(result.exception, SystemExit)), (how, result.output)
        assert len(result.stderr.splitlines()) == 1, result.stderr
