"""Checkpoint averaging (training/averaging.py): `average`, train.keep_last's average at the end of
a run, and `attn-mt average`."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import cli

from attn_mt import checkpoint
from attn_mt.checkpoint import CheckpointError, load_model, model_from_state, save
from attn_mt.rundir import RunDir
from attn_mt.training.averaging import average, average_snapshots
from attn_mt.training.run import train


def test_average_is_the_elementwise_mean(tmp_path, tiny_run):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    shifted = {k: v + 2.0 if v.is_floating_point() else v for k, v in state["model"].items()}
    save({**state, "model": shifted}, tmp_path / "b.pt")
    avg = average([tiny_run / "checkpoint_best.pt", tmp_path / "b.pt"])
    for key, value in state["model"].items():
        expected = value + 1.0 if value.is_floating_point() else value
        torch.testing.assert_close(avg["model"][key], expected)
        assert avg["model"][key].dtype == value.dtype
    assert "optimizer" not in avg and avg["tokenizer"] == state["tokenizer"]


def test_average_refuses_checkpoints_of_different_models(tmp_path, tiny_run, tiny_cfg):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    key = next(k for k, v in state["model"].items() if v.dim() == 2)
    other = {**state["model"], key: torch.zeros(3, 3)}
    save({**state, "model": other}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"other\.pt: .*\(3, 3\)"):
        average([tiny_run / "checkpoint_best.pt", tmp_path / "other.pt"])
    with pytest.raises(CheckpointError, match="nothing to average"):
        average([])


def test_keep_last_keeps_n_and_tests_the_better_of_average_and_best(tmp_path, tiny_cfg):
    run_dir = tmp_path / "run"
    train(tiny_cfg("train.max_steps=8", "train.eval_every=2", "train.bleu_sentences=10",
                   "train.keep_last=3"),
          run_dir)
    kept = sorted(p.name for p in run_dir.glob("checkpoint_step*.pt"))
    assert len(kept) == 3  # of 4 evaluations (steps 2, 4, 6, 8)
    steps = [checkpoint.load(run_dir / name)["step"] for name in kept]
    assert (steps == sorted(steps)
            and steps[-1] == checkpoint.load(run_dir / "checkpoint_last.pt")["step"])
    results = json.loads((run_dir / "results.json").read_text())
    assert results["averaged_checkpoints"] == 3
    avg_won = results["averaged_valid_bleu"] > results["best_valid_bleu"]
    assert results["tested"] == ("checkpoint_avg.pt" if avg_won else "checkpoint_best.pt")
    # the average translates like any checkpoint
    model, _, _ = load_model(run_dir / "checkpoint_avg.pt")
    assert sum(p.numel() for p in model.parameters()) == results["params"]


def test_the_kept_snapshots_average_into_checkpoint_avg_and_the_better_is_tested(
        tmp_path, tiny_run):
    """`average_snapshots` (the end of a run): checkpoint_avg.pt written and loaded into the model,
    then the average is tested only where its valid BLEU beats the best single checkpoint's."""
    files, state = RunDir(tmp_path), checkpoint.load(tiny_run / "checkpoint_last.pt")
    for step, shift in ((20, 0.0), (30, 2.0)):
        files.keep_weights({**state, "model": {k: v + shift for k, v in state["model"].items()},
                            "step": step})
    model, _, _ = model_from_state(state)
    tested, extra = average_snapshots(files, model, best_bleu=5.0, valid_bleu=lambda: 4.0)
    assert tested == files.best and extra == {"averaged_valid_bleu": 4.0, "averaged_checkpoints": 2}
    averaged = checkpoint.load(files.average)
    assert averaged["averaged"] == [str(p) for p in files.snapshots()] and averaged["step"] == 30
    for key, value in model.state_dict().items():
        assert torch.equal(value, averaged["model"][key])
        torch.testing.assert_close(value, state["model"][key] + 1.0)
    assert (average_snapshots(files, model, best_bleu=5.0, valid_bleu=lambda: 6.0)[0]
            == files.average)


def test_average_command(tmp_path, tiny_run):
    """In this process (README's `attn-mt average` example runs the installed command)."""
    ckpt = tiny_run / "checkpoint_best.pt"
    out = cli("average", ckpt, tiny_run / "checkpoint_last.pt", "--out", tmp_path / "avg.pt")
    assert out.exit_code == 0, out.output
    assert "averaged 2 checkpoints" in out.stdout and (tmp_path / "avg.pt").exists()
    bad = cli("average", ckpt, tmp_path / "missing.pt", "--out", tmp_path / "x.pt")
    assert (bad.exit_code == 1 and bad.stderr.strip() == f"error: {tmp_path / 'missing.pt'}: "
            "checkpoint not found")


