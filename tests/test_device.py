"""Device and random state: unknown devices are one-line errors; RNG states of missing GPUs are
skipped."""

from __future__ import annotations

import torch
from conftest import cli, one_line_error

from attn_mt.device import pick_precision, set_rng_state


def test_cuda_rng_states_of_missing_gpus_are_skipped(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, i: calls.append(i))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                        lambda states: calls.extend(range(len(states))))
    saved = {"torch": torch.get_rng_state(), "cuda": [torch.ByteTensor(8), torch.ByteTensor(8)]}
    set_rng_state(saved, torch.device("cuda"))
    assert calls == [0]


def test_unknown_device_is_one_line(tiny_run):
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--device", "gpu",
                 "a dog.")
    one_line_error(result, 1, "device 'gpu' is not one of")


def test_precision_choice(monkeypatch):
    import attn_mt.device

    cpu = torch.device("cpu")
    assert pick_precision("fp32", cpu) == "fp32"
    # this machine
    assert pick_precision("auto", cpu) == ("bf16" if attn_mt.device.cpu_has_bf16() else "fp32")
    for native, want in ((True, "bf16"), (False, "fp32")):  # either kind of CPU
        monkeypatch.setattr(attn_mt.device, "cpu_has_bf16", lambda native=native: native)
        assert pick_precision("auto", cpu) == want
