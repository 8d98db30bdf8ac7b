"""scripts/profile_step.py --parts: the parts of a step printed and in the JSON, beside the profile
or alone."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from conftest import TINY

from attn_mt.measure.parts import PARTS

ROOT = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("profile_step",
                                                  ROOT / "scripts" / "profile_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parts_alone_and_beside_the_eager_profile(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("name: tiny\n")
    sets = [a for item in [*TINY, "train.ema_decay=0.99"] for a in ("--set", item)]
    for variants in ([], ["eager"]):
        out = tmp_path / f"p{len(variants)}.json"
        script().main(["--config", str(cfg), *sets, "--steps", "3", "--warmup", "1", "--parts",
                       "--json", str(out), "--variants", *variants])
        r, printed = json.loads(out.read_text()), capsys.readouterr().out
        assert list(r["variants"]) == variants and ("eager: " in printed) == bool(variants)
        parts = r["parts"]
        assert (tuple(parts["ms"]) == PARTS and all(ms > 0 for ms in parts["ms"].values())
                and parts["steps"] == 3)
        assert all(f"\n{p} " in printed for p in PARTS) and f"{parts['whole_ms']:.2f} ms" in printed
