"""The benchmark's figures, the nn.Transformer reference and the FLOPs formula."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import TINY, cli, one_line_error, write_config
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

import attn_mt
import attn_mt.measure.bench
from attn_mt.cli import app
from attn_mt.config import TransformerConfig
from attn_mt.device import precisions_for
from attn_mt.files import OutputError
from attn_mt.measure.bench import TorchTransformer, train_flops
from attn_mt.models import build_model, count_params


@pytest.mark.slow
def test_bench_cli_writes_every_figure(tmp_path, tiny_run):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("name: tiny\n")
    out = tmp_path / "bench.json"
    args = ["bench", "--config", str(cfg), "--repeats", "1", "--steps", "1", "--sentences", "8",
            "--json", str(out), "--checkpoint", str(tiny_run / "checkpoint_best.pt")]
    for item in [*TINY, "train.precision=auto"]:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    precisions = list(r["matmul_peak_gflops"])
    assert precisions == precisions_for(torch.device("cpu")) and r["device"] == "cpu"
    # conftest: one thread
    assert r["threads"] == torch.get_num_threads() == 1 and r["torch"] == torch.__version__
    assert {(row["model"], row["precision"]) for row in r["train"]} == {
        (m, p) for m in ("ours", "ours_refattn", "torch") for p in precisions}
    by = {(row["model"], row["precision"]): row for row in r["train"]}
    # every model is timed on the same batches: tokens/s x seconds per step is the same tokens per
    # step
    per_step = {round(row["tokens_per_s"] * row["step_s"]) for row in r["train"]}
    assert len(per_step) == 1 and per_step.pop() >= 100
    for p in precisions:
        assert r["ours_tokens_per_s"][p] == by["ours", p]["tokens_per_s"]
        assert r["reference_tokens_per_s"][p] == by["torch", p]["tokens_per_s"]
        assert r["ratio"][p] == pytest.approx(r["ours_tokens_per_s"][p]
                                              / r["reference_tokens_per_s"][p])
        # GFLOP/s from the FLOPs formula, MFU against the peak
        for m in ("ours", "ours_refattn", "torch"):
            row = by[m, p]
            assert row["gflops"] == pytest.approx(r["flops_per_token"] * row["tokens_per_s"] / 1e9)
            assert (r["mfu"][m][p] == pytest.approx(row["gflops"] / r["matmul_peak_gflops"][p])
                    and r["mfu"][m][p] < 1)
    assert 0 < r["data_share"] < 1
    assert {(t["search"], t["precision"]) for t in r["translate"]} == {
        (s, p) for s in ("greedy", "beam5") for p in precisions}
    assert all(t["sentences_per_s"] > 0 for t in r["translate"])
    assert "ours / torch.nn.Transformer" in result.output


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_reference_has_our_parameter_count(norm_first, shared):
    cfg = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, norm_first=norm_first)
    sizes = dict(src_vocab=50, tgt_vocab=50 if shared else 40, pad_id=0, shared_vocab=shared)
    ours, ref = (count_params(build_model(cfg, **sizes)),
                 count_params(TorchTransformer(cfg, **sizes)))
    # post-norm: nn.Transformer keeps a final LayerNorm on both stacks, ours does not (4 D
    # parameters)
    assert ref - ours == (0 if norm_first else 4 * cfg.d_model)
    out = TorchTransformer(cfg, **sizes)(torch.randint(1, 40, (3, 7)), torch.randint(1, 40, (3, 5)))
    assert out.shape == (3, 5, sizes["tgt_vocab"])


def test_train_flops_by_hand():
    # D=4, F=8, one layer, V=10, S=2, T=3; see the formula in attn_mt/measure/bench.py
    cfg = TransformerConfig(d_model=4, n_heads=1, n_layers=1, d_ff=8)
    enc = 2 * 2 * (4 * 16 + 2 * 32) + 4 * 2 * 2 * 4  # 576
    dec = 2 * 3 * (6 * 16 + 2 * 32) + 2 * 2 * 2 * 16 + 4 * 3 * 3 * 4 + 4 * 3 * 2 * 4  # 1328
    out = 2 * 3 * 4 * 10  # 240
    assert train_flops(cfg, 10, torch.tensor([2]), torch.tensor([3])) == 3 * (enc + dec + out)


def test_train_flops_match_torch_flop_counter():
    """The formula equals what torch counts for a forward pass of one unpadded sentence pair
    (on the reference attention path: FlopCounterMode does not count the CPU flash SDPA kernel)."""
    cfg = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=48, dropout=0.0,
                            attention="reference")
    model = build_model(cfg, src_vocab=50, tgt_vocab=50, pad_id=0, shared_vocab=True).eval()
    src, tgt = torch.randint(1, 50, (1, 9)), torch.randint(1, 50, (1, 6))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt)
    assert 3 * counter.get_total_flops() == train_flops(cfg, 50, torch.tensor([9]),
                                                        torch.tensor([6]))


@pytest.mark.parametrize("json_out", ["none/b.json", "b.txt", "c.json"])
def test_bench_checks_its_json_before_any_work(tmp_path, monkeypatch, json_out):
    """A --json in a missing folder, of another kind, or over the config: one line naming --json
    before the benchmark starts (run_bench fails if called); the API refuses it the same way."""
    def work(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(attn_mt.measure.bench, "run_bench", work)
    config = write_config(tmp_path / "c.json")
    before = config.read_bytes()
    out = tmp_path / json_out
    one_line_error(cli("bench", "--config", config, "--json", out), 2, f"error: --json {out}: ")
    with pytest.raises(OutputError, match=f"^json_out {re.escape(str(out))}: "):
        attn_mt.bench(config, json_out=out)
    assert config.read_bytes() == before


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_bench_times_adamw_beside_another_optimizer_and_the_parts_of_a_step(tiny_cfg, optimizer):
    """With train.optimizer=muon an ours_adamw row per precision (same batches, same rounds) and the
    ratio of the step times; with AdamW no such row. The parts of our step come after the rows, in
    the JSON and the text."""
    r = attn_mt.measure.bench.run_bench(tiny_cfg(f"train.optimizer={optimizer}",
                                                 "train.precision=auto"),
                                        repeats=1, steps=1)
    precisions = list(r["matmul_peak_gflops"])
    by = {(row["model"], row["precision"]): row for row in r["train"]}
    models = {"ours", "ours_refattn", "torch"} | ({"ours_adamw"} if optimizer == "muon" else set())
    assert set(by) == {(m, p) for m in models for p in precisions}
    assert r["optimizer"] == optimizer and all(row["optimizer"] == optimizer for row in r["train"]
                                               if row["model"] != "ours_adamw")
    text = attn_mt.measure.bench.format_report(r)
    if optimizer == "muon":
        assert all(by["ours_adamw", p]["optimizer"] == "adamw" for p in precisions)
        assert r["optimizer_ratio"] == pytest.approx(
            {p: by["ours", p]["step_s"] / by["ours_adamw", p]["step_s"] for p in precisions})
        assert all(f"ours muon / adamw {p}: " in text for p in precisions)
    else:
        assert r["optimizer_ratio"] is None and " / adamw" not in text
    parts = r["step_parts"]
    assert parts["optimizer_name"] == optimizer and parts["precision"] == r["precision"]
    assert all(ms > 0 for ms in parts["ms"].values()) and parts["whole_ms"] > 0
    assert "parts of a step" in text
