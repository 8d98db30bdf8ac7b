"""The attention history (analysis/history.py): a run records it at step 0 and every evaluation
without changing a trained weight, a killed and resumed run ends with the history of one never
killed, the probes stay those of the file, the RNN records its one cross-attention, a damaged file
is one line naming it, and the summaries read a History."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import TINY

import attn_mt
from attn_mt import checkpoint
from attn_mt.analysis import history as history_mod
from attn_mt.analysis.history import (
    MAX_LEN,
    History,
    Probe,
    from_arrays,
    load_history,
    module_shape,
    save_history,
    to_arrays,
)
from attn_mt.analysis.roles import ROLES
from attn_mt.config import load_config, to_dict
from attn_mt.config.changes import config_changes
from attn_mt.errors import InputError
from attn_mt.rundir import RunDir

# step 0 and three evaluations (steps 2, 4, 6); dropout on, so a recorder that drew a random number
# would change the weights; no warmup and a high rate, so that the attention sharpens from uniform
# within six steps
RUN = (*TINY, "train.max_steps=6", "train.eval_every=2", "train.bleu_sentences=5",
       "model.dropout=0.1", "decode.beam_size=1", "train.warmup_steps=1", "train.lr=1e-2")
RNN = [o for o in RUN if not o.startswith("model.")] + ["model.kind=rnn", "model.d_embed=16",
                                                        "model.d_hidden=16", "model.d_attn=16",
                                                        "train.max_steps=4"]


class Killed(BaseException):
    """Stands in for SIGKILL: nothing in `train` catches it."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run that records its attention (the default), trained once for the module."""
    out = tmp_path_factory.mktemp("recorded") / "run"
    attn_mt.train(None, out, overrides=list(RUN), quiet=True)
    return out


def assert_same_history(a: History, b: History) -> None:
    assert ((a.model_kind, a.steps, a.modules, a.n_heads, a.probes, a.bleu, a.contrastive, a.items)
            == (b.model_kind, b.steps, b.modules, b.n_heads, b.probes, b.bleu, b.contrastive,
                b.items))
    for name, x in to_arrays(a).items():
        assert np.array_equal(x, to_arrays(b)[name], equal_nan=x.dtype.kind == "f"), name


def test_recording_changes_no_trained_weight_and_records_step_0_and_every_evaluation(
        recorded, tmp_path):
    plain = tmp_path / "plain"
    attn_mt.train(None, plain, overrides=[*RUN, "train.record_attention=false"], quiet=True)
    assert not RunDir(plain).history.exists()
    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        a, b = checkpoint.load(recorded / name), checkpoint.load(plain / name)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    h = attn_mt.history(recorded)
    metrics = attn_mt.Run(recorded).metrics
    assert (h.model_kind == "transformer" and h.steps == [0, *(m["step"] for m in metrics)]
            == [0, 2, 4, 6])
    # step 0: the untrained model, no BLEU
    assert h.bleu == [None, *(m["valid_bleu"] for m in metrics)]
    assert h.modules == ["encoder 1 self", "decoder 1 self", "decoder 1 cross"] and h.n_heads == 2
    # an English source, a German target: the classic sentence's two forms
    kinds = [p.kind for p in h.probes]
    assert (kinds[-2:] == ["classic", "classic"] and "tired" in h.probes[-2].source
            and "wide" in h.probes[-1].source)
    assert 1 <= kinds.count("valid") <= 4 and h.coref is None and h.contrastive == [None] * 4
    for p, probe in enumerate(h.probes):
        assert probe.src_tokens[-1] == "</s>" and probe.tgt_tokens[0] == "<s>"
        assert probe.kind != "valid" or max(len(probe.src_tokens), len(probe.tgt_tokens)) <= MAX_LEN
        for a, name in enumerate(h.modules):
            m = h.maps[p][a]
            assert m.dtype == np.float16 and m.shape == (4, 2, *module_shape(name, probe))
            # every query's weights sum to 1
            assert np.allclose(m.astype(np.float32).sum(-1), 1.0, atol=2e-2)
            if name == "decoder 1 self":
                assert not np.triu(m[-1, 0], 1).any()  # no weight on the future
    assert h.entropy.shape == (4, 3, 2) and np.all((h.entropy > 0.3) & (h.entropy <= 1.0 + 1e-5))
    # (E,): the untrained model's attention is near uniform, and sharpens
    mean = h.entropy.mean((1, 2))
    assert mean[0] > 0.8 and mean[0] > mean[-1]
    assert set(h.roles) == set(ROLES) and all(v.shape == (4, 3, 2) for v in h.roles.values())
    # self-attention only
    assert np.isnan(h.roles["next"][:, 1:]).all() and np.isfinite(h.roles["next"][:, 0]).all()
    # cross only
    assert np.isnan(h.roles["mono"][:, :2]).all() and np.isfinite(h.roles["mono"][:, 2]).all()


