import json
import logging

import pytest
import torch
from conftest import SHORT

from attn_mt import checkpoint
from attn_mt.device import rng_state
from attn_mt.models import build_model
from attn_mt.rundir import RunDir
from attn_mt.training import compiled
from attn_mt.training.evaluation import checkpoint_state
from attn_mt.training.run import train
from attn_mt.training.start import setup


def test_run_directory_contents(tiny_run):
    names = {p.name for p in tiny_run.iterdir()}
    assert {"config.yaml", "spm.model", "checkpoint_best.pt", "checkpoint_last.pt", "metrics.jsonl",
            "results.json"} <= names
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    for key in ("step", "epoch", "train_loss", "valid_loss", "valid_bleu", "lr", "tokens_per_s",
                "elapsed_s"):
        assert key in records[0]
    assert records[1]["valid_loss"] < records[0]["valid_loss"]
    results = json.loads((tiny_run / "results.json").read_text())
    for key in ("test_bleu", "test_chrf", "sacrebleu_signature", "train_seconds", "params",
                "device"):
        assert key in results
    assert results["sacrebleu_signature"].startswith("nrefs:1|case:mixed")


@pytest.mark.slow
def test_overfits_a_few_sentences(tiny_cfg, tmp_path):
    """Eight sentences, many epochs: the model learns them by heart."""
    cfg = tiny_cfg("data.toy_size=10", "train.max_epochs=100", "train.eval_every=25",
                   "train.warmup_steps=30", "train.lr=5e-3", "train.batch_tokens=400",
                   "model.d_model=64", "model.d_ff=128", "train.label_smoothing=0",
                   "train.bleu_sentences=10", "tokenizer.vocab_size=64")
    train(cfg, tmp_path)
    first, *_, last = [json.loads(line)
                       for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert last["train_loss"] < 0.1 and first["train_loss"] > 1.0, (first, last)


def test_a_run_shorter_than_a_log_window_records_its_loss_and_speed(tiny_cfg, tmp_path):
    """An evaluation before the first progress report still records a finite train_loss and
    tokens/s."""
    train(tiny_cfg("train.max_steps=3", "train.eval_every=3", "train.log_every=1000"), tmp_path)
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert 0 < record["train_loss"] < 100 and record["tokens_per_s"] > 0, record


@pytest.mark.slow
def test_max_steps_and_accumulation(tiny_cfg, tmp_path):
    train(tiny_cfg("train.max_steps=7", "train.accum_steps=2"), tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 7
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    assert state["step"] == 7


@pytest.mark.slow
def test_linear_schedule_ends_near_zero(tiny_cfg, tmp_path):
    train(tiny_cfg("train.max_steps=8", "train.eval_every=4", "train.warmup_steps=2",
                   "train.lr=1e-3", "train.schedule=linear"), tmp_path)
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the lr of step 4, set with 3 of 8 steps spent
    assert lrs[0] == pytest.approx(1e-3 * (1 - 3 / 8))
    assert lrs[-1] == pytest.approx(1e-3 * (1 - 7 / 8))


@pytest.mark.slow
def test_compiled_training_matches_eager(tiny_cfg, tmp_path, monkeypatch, caplog):
    """train.compile=true trains the same model: the same losses, to rounding. The run compiles as
    the config says, with torch's "aot_eager" backend (TorchDynamo's capture and AOTAutograd's
    forward and backward graphs, as test_compiled.py's step): inductor's C++ build of each kernel
    took 35 s here with a cold cache, as in CI. The model is smaller than the tiny one and its ten
    training pairs make one batch of one shape."""
    options = compiled.compile_options

    def aot_eager(cfg, device):
        asked = options(cfg, device)
        return None if asked is None else {**asked, "backend": "aot_eager"}

    monkeypatch.setattr(compiled, "compile_options", aot_eager)
    small = ("data.toy_size=10", "tokenizer.vocab_size=64", "model.d_model=16", "model.d_ff=32",
             "train.max_epochs=6", "train.bleu_sentences=5")
    losses = {}
    caplog.set_level(logging.INFO, logger="attn_mt")
    for flag in ("false", "true"):
        train(tiny_cfg(*small, "train.max_steps=6", "train.eval_every=3", f"train.compile={flag}"),
              tmp_path / flag)
        records = [json.loads(line)
                   for line in (tmp_path / flag / "metrics.jsonl").read_text().splitlines()]
        losses[flag] = [r["valid_loss"] for r in records]
    assert len(losses["true"]) == 2
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-3)
    assert (sum("under torch.compile(backend='aot_eager')" in r.getMessage()
                for r in caplog.records) == 1)


def test_validation_longer_than_the_position_table_is_cut_not_a_crash(tiny_cfg, tmp_path):
    cfg = tiny_cfg("model.max_positions=12", *SHORT)
    train(cfg, tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the epoch ran whole and was validated (a finite loss on sentences cut to 12 positions), and
    # the test split was translated: one hypothesis per test sentence, each within the position
    # table
    assert results["steps"] == records[-1]["step"] >= 1 and records[-1]["valid_loss"] < 100
    hyps = (tmp_path / "test_hyps.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len((tmp_path / "test.de").read_text(encoding="utf-8").splitlines())


def test_a_saved_checkpoint_rebuilds_the_model_being_trained(tiny_cfg, tmp_path):
    """The weights, config and tokenizer saved by the run (not another load of the same file) give
    the trained model's logits exactly."""
    cfg = tiny_cfg(*SHORT)
    run = setup(cfg, RunDir(tmp_path), resume=False)
    for _ in range(3):
        run.trainer.step(lambda: 0.0)
    checkpoint.save(checkpoint_state(run, [rng_state(torch.device("cpu"))]), tmp_path / "saved.pt")
    model, saved_cfg, tok = checkpoint.load_model(tmp_path / "saved.pt")
    trained = run.trainer.model.eval()
    src = torch.tensor([tok.encode_src(["the dog sees a cat."])[0] + [tok.eos_id]])
    tgt = torch.tensor([[tok.bos_id] + tok.encode_tgt(["der Hund sieht eine Katze."])[0]])
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), trained(src, tgt), rtol=0, atol=0)
    assert saved_cfg == cfg and tok.state() == run.corpus.tok.state()
    fresh = build_model(cfg.model, **tok.sizes())
    with torch.no_grad():
        assert not torch.equal(fresh(src, tgt), trained(src, tgt))  # the comparison can fail


def test_setup_opens_the_data_cache_entry_once_and_records_it(tiny_cfg, tmp_path, monkeypatch):
    """Set-up reads the prepared entry once (no second look, no build), reads the corpus from it
    once, and notes it in the run directory."""
    from attn_mt.data import cache, corpus
    from attn_mt.data.cache import Entry, prepare

    cfg = tiny_cfg(*SHORT)
    entry = prepare(cfg)  # the session's cache: usually there already
    opened, reads, real_open, real_read = [], [], Entry.open, corpus.read_corpus
    monkeypatch.setattr(Entry, "open", classmethod(lambda cls, path: opened.append(path)
                                                   or real_open(path)))
    monkeypatch.setattr(cache, "build", lambda *a: pytest.fail("the entry was built again"))
    monkeypatch.setattr("attn_mt.training.start.read_corpus", lambda *a: reads.append(a[1])
                        or real_read(*a))
    run = setup(cfg, RunDir(tmp_path / "run"), resume=False)
    assert (opened == [entry.path] and [e.path for e in reads] == [entry.path]
            and run.corpus.entry is reads[0])
    assert (RunDir(tmp_path / "run").entry_key() == entry.key
            and (tmp_path / "run" / "config.yaml").is_file())
