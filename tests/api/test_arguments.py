"""The API's arguments checked at the door (attn_mt/data/checks.py): any iterable of strings works,
and every bad value is an AttnMTError subclass naming its argument (`field`), never a TypeError from
inside."""

from __future__ import annotations

from pathlib import Path

import pytest

import attn_mt

TEXTS = ["a small dog sees the old man.", "yesterday the children find the red ball."]


@pytest.fixture(scope="module")
def model(tiny_run):
    return attn_mt.load(tiny_run / "checkpoint_best.pt", device="cpu")


def test_any_iterable_of_strings_translates_and_scores_like_a_list(model):
    expected = model.translate(TEXTS)
    assert len(expected) == 2 and all(expected)
    # a generator is read once, not consumed by a check
    assert model.translate(t for t in TEXTS) == expected
    assert model.translate(tuple(TEXTS)) == expected
    assert model.translate(iter(TEXTS)) == expected
    refs = ["ein Hund.", "die Kinder."]
    scores = model.score(TEXTS, refs)
    assert model.score((t for t in TEXTS), (r for r in refs)) == scores
    assert model.evaluate(iter(TEXTS), tuple(refs)) == model.evaluate(TEXTS, refs)


@pytest.mark.parametrize("call,field", [
    (lambda m: m.translate({"a dog.": 1}), "texts"),  # a dict: not its keys
    (lambda m: m.translate(["a dog.", 5]), "texts"),
    (lambda m: m.translate(None), "texts"),
    (lambda m: m.translate(5), "texts"),
    (lambda m: m.translate(b"a dog."), "texts"),
    (lambda m: m.translate("a", beam=1.5), "beam"),
    (lambda m: m.translate("a", beam="5"), "beam"),
    (lambda m: m.translate("a", beam=True), "beam"),
    (lambda m: m.translate("a", alpha="x"), "alpha"),
    (lambda m: m.translate("a", alpha=float("nan")), "alpha"),
    (lambda m: m.translate("a", batch_size=0), "batch_size"),
    (lambda m: m.translate("a", max_len_a="2"), "max_len_a"),
    (lambda m: m.translate("a", temperature=0), "temperature"),
    (lambda m: m.translate("a", seed=3), "seed"),
    # was torch's bare ValueError
    (lambda m: m.translate("a", temperature=1.0, seed=2**64), "seed"),
    (lambda m: m.translate("a", temperature=1.0, seed=-1), "seed"),
    (lambda m: m.translate("a", temperature=1.0, seed=True), "seed"),
    (lambda m: m.translate(TEXTS, target_prefix=["ein"]), "target_prefix"),
    # was NaN in softmax
    (lambda m: m.translate("a", temperature=1e300, target_prefix="ein"), "temperature"),
    (lambda m: m.translate("a", temperature=float("inf")), "temperature"),
    # was KeyError: a setting names leaves out keeps its name
    (lambda m: m.options(beam=0, names={}), "beam"),
    (lambda m: m.options(beam=2, names=5), "names"),  # was TypeError
    (lambda m: m.options(beam=2, names=None), "names"),
    (lambda m: m.options(names={"beam_size": 3}), "names"),
    (lambda m: m.options(names={"beams": "--beam"}), "names"),
    (lambda m: m.translate("a", return_attention="yes"), "return_attention"),  # was taken as True
    (lambda m: m.translate("a", return_attention=1), "return_attention"),
    (lambda m: m.translate_nbest("a", nbest="2"), "nbest"),
    (lambda m: m.score(1, "x"), "sources"),
    (lambda m: m.score("a", 1), "targets"),
    (lambda m: m.score("a", ["x"]), "targets"),
    (lambda m: m.score("a", "x", batch_size=0), "batch_size"),
    (lambda m: m.evaluate(["a"], ["x"], beam="x"), "beam"),
    (lambda m: m.evaluate([], []), "sources"),
    (lambda m: m.evaluate(["a", "b"], ["x"]), "refs"),
    (lambda m: m.evaluate(Path("/nonexistent/test.en"), ["x"]), "sources"),
    (lambda m: m.attention(["a", "b"]), "text"),
    (lambda m: m.attention(""), "text"),
    (lambda m: m.attention("a dog.", target=3), "target"),
    (lambda m: m.explain("a dog.", layer="1"), "layer"),
    (lambda m: m.explain("a dog.", layer=1.0), "layer"),
    (lambda m: m.explain("a dog.", head=None), "head"),
    (lambda m: m.explain("a dog.", kind=None), "kind"),
    (lambda m: m.explain("a dog.", token=None), "token"),
    (lambda m: m.explain("a dog.", beam=0), "beam"),
    (lambda m: m.explain(None), "text"),
    (lambda m: m.heads(["a"], ["b"], sentences=0), "sentences"),
    (lambda m: m.heads(["a"], None), "refs"),
    (lambda m: m.prune(1.5, ["a"], ["b"]), "n"),
    (lambda m: m.prune(1, ["a"], ["b"], out="pruned.txt"), "out"),
    (lambda m: m.contrastive([1, 2]), "contrastive"),
    (lambda m: m.to(device="gpu"), "device"),
    (lambda m: m.to(dtype="float64"), "dtype"),
    (lambda m: m.save(3), "path"),
    (lambda m: m.save("\ud800.pt"), "path"),  # was UnicodeEncodeError from open()
    # was ValueError: embedded null byte
    (lambda m: m.prune(1, ["a"], ["b"], out="a\x00.pt"), "out"),
])
def test_every_bad_argument_is_an_attn_mt_error_naming_it(model, call, field):
    with pytest.raises(attn_mt.AttnMTError) as e:
        call(model)
    assert e.value.field == field, (e.value.field, str(e.value))
    assert "\n" not in str(e.value)


