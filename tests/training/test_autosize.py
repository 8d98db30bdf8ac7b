"""model.size: auto: the choice as a pure function of measured speed, corpus size and budget; the
timing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attn_mt.training import autosize
from attn_mt.training.autosize import LADDER, Measured, Shape, choose, predicted_bleu

SMALLBATCH, BIG, SMALL = LADDER
CORPUS = 400_000  # target tokens of one epoch, about Multi30k's


def measured(shape: Shape, tokens_per_s: float, eval_s: float = 10.0,
             steps_per_epoch: int = 120) -> Measured:
    return Measured(shape, tokens_per_s, eval_s, steps_per_epoch)


def test_the_curves_are_measured_for_every_rung_and_rise_from_the_first_epoch():
    for shape in LADDER:
        points = autosize.CURVES[shape.name]
        assert len(points) >= 4, shape.name
        assert [e for e, _ in points] == sorted(e for e, _ in points) and points[0][0] == 1
        # the best so far: what a run tests
        assert [b for _, b in points] == sorted(b for _, b in points)


def test_predicted_bleu_interpolates_and_never_extrapolates_upwards(monkeypatch):
    monkeypatch.setitem(autosize.CURVES, "x", ((1, 10.0), (3, 30.0), (5, 34.0)))
    assert predicted_bleu("x", 0) == 0.0
    assert predicted_bleu("x", 0.5) == pytest.approx(5.0)
    assert predicted_bleu("x", 2) == pytest.approx(20.0)
    assert predicted_bleu("x", 4) == pytest.approx(32.0)
    assert predicted_bleu("x", 50) == 34.0


def test_a_slow_machine_gets_the_small_shape_and_a_fast_one_the_big(monkeypatch):
    monkeypatch.setitem(autosize.CURVES, BIG.name, ((1, 5.0), (4, 28.0), (10, 38.0)))
    monkeypatch.setitem(autosize.CURVES, SMALL.name, ((1, 8.0), (4, 27.0), (10, 33.0), (20, 34.0)))
    slow = choose([measured(BIG, 2_000), measured(SMALL, 5_000)], CORPUS, 600, warmup_steps=200)
    fast = choose([measured(BIG, 7_500), measured(SMALL, 18_000)], CORPUS, 600, warmup_steps=200)
    assert slow.shape == SMALL and fast.shape == BIG
    # the epochs count training and one evaluation per epoch: 600 s / (400k / 5000 + 10 s) for the
    # small shape
    assert slow.epochs == pytest.approx(600 / (CORPUS / 5_000 + 10))
    assert slow.steps == int(slow.epochs * 120)
    assert {row["shape"] for row in slow.table} == {BIG.name, SMALL.name}


def test_the_warmup_is_fitted_to_the_predicted_steps(monkeypatch):
    monkeypatch.setitem(autosize.CURVES, BIG.name, ((1, 5.0), (10, 38.0)))
    short = choose([measured(BIG, 1_000)], CORPUS, 600, warmup_steps=200)  # 1.4 epochs: 171 steps
    long = choose([measured(BIG, 8_000)], CORPUS, 3600, warmup_steps=200)
    assert short.warmup_steps == int(autosize.WARMUP_SHARE * short.steps) < 200
    assert long.warmup_steps == 200  # the config's warmup when the run is long enough


def test_equal_predictions_go_to_the_faster_shape(monkeypatch):
    monkeypatch.setitem(autosize.CURVES, BIG.name, ((1, 30.0),))
    monkeypatch.setitem(autosize.CURVES, SMALL.name, ((1, 30.0),))
    assert choose([measured(BIG, 2_000), measured(SMALL, 6_000)], CORPUS, 3600, 200).shape == SMALL


def test_the_set_line_reproduces_the_choice(tiny_cfg):
    cfg = tiny_cfg("model.size=auto", "train.max_minutes=10")
    choice = autosize.Choice(SMALL, steps=900, epochs=7.5, bleu=33.0, warmup_steps=135, table=())
    sized = autosize.apply(cfg, choice.shape, choice.warmup_steps)
    again = tiny_cfg("model.size=auto", "train.max_minutes=10", *choice.overrides())
    assert sized.model.size == "auto" and again.model.size == "fixed"
    assert replace(sized, model=replace(sized.model, size="fixed")) == again
    assert (again.model.d_model, again.model.n_layers, again.train.batch_tokens,
            again.train.warmup_steps) == (
        128, 3, 4096, 135)
    assert choice.to_json()["overrides"] == choice.overrides()


def test_a_users_shape_replaced_by_the_choice_is_said(tiny_cfg):
    """An explicit --set model.d_model=... or train.warmup_steps under model.size: auto used to be
    replaced by the ladder's choice without a word; the log now names each value it replaces and how
    to keep them."""
    cfg = tiny_cfg("model.size=auto", "train.max_minutes=10", "model.d_model=48",
                   "train.warmup_steps=77")
    choice = autosize.Choice(SMALL, steps=900, epochs=7.5, bleu=33.0, warmup_steps=135, table=())
    line = autosize.replaced(cfg, choice)
    assert "model.d_model=48 (now 128)" in line and "train.warmup_steps=77 (now 135)" in line
    # the tiny config's 2 heads, the rung's 4
    assert "set model.size=fixed" in line and "n_heads" in line
    same = tiny_cfg("model.size=auto", "train.max_minutes=10", *choice.overrides()[1:])
    assert autosize.replaced(same, choice) == ""


def test_auto_sizes_only_a_clock_budget(tiny_cfg):
    assert autosize.wanted(tiny_cfg("model.size=auto", "train.max_minutes=10"))
    assert not autosize.wanted(tiny_cfg("model.size=auto", "train.max_minutes=0",
                                        "train.max_steps=100"))
    assert not autosize.wanted(tiny_cfg("train.max_minutes=10"))


def test_measure_times_each_shape_on_the_corpus_within_its_share(tiny_cfg):
    from attn_mt.data.corpus import load_corpus

    cfg = tiny_cfg("model.size=auto", "train.max_minutes=10")
    corpus = load_corpus(cfg, cfg.model.max_positions)
    ladder = (Shape("a", 32, 2, 1, 64, 600), Shape("b", 16, 2, 1, 32, 300))
    import torch

    from attn_mt.models import build_model, count_params

    out = autosize.measure(cfg, corpus, autosize.sizes(cfg, corpus), torch.device("cpu"), "fp32",
                           ladder)
    assert [m.shape for m in out] == list(ladder)
    shaped = [autosize.apply(cfg, s, cfg.train.warmup_steps).model for s in ladder]
    assert [m.params for m in out] == [count_params(build_model(c, **corpus.tok.sizes()))
                                       for c in shaped]
    train = corpus.lengths(cfg.data.splits.train)
    assert ([m.steps_per_epoch for m in out]
            == [len(autosize.token_batches(*train, s.batch_tokens, cfg.train.seed, 0))
                for s in ladder])
    # half the tokens per batch: more batches
    assert out[1].steps_per_epoch > out[0].steps_per_epoch
    # eval_s: the translation's time and the loss's
    valid_tokens = sum(corpus.lengths(cfg.data.splits.valid)[1])
    assert all(m.tokens_per_s > 0 and m.eval_s > valid_tokens / (3 * m.tokens_per_s) for m in out)


def test_measure_times_each_batch_after_its_first_sight(tiny_cfg, monkeypatch):
    """bf16 kernels are slow the first time they meet a shape: that first pass is not what a long
    run trains at. A first sight here costs 100 s on the clock the Stopwatch reads (no real
    wait)."""
    import time
    from types import SimpleNamespace

    import torch

    from attn_mt.data.corpus import load_corpus
    from attn_mt.training.trainer import TrainStep

    cfg = tiny_cfg("model.size=auto", "train.max_minutes=10")
    corpus = load_corpus(cfg, cfg.model.max_positions)
    seen, real, late = set(), TrainStep.backward, [0.0]

    def slow_at_first_sight(self, batches, n_tokens):
        key = id(batches[0])
        if key not in seen:
            seen.add(key)
            late[0] += 100.0
        return real(self, batches, n_tokens)

    monkeypatch.setattr(TrainStep, "backward", slow_at_first_sight)
    import attn_mt.device  # the Stopwatch's clock

    monkeypatch.setattr(attn_mt.device, "time",
                        SimpleNamespace(perf_counter=lambda: time.perf_counter() + late[0]))
    (m,) = autosize.measure(cfg, corpus, autosize.sizes(cfg, corpus), torch.device("cpu"), "fp32",
                            (Shape("a", 32, 2, 1, 64, 600),), steps=3)
    assert len(seen) == 3  # three batches, each met once untimed
    tokens = sum(b.n_tokens for b in corpus.batches(cfg.data.splits.train, autosize.token_batches(
        *corpus.lengths(cfg.data.splits.train), 600, cfg.train.seed, 0)[:3]))
    assert m.tokens_per_s > tokens / 100  # the timed pass took less than one first sight


TINY_LADDER = (Shape("t32", 32, 2, 1, 64, 600), Shape("t16", 16, 2, 1, 32, 300))


@pytest.mark.slow
def test_an_auto_sized_run_says_what_it_measured_and_chose_and_resumes_with_that_shape(
        tiny_cfg, tmp_path, monkeypatch, caplog):
    """A real short budget run on the toy corpus, with a two-rung ladder of tiny shapes whose curves
    favour the bigger one once it gets a few epochs."""
    import json
    import logging

    from attn_mt import checkpoint
    from attn_mt.training.run import train

    monkeypatch.setattr(autosize, "LADDER", TINY_LADDER)
    monkeypatch.setitem(autosize.CURVES, "t32", ((1, 5.0), (2, 40.0)))
    monkeypatch.setitem(autosize.CURVES, "t16", ((1, 10.0), (2, 20.0)))
    from attn_mt.config import load_config
    from attn_mt.rundir import RunDir

    written, write_config = [], RunDir.write_config
    monkeypatch.setattr(RunDir, "write_config", lambda self,
                        c: (written.append(c), write_config(self, c)))
    cfg = tiny_cfg("model.size=auto", "train.max_minutes=1", "train.max_epochs=2",
                   "train.warmup_steps=50")
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        train(cfg, tmp_path)
    # config.yaml written once, with the chosen shape
    assert len(written) == 1 and written[0].model.d_model == 32
    assert load_config(tmp_path / "config.yaml").train.batch_tokens == 600
    size = json.loads((tmp_path / "results.json").read_text())["size"]
    assert ({row["shape"] for row in size["candidates"]} == {"t32", "t16"}
            and size["chosen"] == "t32")
    # the ladder's share of the budget (plus one shape's overrun)
    assert size["measure_s"] <= 0.05 * 60 + 2
    assert size["overrides"] == ["model.size=fixed", "model.d_model=32", "model.n_heads=2",
                                 "model.n_layers=1", "model.d_ff=64", "train.batch_tokens=600",
                                 f"train.warmup_steps={size['warmup_steps']}"]
    assert size["warmup_steps"] <= 50
    assert any("size: chose t32" in r.getMessage() and "overrides model.size=fixed model.d_model=32"
               in r.getMessage() for r in caplog.records)
    saved = checkpoint.load(tmp_path / "checkpoint_last.pt")["config"]
    assert ((saved["model"]["size"], saved["model"]["d_model"], saved["train"]["batch_tokens"])
            == ("auto", 32, 600))
    steps = checkpoint.load(tmp_path / "checkpoint_last.pt")["step"]
    # --resume with one more epoch trains it with the chosen shape (nothing is measured again)
    monkeypatch.setattr(autosize, "measure", lambda *a,
                        **k: pytest.fail("measured again on --resume"))
    train(tiny_cfg("model.size=auto", "train.max_minutes=1", "train.max_epochs=3",
                   "train.warmup_steps=50"),
          tmp_path, resume=True)
    again = checkpoint.load(tmp_path / "checkpoint_last.pt")
    assert (again["config"]["model"]["d_model"] == 32 and again["epoch"] == 3
            and again["step"] > steps)
    assert json.loads((tmp_path / "results.json").read_text())["size"]["chosen"] == "t32"


def test_auto_for_an_rnn_is_an_unknown_key():
    from attn_mt.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="unknown key 'model.size'"):
        load_config(None, ["model.kind=rnn", "model.size=auto", "train.max_minutes=1"])


def test_the_measured_curves_pick_the_big_model_here_and_the_small_one_on_a_slower_machine():
    """With the shipped curves (the speedrun's recipe): at about 2-core bf16 speeds the 7.6M model,
    4 epochs in 10 minutes, beats the small one's 11; where it gets under 1.5 epochs and the small
    one 4 (one fp32 thread of a slow CPU) the small one wins; and in a 2-minute budget the big one
    again, as the small one spends its first epochs warming up (1.2 BLEU after one)."""
    here = [measured(SMALLBATCH, 3_000, 15, 474), measured(BIG, 3_200, 14, 237),
            measured(SMALL, 8_000, 6, 120)]
    slow = [measured(SMALLBATCH, 1_000, 30, 474), measured(BIG, 1_050, 28, 237),
            measured(SMALL, 3_000, 10, 120)]
    assert choose(here, CORPUS, 600, 200).shape == SMALLBATCH
    assert choose(slow, CORPUS, 600, 200).shape == SMALL
    assert choose(here, CORPUS, 120, 200).shape == SMALLBATCH


def test_the_choice_follows_the_curves_between_two_batch_sizes_of_the_big_model():
    """After 2 epochs the 2048-token curve is level with the 1024-token one, after 1 it is 3.4
    below: at about one epoch's speed the 1024-token batches win, and at equal speed past 3 epochs
    they are level (38.96 against 38.79 at 3.87 epochs), so the one that trains more tokens in the
    budget wins."""
    one_epoch = [measured(SMALLBATCH, 800, 15, 474), measured(BIG, 800, 15, 237)]
    assert choose(one_epoch, CORPUS, 600, 200).shape == SMALLBATCH
    three_epochs = [measured(SMALLBATCH, 2_000, 15, 474), measured(BIG, 2_300, 15, 237)]
    choice = choose(three_epochs, CORPUS, 600, 200)
    assert choice.shape == BIG and 3.0 < choice.epochs < 3.87


@pytest.mark.slow
def test_a_budget_run_killed_after_its_ladder_can_be_started_again(tiny_cfg, tmp_path, monkeypatch):
    """Killed between the ladder (size.json written) and the first checkpoint: a fresh run into the
    same folder, without --overwrite, trains (it was refused as 'an earlier run ... size.json')."""
    import json

    from attn_mt.training import run, variants

    monkeypatch.setattr(autosize, "LADDER", TINY_LADDER)
    monkeypatch.setitem(autosize.CURVES, "t32", ((1, 5.0), (2, 40.0)))
    monkeypatch.setitem(autosize.CURVES, "t16", ((1, 10.0), (2, 20.0)))
    cfg = tiny_cfg("model.size=auto", "train.max_minutes=1", "train.max_epochs=1")
    real = variants.build_model

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(variants, "build_model", killed)
    with pytest.raises(KeyboardInterrupt):
        run.train(cfg, tmp_path)
    assert (tmp_path / "size.json").exists() and not list(tmp_path.glob("checkpoint_*.pt"))
    monkeypatch.setattr(variants, "build_model", real)
    run.train(cfg, tmp_path)
    assert ((tmp_path / "checkpoint_last.pt").exists()
            and json.loads((tmp_path / "size.json").read_text()))