def test_a_killed_run_resumes_to_the_same_history_with_the_files_probes(
        recorded, tmp_path, monkeypatch):
    """Killed while writing checkpoint_last.pt of step 4: the history holds step 4, the checkpoint
    is step 2's. The resumed run drops the record of step 4, records it again, keeps step 0's (one),
    and never chooses its probes anew."""
    real = checkpoint.save

    def save(state, path):
        if path.name == "checkpoint_last.pt" and state["step"] == 4:
            raise Killed
        real(state, path)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as mp:
        mp.setattr(checkpoint, "save", save)
        with pytest.raises(Killed):
            attn_mt.train(None, run_dir, overrides=list(RUN), quiet=True)
    assert (load_history(run_dir).steps == [0, 2, 4]
            and checkpoint.load(run_dir / "checkpoint_last.pt")["step"] == 2)
    monkeypatch.setattr(history_mod, "choose_probes",
                        lambda *a: pytest.fail("probes chosen again on resume"))
    rewind, rewound = history_mod.Recorder.rewind, []

    def rewind_and_look(self, *args):
        rewind(self, *args)
        rewound.append(load_history(run_dir).steps)

    monkeypatch.setattr(history_mod.Recorder, "rewind", rewind_and_look)
    attn_mt.train(None, run_dir, overrides=list(RUN), resume=True, quiet=True)
    # as metrics.jsonl: the record after the checkpoint is gone before training goes on
    assert rewound == [[0, 2]]
    assert load_history(run_dir).steps == [0, 2, 4, 6]  # step 0 kept, not recorded again
    assert_same_history(load_history(run_dir), load_history(recorded))


def test_the_rnn_records_its_one_cross_attention(tmp_path):
    attn_mt.train(None, tmp_path, overrides=RNN, quiet=True)
    h = attn_mt.history(tmp_path)
    assert (h.model_kind, h.modules, h.n_heads, h.steps) == ("rnn", ["decoder cross"], 1, [0, 2, 4])
    for p, m in zip(h.probes, h.maps, strict=True):
        assert m[0].shape == (3, 1, len(p.tgt_tokens), len(p.src_tokens))
    assert np.isfinite(h.roles["mono"]).all() and np.isnan(h.roles["same"]).all()


def test_a_run_without_probes_trains_and_records_nothing(tmp_path, monkeypatch):
    # Multi30k cut to a 300-piece vocabulary has no validation pair of MAX_LEN pieces, a German
    # source no classic pair
    monkeypatch.setattr(history_mod, "choose_probes", lambda corpus, cfg: ([], []))
    attn_mt.train(None, tmp_path, overrides=[*RUN, "train.max_steps=2"], quiet=True)
    assert RunDir(tmp_path).state() == "finished" and not RunDir(tmp_path).history.exists()


def hand_built(coref: bool = True) -> History:
    """Three evaluations, two modules of two heads: head (0, 1) turns into a prev-token head at step
    20 and stays one, head (1, 0) resolves the items from step 30; the entropy leaves uniform at
    step 20."""
    e, a, h = 3, 2, 2
    roles = {r: np.full((e, a, h), 0.1, np.float32) for r in ROLES}
    roles["prev"][:, 0, 1] = [0.6, 0.2, 0.7]  # held at step 10, lost, held again from step 30
    roles["eos"][:, 1, 1] = [0.1, 0.9, 0.95]
    roles["next"][:, 1] = np.nan  # does not apply
    resolved = np.zeros((e, a, h), np.float32)
    resolved[:, 1, 0] = [0.5, 0.7, 0.9]
    resolved[:, 0, 0] = [0.85, 0.6, 0.6]
    probe = Probe("valid", "a b", "x y", ["▁a", "▁b", "</s>"], ["<s>", "▁x", "▁y"])
    maps = [[np.zeros((e, h, *module_shape(m, probe)), np.float16)
             for m in ("encoder 1 self", "decoder 1 cross")]]
    return History("transformer", [10, 20, 30], ["encoder 1 self", "decoder 1 cross"], h, roles,
                   np.array([[[0.99] * h] * a, [[0.8] * h] * a, [[0.5] * h] * a], np.float32),
                   resolved if coref else None, [0.5, 0.6, 0.75] if coref else [None] * 3,
                   [1.0, None, 3.5], [probe], maps)


