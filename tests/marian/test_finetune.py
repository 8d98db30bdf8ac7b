"""train.init_from: a run starts from a checkpoint of ours or a MarianMT folder (its shape,
tokenizer and weights, a fresh optimizer and schedule); train.freeze keeps embeddings or encoder as
they were; --resume continues the fine-tuning run."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import TINY
from marian_models import folders

import attn_mt
from attn_mt import checkpoint

STEPS = ["train.max_steps=6", "train.eval_every=3", "train.max_epochs=50", "train.bleu_sentences=5"]
# the shape is the model's
FT = [o for o in TINY if not o.startswith(("model.d_", "model.n_", "tokenizer."))]


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return folders(tmp_path_factory)


def _weights(path) -> dict[str, torch.Tensor]:
    return checkpoint.load(path)["model"]


def test_fine_tuning_a_checkpoint_starts_from_its_weights(tiny_run, tmp_path):
    start = shutil.copy(tiny_run / "checkpoint_best.pt", tmp_path / "start.pt")
    before = _weights(start)
    run = attn_mt.train(None, tmp_path / "ft", overrides=[*FT, *STEPS, "data.toy_seed=7",
                                                          f"train.init_from={start}",
                                                          "train.freeze=[encoder]"],
                        quiet=True)
    state = checkpoint.load(run.dir / "checkpoint_last.pt")
    after = state["model"]
    assert state["config"]["model"]["d_model"] == 32  # the shape of the model it starts from
    assert state["tokenizer"] == checkpoint.load(start)["tokenizer"]  # its tokenizer, not a new one
    assert state["step"] == 6 and run.results["init_from"] == str(start)
    enc = [k for k in before if k.startswith("encoder.")]
    assert enc and all(torch.equal(before[k], after[k]) for k in enc)  # frozen
    # trained
    assert not torch.equal(before["decoder.0.ff.0.weight"], after["decoder.0.ff.0.weight"])
    # --resume continues this run, not the model it started from, and reads only the run: here the
    # init_from path holds another model (of another shape), then nothing
    random_checkpoint_like(start)
    for steps in (9, 12):
        resumed = attn_mt.train(None, tmp_path / "ft", overrides=[*FT, *STEPS, "data.toy_seed=7",
                                                                  f"train.init_from={start}",
                                                                  "train.freeze=[encoder]",
                                                                  f"train.max_steps={steps}"],
                                resume=True, quiet=True)
        assert checkpoint.load(resumed.dir / "checkpoint_last.pt")["step"] == steps
        start.unlink(missing_ok=True)


def test_fine_tuning_a_marian_model(marian, tmp_path):
    folder = marian("shared")
    run = attn_mt.train(None, tmp_path / "ft", overrides=[*FT, *STEPS, f"train.init_from={folder}",
                                                          "train.freeze=[embeddings]"], quiet=True)
    state = checkpoint.load(run.dir / "checkpoint_last.pt")
    assert (state["config"]["model"]["activation"] == "swish"
            and state["tokenizer"]["vocab"]["specials"]["eos"] == 0)
    from attn_mt.imports.marian import marian_state

    before = marian_state(folder)["model"]
    # frozen (and tied)
    assert torch.equal(before["src_embed.weight"], state["model"]["src_embed.weight"])
    assert not torch.equal(before["decoder.1.ff.3.weight"], state["model"]["decoder.1.ff.3.weight"])
    model = attn_mt.load(run.dir / "checkpoint_best.pt", device="cpu")
    assert isinstance(model.translate("a dog runs."), str)


def test_a_part_named_twice_is_refused():
    with pytest.raises(attn_mt.ConfigError, match="train.freeze"):
        attn_mt.configure(None, ["train.freeze=[encoder, encoder]"])


def random_checkpoint_like(path) -> None:
    """Put a model of another shape (d_model 48) at `path`: its weights are not the run's."""
    state = checkpoint.load(path)
    state["config"]["model"]["d_model"] = 48
    state["model"] = {k: torch.zeros([48 if n == 32 else n for n in v.shape]) for k,
                      v in state["model"].items()}
    torch.save(state, path)


def test_init_from_refuses_settings_that_differ_from_the_model(tiny_run, tmp_path):
    start = tiny_run / "checkpoint_best.pt"
    with pytest.raises(attn_mt.AttnMTError) as e:
        attn_mt.train(None, tmp_path / "ft", overrides=[*TINY, *STEPS, f"train.init_from={start}",
                                                        "model.positions=rotary",
                                                        "model.d_model=64"], quiet=True)
    assert e.value.field == "init_from" and "model.d_model=64 (the model's: 32)" in str(e.value)
    assert "model.positions='rotary' (the model's: 'interleaved')" in str(e.value)
    assert not (tmp_path / "ft" / "checkpoint_last.pt").exists()