def _with_config(state: dict, path: Path, **changes) -> Path:
    config = {section: dict(values) if isinstance(values, dict) else values
              for section, values in state["config"].items()}
    for key, value in changes.items():
        section, name = key.split("__")
        config[section][name] = value
    save({**state, "config": config}, path)
    return path


def test_average_refuses_checkpoints_of_different_runs_unless_forced(tmp_path, tiny_run):
    from conftest import cli, one_line_error

    best = tiny_run / "checkpoint_best.pt"
    state = checkpoint.load(best)
    seeded = _with_config(state, tmp_path / "seed7.pt", train__seed=7)
    wider = _with_config(state, tmp_path / "wider.pt", train__seed=7, model__dropout=0.3,
                         data__max_len=9)
    longer = _with_config(state, tmp_path / "longer.pt", train__max_steps=500, train__max_epochs=9,
                          train__eval_every=3, decode__beam_size=2)
    with pytest.raises(CheckpointError,
                       match=r"seed7\.pt: not of the same run as .*checkpoint_best\.pt "
                       r"\(train\.seed is 7 there, 1 in checkpoint_best\.pt\)"):
        average([best, seeded])
    with pytest.raises(CheckpointError, match="data.max_len is 9 there.*model.dropout is 0.3 "
                       "there.*train.seed"):
        average([best, wider])
    # a longer budget: the same run
    assert average([best, longer])["model"].keys() == state["model"].keys()
    one_line_error(cli("average", best, seeded, "--out", tmp_path / "avg.pt"), 1,
                   "not of the same run", "--force")
    assert not (tmp_path / "avg.pt").exists()
    assert cli("average", best, seeded, "--out", tmp_path / "avg.pt", "--force").exit_code == 0
    assert checkpoint.load(tmp_path / "avg.pt")["averaged"] == [str(best), str(seeded)]


def test_average_refuses_crafted_checkpoints_naming_the_file(tmp_path, tiny_run):
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    best = tiny_run / "checkpoint_best.pt"
    save({**state, "model": [1, 2]}, tmp_path / "list.pt")
    save({k: v for k, v in state.items() if k != "tokenizer"}, tmp_path / "no-tokenizer.pt")
    with pytest.raises(CheckpointError, match=r"list\.pt: checkpoint weights are a list"):
        average([best, tmp_path / "list.pt"])
    with pytest.raises(CheckpointError, match=r"no-tokenizer\.pt: checkpoint holds no tokenizer"):
        average([best, tmp_path / "no-tokenizer.pt"])



def test_average_checks_every_input_and_names_the_one_at_fault(tmp_path, tiny_run):
    """The first file's NaN weight was averaged in (found only at translate time), and its bad
    config or missing tokenizer was blamed on the second file: each input is checked whole, first to
    last."""
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    best = tiny_run / "checkpoint_best.pt"
    key = next(iter(state["model"]))
    nan = {**state["model"], key: state["model"][key].clone().fill_(float("nan"))}
    save({**state, "model": nan}, tmp_path / "nan.pt")
    save({**state, "config": {**state["config"], "model": {"kind": "nonsense"}}},
         tmp_path / "bad-config.pt")
    save({k: v for k, v in state.items() if k != "tokenizer"}, tmp_path / "no-tokenizer.pt")
    for name, why in [("nan.pt", "weights are not finite"),
                      ("bad-config.pt", "config is not valid"),
                      ("no-tokenizer.pt", "holds no tokenizer")]:
        with pytest.raises(CheckpointError, match=rf"^{tmp_path / name}: checkpoint.*{why}"):
            average([tmp_path / name, best])


@pytest.mark.parametrize("name", ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_avg.pt",
                                  "checkpoint_step0000009.pt", "Checkpoint_Last.pt"])
def test_average_never_writes_a_checkpoint_name_of_a_run(tmp_path, tiny_run, name):
    """Not over the run's checkpoint_last.pt (resume), _best, _avg (results.json's `tested`) nor as
    a snapshot (averaged at the end): refused in one line, the run untouched; any other name in the
    run, an earlier average there included, is the command's own."""
    from conftest import one_line_error, snapshot

    run, inputs = tmp_path / "run", [tmp_path / "a.pt", tmp_path / "b.pt"]
    run.mkdir()
    for path in [*inputs, run / "checkpoint_last.pt", run / "checkpoint_best.pt"]:
        shutil.copy(tiny_run / "checkpoint_best.pt", path)
    shutil.copy(tiny_run / "config.yaml", run / "config.yaml")
    before = snapshot(run)
    one_line_error(cli("average", *inputs, "--out", run / name), 2,
                   f"error: --out {run / name}: a checkpoint name of the run in {run}",
                   "another name")
    assert snapshot(run) == before
    # again over its own; elsewhere, any name
    for out in (run / "avg.pt", run / "avg.pt", tmp_path / name):
        assert (cli("average", *inputs, "--out", out).exit_code == 0
                and checkpoint.load(out)["averaged"])