def test_lone_surrogates_in_every_text_argument_are_u_fffd(model):
    """As in the source text: "\ud800" is U+FFFD in a target prefix, a target, the references (was
    pybind's 'Unable to cast Python instance' RuntimeError from SentencePiece), and in what comes
    back."""
    src = TEXTS[0]
    for call in (lambda t: model.translate(src, target_prefix=t),
                 lambda t: model.translate_nbest(src, target_prefix=t),
                 lambda t: list(model.stream(src, target_prefix=t)), lambda t: model.score(src, t),
                 lambda t: model.attention(src, target=t).weights("cross"),
                 lambda t: model.heads([src], [t], sentences=1).heads):
        assert str(call("A \ud800 Hund")) == str(call("A \ufffd Hund"))
    assert model.attention("a \udfff dog.").source == "a \ufffd dog."
    assert (model.explain("a \udc80 dog.").source_tokens
            == model.explain("a \ufffd dog.").source_tokens)


@pytest.mark.parametrize("call,field", [
    # each was a TypeError (or taken as True) before any work
    (lambda: attn_mt.average(5, "x.pt"), "paths"),
    (lambda: attn_mt.average("a.pt", "x.pt"), "paths"),
    (lambda: attn_mt.average(["a.pt", None], "x.pt"), "paths"),
    (lambda: attn_mt.average(["a.pt"], {}), "out"),
    (lambda: attn_mt.average(["a.pt", "b.pt"], "x.pt", force="yes"), "force"),
    (lambda: attn_mt.download(5), "dataset"),
    (lambda: attn_mt.download("multi30k", None), "out"),
    (lambda: attn_mt.export_model(None, "out"), "checkpoint"),
    (lambda: attn_mt.prepare(None, 5), "overrides"),
    (lambda: attn_mt.compare_rnn(None), "config"),
    (lambda: attn_mt.compare_rnn("x.yaml", quick="yes"), "quick"),
    (lambda: attn_mt.bench(None, repeats="x"), "repeats"),
    (lambda: attn_mt.bench(None, steps=True), "steps"),
    (lambda: attn_mt.bench(None, compile="yes"), "compile"),
    (lambda: attn_mt.train(None, 5), "out"),
    (lambda: attn_mt.train(None, "runs/x", resume=1), "resume"),
    (lambda: attn_mt.configure(None, [5]), "overrides"),
    (lambda: attn_mt.Run(None), "dir"),
    (lambda: attn_mt.Limits(max_texts="x"), "max_texts"),
])
def test_the_other_public_functions_check_their_arguments(call, field):
    with pytest.raises(attn_mt.AttnMTError) as e:
        call()
    assert e.value.field == field, (e.value.field, str(e.value))
    assert "\n" not in str(e.value)


