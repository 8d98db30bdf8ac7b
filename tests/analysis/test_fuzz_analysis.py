"""A property test over the analysis functions' and the views' arguments (hypothesis, seeded), as
tests/api/test_fuzz_api.py does for `Model`: `inside`, `without`, `model_view` and the views'
`save_html` / `save_png` / `save_json`, each called with one argument replaced by an arbitrary value
(wrong types, lone surrogates, huge ints, bools for ints, None, dicts), either answer or raise an
AttnMTError whose `field` names the argument, in one line; nothing else escapes (AttributeError,
TypeError, pybind's RuntimeError)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attn_mt
from attn_mt.analysis import inside, model_view, without

TEXT, TARGET = "a small dog sees the old man.", "ein kleiner Hund sieht den alten Mann."
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
SURROGATES = ["\ud800", "\udbff", "\udc80", "\udfff"]
TEXTS = st.text(st.one_of(st.characters(), st.sampled_from(SURROGATES)), max_size=20)
VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 10**6, 2**64, -(10**30), 1.5, math.nan, "",
                     " ", "x", "1", "encoder", "cross", "cross 1.1", "cross ².1",
                     "cross 1.99999999999", "\ud800", "a \udcff dog.", "a\x00b", b"a dog.", [],
                     ["a dog."], ["\ud800 dog"], ["cross 1.1", 5], {"a": 1}, {"a dog."},
                     Path("/nonexistent/file.txt"), object()]),
    st.integers(), TEXTS, st.lists(TEXTS, max_size=3),
)


@pytest.fixture(scope="module")
def model(tiny_run):
    return attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")


@pytest.fixture(scope="module")
def done(model):
    """What the views are made from: an Attention, an Explanation, a HeadsReport."""
    return {"att": model.attention(TEXT), "explanation": model.explain(TEXT, kind="encoder"),
            "report": model.heads([TEXT], [TARGET], sentences=1)}


def _entered(manager) -> None:
    with manager:
        pass


# name: (call with the value in one argument's place); the argument is the name's last part
CALLS = {
    "inside.model": lambda m, d, v: inside(v, TEXT),
    "inside.texts": lambda m, d, v: inside(m, v),
    "inside.kind": lambda m, d, v: inside(m, TEXT, kind=v),
    "inside.layer": lambda m, d, v: inside(m, TEXT, layer=v),
    "inside.targets": lambda m, d, v: inside(m, TEXT, targets=v),
    "without.model": lambda m, d, v: _entered(without(v, "cross 1.1")),
    "without.heads": lambda m, d, v: _entered(without(m, v)),
    "model_view.att": lambda m, d, v: model_view(v),
    "model_view.heads": lambda m, d, v: model_view(d["att"], heads=v).payload(),
    "Attention.save_html.path": lambda m, d, v: d["att"].save_html(v),
    "Attention.save_png.out_dir": lambda m, d, v: d["att"].save_png(v),
    "ModelView.save_html.path": lambda m, d,
    v: model_view(d["att"], heads="cross 1.1").save_html(v), "Explanation.save_json.path": lambda m,
    d, v: d["explanation"].save_json(v), "Explanation.save_html.path": lambda m, d,
    v: d["explanation"].save_html(v), "HeadsReport.save_html.path": lambda m, d,
    v: d["report"].save_html(v),
}
# each folder it takes gets every map drawn as a PNG (~0.4 s)
FEWER = {"Attention.save_png.out_dir": 8}
FIELDS = {"inside.model": {"model"}, "without.model": {"model"}, "model_view.att": {"att"},
          "inside.texts": {"texts"}, "inside.targets": {"targets"}}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_any_argument_gives_an_answer_or_an_attn_mt_error_naming_it(
        model, done, name, tmp_path_factory):
    call, field = CALLS[name], name.rsplit(".", 1)[1]
    folder = tmp_path_factory.mktemp("fuzz")

    @settings(SETTINGS, max_examples=FEWER.get(name, SETTINGS.max_examples))
    @given(value=VALUES)
    def check(value):
        if (field in ("path", "out_dir") and isinstance(value, str) and value.strip()
            and "\0" not in value):
            value = str(folder / Path(value).name)  # never beside the test's own files
        try:
            call(model, done, value)
        except attn_mt.AttnMTError as e:
            assert (e.field
                    in FIELDS.get(name, {field})), f"{name}({value!r}): field {e.field!r}: {e}"
            assert "\n" not in str(e)
        # a file the system refuses (no such folder): the writers' own error, naming it
        except OSError as e:
            assert (field in ("path", "out_dir")
                    and "/nonexistent" in str(e)), f"{name}({value!r}): {e!r}"

    check()


@pytest.mark.parametrize("call,field", [
    # was AttributeError: 'NoneType' has no '_transformer'
    (lambda m, att: inside(None, TEXT), "model"),
    (lambda m, att: inside("x.pt", TEXT), "model"),  # a path: load it first
    (lambda m, att: inside(m, {"a": 1}), "texts"),  # was: the dict's key translated
    (lambda m, att: inside(m, TEXT, layer=True), "layer"),  # was accepted as layer 1
    (lambda m, att: inside(m, TEXT, targets=5), "targets"),
    (lambda m, att: _entered(without(None, "cross 1.1")), "model"),
    (lambda m, att: _entered(without(m, "cross ².1")), "heads"),  # was int("²"): ValueError
    # was TypeError: 'int' object is not iterable
    (lambda m, att: model_view(att, heads=5), "heads"),
    (lambda m, att: att.save_html({}), "path"),  # was TypeError from Path()
    (lambda m, att: att.save_png(None), "out_dir"),
])
def test_bad_arguments_of_the_analysis_functions_name_them(model, done, call, field):
    with pytest.raises(attn_mt.InputError) as e:
        call(model, done["att"])
    assert e.value.field == field, str(e.value)


def test_lone_surrogates_in_inside_and_the_views_are_u_fffd(model, tmp_path):
    """As in the source text everywhere (it was pybind's 'Unable to cast Python instance'
    RuntimeError)."""
    a, b = (inside(model, "\ud800 Hund", targets="A \udfff"),
            inside(model, "\ufffd Hund", targets="A \ufffd"))
    assert a.source_tokens == b.source_tokens and a.target_inputs == b.target_inputs
    att = model.attention("a \udcff dog.")
    assert (att.source == "a \ufffd dog."
            and att.save_html(tmp_path / "a.html").read_text(encoding="utf-8"))
