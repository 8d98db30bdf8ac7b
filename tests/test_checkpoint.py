"""Checkpoints: round trip, atomic saves, formats 1 and 2 (optimizer state by name), crafted files
refused."""

import itertools
import json
import os
import shutil
import subprocess

import pytest
import torch
from conftest import Evil, cli, one_line_error, write_config

from attn_mt import checkpoint, files
from attn_mt.checkpoint import CheckpointError, load, load_model, save
from attn_mt.training.run import TrainError, train


def test_round_trip_gives_identical_logits(tiny_run):
    model, cfg, tok = load_model(tiny_run / "checkpoint_best.pt")
    again, _, _ = load_model(tiny_run / "checkpoint_best.pt")
    src = torch.tensor([tok.encode_src(["the dog sees a cat."])[0] + [tok.eos_id]])
    tgt = torch.tensor([[tok.bos_id] + tok.encode_tgt(["der Hund sieht eine Katze."])[0]])
    torch.testing.assert_close(model(src, tgt), again(src, tgt), rtol=0, atol=0)
    assert cfg.model.d_model == 32 and tok.joint


def test_contents_are_plain_and_load_weights_only(tiny_run):
    state = torch.load(tiny_run / "checkpoint_last.pt", weights_only=True)
    for key in ("model", "optimizer", "step", "config", "tokenizer", "format_version"):
        assert key in state
    assert isinstance(state["config"], dict) and state["step"] > 0


def test_atomic_save_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "c.pt"
    save({"model": {"w": torch.ones(2)}, "config": {}}, path)
    save({"model": {"w": torch.zeros(2)}, "config": {}}, path)
    assert torch.equal(load(path)["model"]["w"], torch.zeros(2))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_bad_checkpoints_raise_one_line_errors(tmp_path, tiny_run):
    for name, make in {
        "missing.pt": lambda p: None,
        "truncated.pt": lambda p: p.write_bytes(
            (tiny_run / "checkpoint_best.pt").read_bytes()[:5000]),
        "garbage.pt": lambda p: p.write_bytes(b"not a checkpoint"),
    }.items():
        path = tmp_path / name
        make(path)
        try:
            load_model(path)
        except CheckpointError as e:
            assert str(path) in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"{name} loaded")
    old = tmp_path / "old.pt"
    state = load(tiny_run / "checkpoint_best.pt")
    state["format_version"] = 0
    torch.save(state, old)
    try:
        checkpoint.load(old)
    except CheckpointError as e:
        assert "format 0" in str(e)
    else:
        raise AssertionError("old format loaded")


def test_a_newer_config_key_is_named_with_the_version_that_wrote_it(tiny_run, tmp_path, caplog):
    """A model key this version does not know: a one-line error naming the key and both versions. A
    decode key: a warning naming it, and the checkpoint decodes as this version would without it."""
    import attn_mt

    state = load(tiny_run / "checkpoint_best.pt")
    assert state["attn_mt_version"] == attn_mt.__version__
    state["attn_mt_version"] = "9.0.0"
    state["config"]["model"]["sparse_heads"] = True
    torch.save(state, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "newer.pt")
    assert "\n" not in str(e.value)
    assert all(t in str(e.value) for t in ("model.sparse_heads", "attn-mt 9.0.0",
                                           attn_mt.__version__))
    del state["config"]["model"]["sparse_heads"]
    state["config"]["decode"]["typical_p"] = 0.9
    torch.save(state, tmp_path / "decode.pt")
    with caplog.at_level("WARNING"):
        _, cfg, _ = load_model(tmp_path / "decode.pt")
    assert cfg.decode == load_model(tiny_run / "checkpoint_best.pt")[1].decode
    assert "decode.typical_p" in caplog.text and "attn-mt 9.0.0" in caplog.text


def test_checkpoints_are_plain_data_and_crafted_ones_are_refused(tiny_run, tmp_path):
    def walk(x):
        if isinstance(x, dict):
            assert all(isinstance(k, (str, int)) for k in x)
            x = list(x.values())
        if isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            assert x is None or isinstance(x, (torch.Tensor, str, bytes, int, float, bool)), type(x)

    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        walk(torch.load(tiny_run / name, weights_only=True))
    torch.save({"model": Evil(tmp_path / "PWNED"), "config": {}, "format_version": 1},
               tmp_path / "evil.pt")
    with pytest.raises(checkpoint.CheckpointError, match="refused"):
        checkpoint.load(tmp_path / "evil.pt")
    assert not (tmp_path / "PWNED").exists()


