import pytest
import torch
from conftest import Evil

from attn_mt import checkpoint
from attn_mt.checkpoint import CheckpointError, load, load_model, save


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
        "truncated.pt": lambda p: p.write_bytes((tiny_run / "checkpoint_best.pt").read_bytes()[:5000]),
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
    torch.save({"model": Evil(tmp_path / "PWNED"), "config": {}, "format_version": 1}, tmp_path / "evil.pt")
    with pytest.raises(checkpoint.CheckpointError, match="refused"):
        checkpoint.load(tmp_path / "evil.pt")
    assert not (tmp_path / "PWNED").exists()
