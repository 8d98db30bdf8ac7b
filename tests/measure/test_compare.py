"""compare-rnn: a small end-to-end run through the CLI that writes a valid report and the
checkpoints it tested."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import attn_mt
from attn_mt.checkpoint import load_model
from attn_mt.cli import app
from attn_mt.config import ConfigError
from attn_mt.data.corpus import load_corpus
from attn_mt.measure.compare import Contestant, _train_step, resolve_clock
from attn_mt.measure.report import verdict
from attn_mt.models import count_params
from attn_mt.training.validation import score_test_split

CPU = torch.device("cpu")
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "compare.yaml"

BUDGET_MIN = 0.015  # 0.9 s of training each, evaluated about every 0.45 s
# --quick, made smaller still: 300 toy pairs, tiny models, 1 s of training each, translations of
# at most 4 subwords
SMALL = [
    "data.toy_size=300", "tokenizer.vocab_size=120", "train.bleu_sentences=5", "train.device=cpu",
    "train.precision=fp32", "train.threads=1",  # one thread: tiny ops, and robust to a busy machine
    "transformer.model.d_model=32", "transformer.model.d_ff=64", "transformer.model.n_heads=2",
    "rnn.model.d_embed=32", "rnn.model.d_hidden=40", "rnn.model.d_attn=32",
    f"compare.budget_minutes={BUDGET_MIN}", f"compare.eval_every_minutes={BUDGET_MIN / 2}",
    "compare.lengths=[8,32]", "compare.length_batch_tokens=256", "compare.repeats=2",
    "compare.decode_sentences=16", "compare.decode_repeats=1", "compare.beam_size=2",
    "decode.beam_size=2", "decode.max_len_a=0", "decode.max_len_b=4",
]


def test_the_clock_fits_the_device():
    assert (resolve_clock("auto", CPU) == "cpu" and resolve_clock("auto", torch.device("cuda"))
            == "wall")
    assert resolve_clock("wall", CPU) == "wall" and resolve_clock("cpu", CPU) == "cpu"
    with pytest.raises(ConfigError, match="compare.clock=cpu counts this process's CPU time, not "
                       "the work of cuda"):
        resolve_clock("cpu", torch.device("cuda"))


def test_a_race_step_counts_the_time_on_the_race_clock():
    """A step that waits (as a descheduled process does) costs wall time but not CPU time."""
    class Waits:
        device, epoch_done, calls = CPU, False, []

        def step(self, clock, spent):
            self.calls.append(spent)
            time.sleep(0.25)

    c = Contestant("rnn", None, Waits(), clock=3.0)
    assert _train_step(c, 12.0, "wall") >= 0.25 and _train_step(c, 12.0, "cpu") < 0.1
    assert Waits.calls == [0.25, 0.25]  # the learning rate follows the share of the budget spent


def _report(trusted=True, spread=0.05):
    ms = {8: (100.0, 80.0), 256: (170.0, 870.0)}
    return {"budget_minutes": 0.6, "models": {"transformer": {"test_bleu": 95.29},
                                              "rnn": {"test_bleu": 24.34}},
            "length_scaling": [{"length": n, "transformer_ms": t, "rnn_ms": r,
                                "transformer_spread": spread, "rnn_spread": 0.1} for n,
                               (t, r) in ms.items()],
            "trust": {"clock": "cpu", "threads": 1, "trusted": trusted, "noisy": [],
                      "reasons": [] if trusted else ["training: this process got 0.05 of a core"]}}


def test_the_report_concludes_only_from_a_trusted_measurement():
    assert verdict(_report()) == ("**Verdict:** for the same 0.6 min of training (CPU clock), test "
                                  "BLEU 95.3 (transformer) against 24.3 (rnn). From n = 8 to 256 "
                                  "the time per batch grew x1.70 (transformer) against x10.88 "
                                  "(rnn); rnn / transformer: 0.8x -> 5.1x.")
    assert verdict(_report(spread=0.6)).endswith("No conclusion on length: the rounds of n = 8 "
                                                 "(transformer), n = 256 (transformer) spread more "
                                                 "than 50%.")
    refused = verdict(_report(trusted=False))
    assert (refused.startswith("**No conclusions: the machine's load leaves this measurement "
                               "untrusted** (training: this process got 0.05 of a core)")
            and "BLEU" not in refused)
    wall = {**_report(trusted=False), "trust": {**_report(trusted=False)["trust"], "clock": "wall",
                                                "threads": 2}}
    assert verdict(wall).endswith("rerun with a quieter machine, or compare.clock=cpu with "
                                  "train.threads=1.")
    assert verdict({"models": {}}) == ""  # a report from before the check


def test_refuses_unequal_sizes(tmp_path):
    result = CliRunner().invoke(app, ["compare-rnn", "--config", str(CONFIG), "--quick", "--out",
                                      str(tmp_path), *sum((["--set", o] for o in SMALL), []),
                                      "--set", "rnn.model.d_hidden=200"])
    assert result.exit_code == 2 and "parameter counts differ" in result.output


@pytest.mark.slow
def test_compare_rnn_writes_a_valid_report(tmp_path):
    """On the pronoun variant, whose test split has a contrastive set: both models' accuracy by
    distance too."""
    args = ["compare-rnn", "--config", str(CONFIG), "--quick", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, *sum((["--set", o] for o
                                                   in [*SMALL, "data.toy_variant=pronoun"]), [])])
    assert result.exit_code == 0, result.output
    assert "train tokens/s" in result.output and "Background load" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["machine"]["torch"] and report["machine"]["threads"] >= 1
    assert set(report["background_load"]) == {"training", "length_scaling", "decoding"}
    assert report["compare"]["clock"] == report["trust"]["clock"] == "cpu"  # quick: auto, on a CPU
    assert (report["trust"]["trusted"] == (not report["trust"]["reasons"])
            and report["trust"]["threads"] == 1)
    assert ("Verdict:" if report["trust"]["trusted"] else "No conclusions") in result.output
    for name in ("transformer", "rnn"):
        m = report["models"][name]
        # the model the report is of
        assert m["params"] == count_params(load_model(tmp_path / f"{name}.pt")[0])
        assert m["peak_memory_mb"] == pytest.approx(16 * m["params"] / 2**20 + m["activation_mb"],
                                                    abs=0.11)
        assert (m["decode_sentences_per_s"] == m["greedy_sentences_per_s"]
                and m["beam_sentences_per_s"] > 0)
        assert m["train_tokens_per_s"] > 0 and m["greedy_decoder_calls"] >= 1
        assert m["curve"] and all({"elapsed_s", "valid_bleu"} <= p.keys() for p in m["curve"])
        times = [p["elapsed_s"] for p in m["curve"]]
        assert times == sorted(times) and times[-1] >= BUDGET_MIN * 60
    assert [r["length"] for r in report["length_scaling"]] == [8, 32]
    for row in report["length_scaling"]:
        assert row["transformer_ms"] > 0 and row["rnn_ms"] > 0
        assert (row["rnn_sequential_steps"] == row["length"]
                and row["transformer_sequential_steps"] == 1)
    for name in ("report.md", "bleu_vs_time.png", "time_vs_length.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert "| length n |" in (tmp_path / "report.md").read_text()
    acc = {name: report["models"][name]["contrastive"] for name in ("transformer", "rnn")}
    assert acc["transformer"]["items"] == acc["rnn"]["items"] > 20
    for a in acc.values():
        assert (sum(b["items"] for b in a["by_distance"].values()) == a["items"]
                and 0 <= a["accuracy"] <= 1)
    assert "## e. Pronouns by antecedent distance" in (tmp_path / "report.md").read_text()
    assert "contrastive acc" in result.output
    # each model's attention history in a folder of its own: the untrained
    for name in ("transformer", "rnn"):
        history = attn_mt.history(tmp_path / name)  # model's at step 0, then a record an evaluation
        curve = report["models"][name]["curve"]
        assert history.model_kind == name and history.steps == [0, *(p["step"] for p in curve)]
        assert history.bleu == [None, *(p["valid_bleu"] for p in curve)]
        assert (len(history.modules), history.n_heads) == ((1, 1) if name == "rnn" else (6, 2))
        assert history.coref is not None and all(a is not None for a in history.contrastive)
    translated = CliRunner().invoke(app, ["translate", "--checkpoint", str(tmp_path / "rnn.pt"),
                                          "--device", "cpu", "the dog sees a cat."])
    assert translated.exit_code == 0, translated.output
    # the saved checkpoint is the model that was tested: same scores again
    for name in ("transformer", "rnn"):
        model, cfg, _ = load_model(tmp_path / f"{name}.pt")
        _, scores = score_test_split(model, load_corpus(cfg, cfg.model.max_positions), cfg, CPU,
                                     "fp32")
        assert (scores["bleu"], scores["chrf"]) == (report["models"][name]["test_bleu"],
                                                    report["models"][name]["test_chrf"])