def _pre_redesign_order(names):
    """Registration order before the attention redesign: an attention module's input projections
    (qkv_proj, or q_proj and kv_proj) before its out_proj."""
    out = []
    for prefix, block in itertools.groupby(names, key=lambda n: n.rsplit(".", 2)[0] if "_attn." in n
                                           else None):
        block = list(block)
        out += sorted(block, key=lambda n: ".out_proj." in n) if prefix else block
    return out


def format_1(path) -> dict:
    """The checkpoint at `path` as a run written before the redesign saved it: weights in the old
    registration order, optimizer moments by position in that order, no parameter names, format
    1."""
    state = load(path)
    model = {k: state["model"][k] for k in _pre_redesign_order(list(state["model"]))}
    old = {**state, "model": model, "format_version": 1}
    if "optimizer" in state:
        (group,) = state["optimizer"]["param_groups"]
        # the order the run saved them in
        now = [n for n, _ in load_model(path)[0].named_parameters()]
        ids = dict(zip(now, group["params"], strict=True))
        names = _pre_redesign_order(now)
        assert names != now  # the orders do differ
        old["optimizer"] = {"state": {j: state["optimizer"]["state"][ids[n]] for j,
                                      n in enumerate(names)},
                            "param_groups": [{**{k: v for k, v in group.items()
                                                 if k != "param_names"},
                                              "params": list(range(len(names)))}]}
    return old


def test_format_1_checkpoints_translate_and_evaluate(tiny_run, tmp_path):
    new = tiny_run / "checkpoint_best.pt"
    torch.save(format_1(new), tmp_path / "old.pt")
    src = "the dog sees a cat.\na man walks.\n"
    (tmp_path / "src.txt").write_text(src)
    (tmp_path / "ref.txt").write_text("der Hund sieht eine Katze.\nein Mann geht.\n")
    for command in (["translate", "--beam", "2"], ["evaluate", "--src", tmp_path / "src.txt",
                                                   "--ref", tmp_path / "ref.txt"]):
        ours, old = (cli(*command, "--checkpoint", path, input=src)
                     for path in (new, tmp_path / "old.pt"))
        assert (old.exit_code == 0 and old.stdout == ours.stdout
                and old.stdout.count("\n") >= 2), old.output


