"""A property test over the public API's arguments (hypothesis, seeded): each method called with one
argument replaced by an arbitrary value either answers (a result for every input, none silently
empty) or raises an AttnMTError subclass whose `field` is set; no TypeError, ValueError or
IndexError from inside escapes."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attn_mt

TEXT, TARGET = "a small dog sees the old man.", "ein kleiner Hund sieht den alten Mann."
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# lone surrogates (JSON's "\ud800", undecodable argv bytes): every text argument takes them as
# U+FFFD
SURROGATES = ["\ud800", "\udbff", "\udc80", "\udfff"]
TEXTS = st.text(st.one_of(st.characters(), st.sampled_from(SURROGATES)), max_size=30)
# arbitrary values: the types a caller may pass by mistake, the edges of the right types, and some
# right ones
VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 3, 10**6, 2**64, -(10**30), 1.5, 0.0, -0.5,
                     math.nan, math.inf, "", " ", "5", "x", "cross", "encoder", "▁", "\ud800",
                     "a \udcff dog.", "a\x00b", b"a dog.", bytearray(b"x"), [], [""], ["a dog."],
                     ["\ud800 dog"], [1, "a"], ("a dog.", "the cat."), {"a dog.": 1}, {"a dog."},
                     Path("/nonexistent/file.txt"), object(), "cpu", "cuda:7", "float16", "int8"]),
    st.integers(-3, 40), st.integers(), st.floats(allow_nan=True, allow_infinity=True), TEXTS,
    st.lists(TEXTS, max_size=3),
    st.builds(lambda xs: (x for x in xs), st.lists(TEXTS, max_size=3)),  # a generator
)

@functools.cache
def _maps(model: attn_mt.Model) -> attn_mt.Attention:
    """TEXT's attention maps, computed once: the weights cases fuzz `weights`' arguments."""
    return model.attention(TEXT)


CALLS = {  # name: (call with the value in one argument's place, the argument)
    "translate.texts": lambda m, v: m.translate(v),
    "translate.beam": lambda m, v: m.translate(TEXT, beam=v),
    "translate.alpha": lambda m, v: m.translate(TEXT, beam=2, alpha=v),
    "translate.batch_size": lambda m, v: m.translate([TEXT, TEXT], batch_size=v),
    "translate.max_len_a": lambda m, v: m.translate(TEXT, max_len_a=v),
    "translate.max_len_b": lambda m, v: m.translate(TEXT, max_len_b=v),
    "translate.target_prefix": lambda m, v: m.translate(TEXT, target_prefix=v),
    "translate.temperature": lambda m, v: m.translate(TEXT, temperature=v, seed=1),
    "translate.seed": lambda m, v: m.translate(TEXT, temperature=1.0, seed=v),
    "translate.return_attention": lambda m, v: m.translate(TEXT, return_attention=v),
    "translate_nbest.nbest": lambda m, v: m.translate_nbest(TEXT, beam=3, nbest=v),
    "stream.text": lambda m, v: list(m.stream(v)),
    "score.sources": lambda m, v: m.score(v, TARGET),
    "score.targets": lambda m, v: m.score(TEXT, v),
    "score.batch_size": lambda m, v: m.score([TEXT], [TARGET], batch_size=v),
    "evaluate.sources": lambda m, v: m.evaluate(v, [TARGET]),
    "evaluate.beam": lambda m, v: m.evaluate([TEXT], [TARGET], beam=v),
    "attention.text": lambda m, v: m.attention(v),
    "attention.target": lambda m, v: m.attention(TEXT, target=v),
    "weights.kind": lambda m, v: _maps(m).weights(v),
    "weights.layer": lambda m, v: _maps(m).weights("cross", layer=v),
    "weights.head": lambda m, v: _maps(m).weights("encoder", layer=1, head=v),
    "explain.text": lambda m, v: m.explain(v),
    "explain.kind": lambda m, v: m.explain(TEXT, kind=v),
    "explain.layer": lambda m, v: m.explain(TEXT, layer=v),
    "explain.head": lambda m, v: m.explain(TEXT, head=v),
    "explain.token": lambda m, v: m.explain(TEXT, token=v),
    "explain.beam": lambda m, v: m.explain(TEXT, beam=v),
    "heads.sentences": lambda m, v: m.heads([TEXT], [TARGET], sentences=v),
    "heads.refs": lambda m, v: m.heads([TEXT], v),
    "prune.n": lambda m, v: m.prune(v, [TEXT], [TARGET], sentences=1),
    "contrastive.items": lambda m, v: m.contrastive(v),
    "to.device": lambda m, v: m.to(device=v),
    "to.dtype": lambda m, v: m.to(dtype=v),
    "save.path": lambda m, v: m.save(v),
}


@pytest.fixture(scope="module")
def model(tiny_run):
    return attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")


def _not_empty(result, value) -> None:
    """An answer holds something for every text given: no silent empty result."""
    if isinstance(result, list) and not isinstance(value, str):
        return  # as many results as inputs: checked by the tests of each method
    if isinstance(result, str):
        assert result or not (isinstance(value, str) and value.strip()), "an empty translation"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_any_argument_gives_an_answer_or_an_attn_mt_error_naming_its_field(
        model, name, tmp_path_factory):
    call = CALLS[name]
    folder = tmp_path_factory.mktemp("fuzz")

    @SETTINGS
    @given(value=VALUES)
    def check(value):
        if name == "save.path" and isinstance(value, str) and value.strip():
            value = folder / Path(value).name  # never beside the test's own files
        try:
            result = call(model, value)
        except attn_mt.AttnMTError as e:
            assert e.field, f"{name}({value!r}): {type(e).__name__} without a field: {e}"
            assert "\n" not in str(e)
        else:
            _not_empty(result, value)
        finally:
            if name.startswith("to."):
                model.to("cpu", dtype="float32")

    check()


@SETTINGS
@given(device=VALUES, dtype=VALUES, threads=VALUES)
def test_load_refuses_bad_placements_naming_them(tiny_run, device, dtype, threads):
    import torch

    before = torch.get_num_threads()
    for kwargs in ({"device": device}, {"dtype": dtype}, {"threads": threads}):
        try:
            model = attn_mt.load(tiny_run / "checkpoint_best.pt", **kwargs)
        except attn_mt.AttnMTError as e:
            assert e.field in kwargs, (kwargs, e.field, str(e))
        else:
            assert model.translate(TEXT), kwargs
        finally:
            torch.set_num_threads(before)
