"""The YAML reader and dataclass builder behind every config: safe loading, typed conversion, unions
by `kind`, dotted overrides, ${VAR} expansion, and errors that name the file, line or key in a short
message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
from conftest import cli

from attn_mt.config.yamlconf import ConfigError, build, first_line, read_yaml, set_overrides, show


def test_yaml_alias_bomb_gives_a_short_message(tmp_path):
    """9 levels of 9 aliases: 9^9 elements if an error message printed the value."""
    levels = ["&l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]"
                                                    for i in range(1, 9)]
    for key in ("model:\n  d_model", "train:\n  betas", "compare_me"):
        bomb = tmp_path / "bomb.yaml"
        bomb.write_text(f"{key}: [{', '.join(levels)}]\n")
        result = cli("train", "-c", bomb, "--out", tmp_path / "run")
        assert result.exit_code == 2 and len(result.stderr) < 400, result.stderr[:400]


@dataclass(frozen=True)
class Inner:
    kind: Literal["a"] = "a"
    size: int = 1
    rate: float = 0.5


@dataclass(frozen=True)
class OtherInner:
    kind: Literal["b"] = "b"
    name: str = ""


@dataclass(frozen=True)
class Outer:
    inner: Inner | OtherInner = field(default_factory=Inner)
    sizes: tuple[int, ...] = (1, 2)
    pair: tuple[float, float] = (0.9, 0.98)
    maybe: float | None = None
    flag: bool = False


def test_build_converts_types_and_picks_a_union_member_by_kind():
    cfg = build(Outer, {"inner": {"size": 3, "rate": 1}, "sizes": [4, 5], "pair": [0.8, 1],
                        "maybe": "5e-4"})
    assert cfg == Outer(Inner(size=3, rate=1.0), (4, 5), (0.8, 1.0), 5e-4)
    # YAML ints and "5e-4" strings
    assert isinstance(cfg.inner.rate, float) and isinstance(cfg.pair[1], float)
    assert build(Outer, {"inner": {"kind": "b", "name": "x"}}).inner == OtherInner(name="x")
    assert build(Outer, {}) == Outer()  # defaults live in code


@pytest.mark.parametrize("raw,message", [
    ({"inner": {"sise": 3}}, "unknown key 'inner.sise'; allowed in inner: kind, size, rate"),
    ({"inner": {"kind": "c"}}, "inner.kind='c': allowed: a, b"),
    ({"inner": {"size": True}}, "inner.size=True: expected int, got bool"),
    ({"sizes": 3}, "sizes=3: expected a list"),
    ({"pair": [1]}, "pair=[1]: expected a list of 2 values"),
    ({"flag": "yes"}, "flag='yes': expected bool, got str"),
    ({"maybe": float("inf")}, "maybe=inf: must be a finite number"),
    ({"inner": 5}, "inner: expected a mapping of keys, got 5"),
])
def test_build_names_the_key_and_what_is_allowed(raw, message):
    with pytest.raises(ConfigError) as e:
        build(Outer, raw)
    assert str(e.value) == message


def test_overrides_are_parsed_as_yaml_and_nest():
    raw = set_overrides({"train": {"lr": 1}}, ["train.lr=5e-4", "model.sizes=[1, 2]", "a.b.c=x",
                                               "name="])
    assert raw == {"train": {"lr": "5e-4"}, "model": {"sizes": [1, 2]}, "a": {"b": {"c": "x"}},
                   "name": ""}
    with pytest.raises(ConfigError, match="expected section.key=value"):
        set_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="override name.x: name is not a section"):
        set_overrides({"name": "run"}, ["name.x=1"])


def test_environment_variables_expand_in_strings(monkeypatch):
    monkeypatch.setenv("ATTN_MT_TEST_DIR", "/data/m30k")
    monkeypatch.delenv("ATTN_MT_TEST_UNSET", raising=False)
    cfg = build(OtherInner, {"name": "${ATTN_MT_TEST_DIR}/x"})
    assert cfg.name == "/data/m30k/x"
    assert build(OtherInner, {"name": "${ATTN_MT_TEST_UNSET:-/fallback}"}).name == "/fallback"


def test_messages_stay_short():
    assert len(show(list(range(10**6)))) < 80 and len(show("x" * 10**6)) < 80
    assert first_line(ValueError("first\nsecond")) == "first"
    assert first_line(KeyError()) == "KeyError" and first_line(RuntimeError("  ")) == "RuntimeError"


def test_read_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3, column 1: YAML syntax error"):
        read_yaml(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping of sections, got list"):
        read_yaml(path)
    path.write_text("")
    assert read_yaml(path) == {}