def test_resuming_a_format_1_run_restores_the_moments_by_name(tiny_run, tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.max_epochs=3")
    runs = {}
    for name in ("new", "old"):
        runs[name] = shutil.copytree(tiny_run, tmp_path / name)
    torch.save(format_1(tiny_run / "checkpoint_last.pt"), runs["old"] / "checkpoint_last.pt")
    for run_dir in runs.values():
        train(cfg, run_dir, resume=True)  # before format 2: a size mismatch inside Adam
    records = [[{k: v for k, v in json.loads(line).items()
                 if k not in ("tokens_per_s", "elapsed_s")}
                for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs.values()]
    # the same losses and BLEU, step for step
    assert records[0] == records[1] and len(records[0]) == 3
    assert (checkpoint.load(runs["old"] / "checkpoint_last.pt")["format_version"]
            == checkpoint.FORMAT_VERSION)


def test_optimizer_state_that_fits_no_parameter_is_refused_in_one_line(
        tiny_run, tiny_cfg, tmp_path):
    state = load(tiny_run / "checkpoint_last.pt")
    group = state["optimizer"]["param_groups"][0]
    group["param_names"] = [n.replace("qkv_proj", "qkv") for n in group["param_names"]]
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    save(state, run_dir / "checkpoint_last.pt")
    with pytest.raises(TrainError, match=r"checkpoint format 2\): .*names the model does not have: "
                       r".*\.qkv\."):
        train(tiny_cfg("train.max_epochs=3"), run_dir, resume=True)
    torch.save({**state, "format_version": 3}, run_dir / "checkpoint_last.pt")
    with pytest.raises(CheckpointError, match="written by checkpoint format 3, this attn-mt reads "
                       "formats 1, 2"):
        train(tiny_cfg("train.max_epochs=3"), run_dir, resume=True)


def test_resume_from_weights_only_says_so(tiny_run, tmp_path):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    config = write_config(tmp_path / "c.yaml", "train.max_epochs=3")
    assert (cli("average", tiny_run / "checkpoint_best.pt", "--out", tmp_path / "avg.pt").exit_code
            == 0)
    # `average` refuses to write it there itself
    shutil.copy(tmp_path / "avg.pt", run_dir / "checkpoint_last.pt")
    one_line_error(cli("train", "-c", config, "--out", run_dir, "--resume"), 1,
                   f"--resume: {run_dir / 'checkpoint_last.pt'}: holds weights only",
                   "attn-mt average")


def _crafted(tiny_run, tmp_path, name, **changes):
    state = load(tiny_run / "checkpoint_best.pt")
    for key, value in changes.items():
        if value is DROP:
            del state[key]
        else:
            state[key] = value
    save(state, tmp_path / name)
    return tmp_path / name


DROP = object()


def test_crafted_checkpoints_fail_in_one_line_naming_the_file(tiny_run, tmp_path):
    weights, config = (load(tiny_run / "checkpoint_best.pt")[k] for k in ("model", "config"))
    key = next(iter(weights))
    cases = {
        "no-tokenizer.pt": ({"tokenizer": DROP}, "holds no tokenizer"),
        "garbage-tokenizer.pt": ({"tokenizer": {"src_proto": b"\x08garbage", "tgt_proto": None}},
                                 "not a SentencePiece model"),
        "string-tokenizer.pt": ({"tokenizer": "spm"}, "tokenizer is a str"),
        "list-model.pt": ({"model": [1, 2]}, "weights are a list"),
        "missing-key.pt": ({"model": {k: v for k, v in weights.items() if k != key}},
                           f"missing: {key}"),
        "extra-key.pt": ({"model": {**weights, "extra.weight": torch.ones(1)}},
                         "unexpected: extra.weight"),
        "reshaped.pt": ({"model": {**weights, key: torch.ones(2, 2)}},
                        f"shapes differ: {key} (2, 2)"),
        "nan.pt": ({"model": {**weights, key: weights[key] * float("nan")}}, f"not finite ({key}"),
        "banned.pt": ({"config": {**config, "model": {**config["model"], "kind": "marian",
                                                      "positions": "halves",
                                                      "banned_ids": [10**9]}}},
                      # was an IndexError
                      "model.banned_ids holds 1000000000, outside the target vocabulary"),
    }
    for name, (changes, message) in cases.items():
        path = _crafted(tiny_run, tmp_path, name, **changes)
        one_line_error(cli("translate", "--checkpoint", path, "hello"), 1, f"error: {path}: ",
                       message)


def test_a_weight_of_another_layout_device_or_dtype_is_refused_in_one_line(tiny_run, tmp_path):
    """Sparse and meta weights ended in a traceback (`Tensor.item() cannot be called on meta
    tensors`); complex, integer and float64 ones loaded silently. Weights are strided floats of the
    dtypes attn-mt saves."""
    weights = load(tiny_run / "checkpoint_best.pt")["model"]
    key = "src_embed.weight"
    w = weights[key]
    cases = {"sparse": (w.to_sparse(), "the sparse_coo layout"),
             "meta": (w.to("meta"), "on the meta device"), "complex": (
                 w.to(torch.complex64), "torch.complex64"), "int64": (w.long(), "torch.int64"),
             "float64": (w.double(), "torch.float64"), "bool": (w > 0, "torch.bool")}
    for name, (tensor, message) in cases.items():
        path = _crafted(tiny_run, tmp_path, f"{name}.pt", model={**weights, key: tensor})
        one_line_error(cli("translate", "--checkpoint", path, "hello"), 1, f"error: {path}: ",
                       f"'{key}' ", message)
    for dtype in (torch.bfloat16, torch.float16):  # what a bf16 or fp16 model saves loads
        path = _crafted(tiny_run, tmp_path, f"{dtype}.pt",
                        model={k: v.to(dtype) for k, v in weights.items()})
        assert load_model(path)[1].model.d_model == 32


def test_save_removes_only_temp_files_whose_writer_is_gone(tmp_path):
    path = tmp_path / "c.pt"
    host = files.HOST
    live = tmp_path / f".c.pt.{host}.{os.getppid()}.tmp"  # a process that is writing (our parent)
    # another machine's writer on a shared disk
    other_host = tmp_path / f".c.pt.elsewhere.{2**22 + 7}.tmp"
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f".c.pt.{host}.{dead.pid}.tmp"
    for tmp in (live, other_host, gone):
        tmp.write_bytes(b"half a checkpoint")
    save({"model": {}, "config": {}}, path)
    assert (sorted(p.name for p in tmp_path.iterdir())
            == sorted(["c.pt", live.name, other_host.name]))


def test_save_never_follows_a_link_planted_under_a_temp_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    # the name save used to take
    (tmp_path / f".c.pt.{files.HOST}.{os.getpid()}.tmp").symlink_to(victim)
    save({"model": {}, "config": {}, "step": 3}, tmp_path / "c.pt")
    assert victim.read_text() == "mine" and load(tmp_path / "c.pt")["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".c.pt")) == [
        # its own temp file is gone, the planted link left alone
        f".c.pt.{files.HOST}.{os.getpid()}.tmp"]