def test_the_summaries_of_a_hand_built_history():
    h = hand_built()
    steps = h.role_step(0.5)
    assert steps[0, 1] == ("prev", 30) and steps[1, 1] == ("eos", 20) and steps[0, 0] is None
    # every role held from the start; the largest is the dominant one
    assert h.role_step(0.05)[0, 0][1] == 10
    assert (h.coref_step(0.8) == (1, 0, 30) and h.coref_step(0.65) == (1, 0, 20)
            and h.coref_step(0.95) is None)
    assert hand_built(coref=False).coref_step() is None
    assert h.uniform_step(0.1) == 20 and h.uniform_step(0.4) == 30 and h.uniform_step(0.6) is None


def test_a_history_file_round_trips_and_a_damaged_one_is_one_line_naming_it(tmp_path):
    h = hand_built()
    save_history(h, RunDir(tmp_path))
    path = RunDir(tmp_path).history
    assert_same_history(load_history(tmp_path), h)
    assert_same_history(load_history(path), h)  # the file itself
    data = path.read_bytes()
    arrays = to_arrays(h)
    wrong = {**arrays, "map_0_1": np.zeros((3, 2, 3, 2), np.float16)}  # cross must be T x S = 3 x 3
    for name, damage in [("truncated", data[: len(data) // 2]),
                         ("garbage", b"\x80\x04 not a history"),
                         ("wrong shape", lambda f: np.savez(f, **wrong)), (
                             "no map", lambda f: np.savez(
                                 f, **{k: v for k, v in arrays.items() if k != "map_0_0"})),
                         ("pickled", lambda f: np.savez(
                             f, **{**arrays, "meta": np.array([{}], dtype=object)}))]:
        if callable(damage):
            buf = io.BytesIO()
            damage(buf)
            damage = buf.getvalue()
        path.write_bytes(damage)
        with pytest.raises(InputError) as e:
            attn_mt.history(tmp_path)
        assert str(path) in str(e.value) and len(str(e.value).splitlines()) == 1, name
    path.unlink()
    with pytest.raises(InputError, match="not found"):
        attn_mt.history(tmp_path)


def test_the_hour_configs_history_stays_under_5_mb():
    """configs/multi30k.yaml at its worst (the module docstring): step 0 and 100 evaluations
    (max_epochs), 9 modules of 4 heads, 4 validation probes of MAX_LEN pieces a side."""
    e, names = 101, [f"{s} {i} {w}" for s, w in (("encoder", "self"), ("decoder", "self"),
                                                 ("decoder", "cross"))
                     for i in (1, 2, 3)]
    probe = Probe("valid", "Ein brauner Hund rennt dem schwarzen Hund hinterher.",
                  "A brown dog is running after the black dog.", ["▁Hund"] * MAX_LEN,
                  ["▁black"] * MAX_LEN)
    h = History("transformer", list(range(e)), names, 4, {r: np.zeros((e, 9, 4), np.float32)
                                                          for r in ROLES},
                np.zeros((e, 9, 4), np.float32), None, [None] * e, [0.0] * e, [probe] * 4,
                [[np.zeros((e, 4, MAX_LEN, MAX_LEN), np.float16) for _ in names] for _ in range(4)])
    buf = io.BytesIO()
    np.savez(buf, **to_arrays(h))
    # the maps, roles and entropy; the rest
    assert 4_319_568 < len(buf.getvalue()) <= 4_359_568 < 5_000_000
    assert (from_arrays(dict(np.load(io.BytesIO(buf.getvalue()), allow_pickle=False))).steps
            == h.steps)


def test_recording_may_be_switched_on_resume_and_is_on_by_default():
    on, off = load_config(None, list(TINY)), load_config(None,
                                                         [*TINY, "train.record_attention=false"])
    assert on.train.record_attention and not off.train.record_attention
    assert config_changes(to_dict(on), to_dict(off)) == []  # a resumed run may change it
    with pytest.raises(attn_mt.ConfigError, match="record_attention"):
        load_config(None, [*TINY, "train.record_attention=3"])
