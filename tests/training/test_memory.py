"""attn_mt.training.memory: with heap reuse, a step that makes and frees large tensors stops
faulting in pages."""

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, resource, statistics, torch
from attn_mt.training.memory import reuse_freed_memory
applied = reuse_freed_memory()
faults = []
for _ in range(14):  # a training step in miniature: 65 MB logits and softmax, made and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    logits = torch.ones(4096, 4000)  # every page written, as a product's output is
    probs = logits.softmax(-1)
    del logits, probs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": statistics.median(faults[7:])}))
"""
# The heap settles within a few rounds (measured: by round 7), hence the median of the later ones.


def probe(setting: str) -> dict:
    env = {**os.environ, "ATTN_MT_MALLOC": setting}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="glibc malloc tuning is Linux-only")
def test_freed_memory_is_reused_without_page_faults():
    system, reused = probe("system"), probe("")
    assert not system["applied"] and system["faults"] > 20_000  # fresh 4 KiB pages every round
    if not reused["applied"]:
        pytest.skip("not glibc: mallopt unavailable")
    assert reused["faults"] < 1_000


@pytest.mark.parametrize("command", ["bench", "compare_rnn"])
def test_bench_and_compare_rnn_time_steps_with_the_setting_training_uses(
        command, monkeypatch, tmp_path):
    """bench timed steps 0.78-0.94x of what they are in training while freed logits faulted in again
    every step (sys time 30 s against 2 s on Multi30k): the measuring commands apply training's
    setting first."""
    import attn_mt
    import attn_mt.measure.bench
    import attn_mt.measure.compare
    import attn_mt.training.memory

    seen = []
    monkeypatch.setattr(attn_mt.training.memory, "reuse_freed_memory",
                        lambda: seen.append("memory"))
    monkeypatch.setattr(attn_mt.measure.bench, "run_bench", lambda *a, **k: seen.append("work")
                        or {})
    monkeypatch.setattr(attn_mt.measure.compare, "compare_rnn", lambda *a, **k: seen.append("work"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if command == "bench":
        attn_mt.bench(os.path.join(root, "configs", "toy.yaml"))
    else:
        attn_mt.compare_rnn(os.path.join(root, "configs", "compare.yaml"), out=tmp_path / "c",
                            quick=True)
    assert seen == ["memory", "work"]
