"""How much of attn-mt a student meets: train the toy config for 2 steps and translate one sentence
from Python, then count the attn_mt modules loaded and their lines, and the attn_mt frames on the
stack at the first softmax of training (docs/architecture.md's core targets).

The core is counted with the analysis extra off (`train.record_attention=false`); then the same
calls with the config's own settings (attention recorded during training: analysis/history.py) count
what the recorder adds on top.

    python scripts/core_size.py [--json OUT.json] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def first_softmax_frames(out: Path, overrides: list[str]) -> list[str]:
    """The attn_mt frames (module:function) on the stack at the first softmax of a training run's
    first step."""
    import attn_mt

    seen: list[str] = []
    real = torch.softmax

    class Found(Exception):
        pass

    def spy(*args, **kwargs):
        if not seen:
            for f in traceback.extract_stack()[:-1]:
                if "/attn_mt/" in f.filename:
                    seen.append(f"{Path(f.filename).relative_to(ROOT).as_posix()}:{f.name}")
            raise Found
        return real(*args, **kwargs)

    torch.softmax = spy
    torch.Tensor.softmax = lambda self, *a, **k: spy(self, *a, **k)  # type: ignore[method-assign]
    try:
        attn_mt.train(ROOT / "configs/toy.yaml", out, overwrite=True, quiet=True,
                      overrides=[*overrides, "train.max_steps=2", "train.record_attention=false"])
    except Exception as e:  # the spy stops the run at the first softmax
        if not seen:
            raise
        del e
    finally:
        torch.softmax = real
        del torch.Tensor.softmax
    return seen


def first_run(out: Path, overrides: list[str]) -> list[str]:
    """Train the toy config for 2 steps into `out` and translate one sentence: the attn_mt modules
    loaded by then (all calls so far in this process included)."""
    import attn_mt

    run = attn_mt.train(ROOT / "configs/toy.yaml", out, overrides=[*overrides, "train.max_steps=2"],
                        quiet=True)
    run.load().translate("the old man sees a small dog.")
    return sorted(n for n, m in sys.modules.items()
                  if n == "attn_mt" or n.startswith("attn_mt.") and getattr(m, "__file__", None))


def count_lines(modules: list[str]) -> int:
    return sum(len(Path(sys.modules[n].__file__).read_text().splitlines()) for n in modules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the counts here")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="a config override (tests)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        core = first_run(Path(tmp) / "core", [*args.overrides, "train.record_attention=false"])
        recorded = first_run(Path(tmp) / "recorded", args.overrides)
        frames = first_softmax_frames(Path(tmp) / "frames", args.overrides)
    added = sorted(set(recorded) - set(core))
    result = {"modules": len(core), "lines": count_lines(core), "frames": len(frames),
              "stack": frames, "loaded": core,
              "recording": {"modules": len(recorded), "lines": count_lines(recorded),
                            "added": added}}
    print(f"attn_mt modules loaded: {len(core)}, {result['lines']} lines; frames at the first "
          f"softmax: {len(frames)}")
    print(f"with attention recorded (the config's default): {len(recorded)} modules, "
          f"{result['recording']['lines']} lines (+{', '.join(added) or 'nothing'})")
    print("  " + "\n  ".join(frames))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