def test_load_config_and_output_errors_name_their_field(tmp_path):
    for call, field in [(lambda: attn_mt.load(tmp_path / "missing.pt"), "path"),
                        (lambda: attn_mt.load(None), "path"),
                        (lambda: attn_mt.load(tmp_path / "missing.pt", device="tpu"), "device"),
                        (lambda: attn_mt.load(tmp_path / "missing.pt", threads=0), "threads"),
                        (lambda: attn_mt.load(tmp_path / "missing.pt", dtype="int8"), "dtype"),
                        (lambda: attn_mt.configure(None, ["train.lrr=1"]), "train.lrr"),
                        (lambda: attn_mt.configure(None, ["decode.beam_size=0"]),
                         "decode.beam_size"),
                        (lambda: attn_mt.configure(tmp_path / "nope.yaml"), "config")]:
        with pytest.raises(attn_mt.AttnMTError) as e:
            call()
        assert e.value.field == field, (field, str(e.value))
    with pytest.raises(attn_mt.ModelError) as e:
        attn_mt.load(tmp_path / "missing.pt")
    # named once, not twice
    assert str(e.value) == f"{tmp_path / 'missing.pt'}: checkpoint not found"


def test_attention_weights_arguments_and_all_layers(model):
    att = model.attention(TEXTS[0])
    every = att.weights("cross")
    assert (every.shape[0] == att.layers["cross"]
            and (every[0] == att.weights("cross", layer=1)).all())
    for kwargs, field in [({"layer": "1"}, "layer"), ({"layer": 0}, "layer"),
                          ({"head": 1.0}, "head"), ({"head": 9}, "head"),
                          ({"kind": "self"}, "kind"), ({"kind": None}, "kind")]:
        with pytest.raises(attn_mt.InputError) as e:
            att.weights(**{"kind": "cross", **kwargs})
        assert e.value.field == field


def test_attention_for_a_given_target_is_teacher_forced_on_it(model):
    target = "der alte Hund sieht den Mann."
    att = model.attention(TEXTS[0], target=target)
    tok = model.tokenizer
    ids = tok.encode_tgt([target])[0]
    assert (att.target_tokens == tok.tgt_pieces([*ids, tok.eos_id])
            and att.translation == tok.decode_tgt([ids])[0])
    assert att.weights("cross", layer=1).shape[1:] == (len(ids) + 1, len(att.source_tokens))
    assert att.target_tokens == model.score(TEXTS[0], target).tokens  # the pieces `score` reads
    # the first query reads only <s>: its row is the same whatever follows
    free = model.attention(TEXTS[0])
    assert (att.weights("cross")[..., 0, :] == free.weights("cross")[..., 0, :]).all()
    assert not (att.weights("cross")[..., 1, :] == free.weights("cross")[..., 1, :]).all()


def test_return_attention_gives_an_attention_per_text_with_the_translation(model):
    atts = model.translate(t for t in TEXTS)
    with_maps = model.translate(TEXTS, return_attention=True)
    assert [a.translation for a in with_maps] == atts
    one = model.translate(TEXTS[0], return_attention=True)
    assert isinstance(one, attn_mt.Attention) and one.translation == atts[0]
    with pytest.raises(attn_mt.InputError) as e:
        model.translate(["a dog.", " "], return_attention=True)
    assert e.value.field == "texts"


def test_a_command_gets_a_keyword_for_each_decode_option_its_call_takes():
    import inspect

    from attn_mt.api.arguments import with_decode_options
    from attn_mt.config.decode import taking

    @with_decode_options("stream", lambda o: f"<{o.key}>")
    def command(text: str, *, loud: bool = False, options: dict | None = None) -> tuple:
        return text, loud, options

    params = inspect.signature(command).parameters
    rows = taking("stream")
    assert list(params) == ["text", "loud", *(o.arg for o in rows)]
    assert all(params[o.arg].annotation == f"<{o.key}>" and params[o.arg].default is None
               for o in rows)
    first = rows[0].arg
    assert command(text="x", loud=True, **{first: 3}) == ("x", True, {o.arg: None for o in rows}
                                                          | {first: 3})
