"""scripts/eval_multi30k.sh: one JSON line per Multi30k test set (needs Multi30k; a tiny model on
it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from attn_mt import checkpoint
from attn_mt.decoding.metrics import score
from attn_mt.decoding.translate import translate

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_eval_multi30k_scores_the_three_test_sets(tiny_run, multi30k, prestarted_bin,
                                                   tmp_path):
    for name in ("test2016", "test2017", "test2018"):  # the first lines of each set keep it quick
        for lang in ("de", "en"):
            lines = (multi30k / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:20]
            (tmp_path / f"{name}.{lang}").write_text("".join(x + "\n" for x in lines),
                                                     encoding="utf-8")
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    assert shutil.which("attn-mt", path=path), "attn-mt is not installed next to this python"
    # the script's three `attn-mt evaluate`s: forks of one process that imported torch
    env = {**os.environ, "MULTI30K_DIR": str(tmp_path), "PATH": f"{prestarted_bin}:{path}"}
    done = subprocess.run(["sh", str(ROOT / "scripts" / "eval_multi30k.sh"),
                           str(tiny_run / "checkpoint_best.pt"), "en", "de", "--beam", "2"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["test"] for r in rows] == ["test2016", "test2017", "test2018"]
    for r in rows:
        assert r["signature"].startswith("nrefs:1") and r["beam_size"] == 2
    # each line is the score of the checkpoint's own beam-2 translations of that test set (the toy
    # model translates en -> de, so the script is called with en de)
    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt")
    for r in rows:
        sources = (tmp_path / f"{r['test']}.en").read_text(encoding="utf-8").splitlines()
        refs = (tmp_path / f"{r['test']}.de").read_text(encoding="utf-8").splitlines()
        expected = score(translate(model, tok, sources, replace(cfg.decode, beam_size=2)), refs)
        assert (r["bleu"], r["chrf"]) == (expected["bleu"], expected["chrf"])
