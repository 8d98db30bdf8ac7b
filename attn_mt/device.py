"""Where a model runs and in what precision: choose the device, choose the precision, autocast, time
device work (`Stopwatch`, the package's one timer), and describe the machine once for every
report."""

from __future__ import annotations

import contextlib
import os
import platform
import time

import torch

from attn_mt.errors import RunError

DEVICES = ("auto", "cpu", "cuda", "mps")


class DeviceError(RunError):
    """A device or precision this machine does not have; the message says which (`field`:
    "device")."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message, "device", named=True)


def pick_device(name: str) -> torch.device:
    """"auto" picks CUDA, then MPS, then the CPU; an explicit name must exist on this machine.

    On CUDA, fp32 matmuls and convolutions may use TF32 tensor cores (10-bit mantissa inputs,
    fp32 accumulation): several times faster on Ampere and later, well within training noise.
    """
    if name in ("auto", "cuda") and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    # one GPU of several
    if isinstance(name, str) and name.startswith("cuda:") and name[5:].isdigit():
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(name[5:]) >= count:
            raise DeviceError(f"device {name}: this machine has {count} CUDA device(s) (cuda:0 to "
                              f"cuda:{count - 1})" if count
                              else f"device {name}: no CUDA device is available")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        return torch.device(name)
    if name not in DEVICES:
        raise DeviceError(f"device {name!r} is not one of {', '.join(DEVICES)} (or cuda:N)")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("train.device=cuda but no CUDA device is available")
    if name == "mps" and not torch.backends.mps.is_available():
        raise DeviceError("train.device=mps but MPS is not available")
    return torch.device(name)


def cpu_has_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (AVX-512 BF16 / AMX)."""
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pick_precision(name: str, device: torch.device) -> str:
    """"fp32", "bf16" or "fp16" for this device; "auto" picks bf16 where the hardware has it."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if device.type == "cpu" and cpu_has_bf16() else "fp32"
    if name == "fp16" and device.type != "cuda":
        raise DeviceError("train.precision=fp16 needs a CUDA device (use bf16 or fp32)")
    return name


def precisions_for(device: torch.device) -> list[str]:
    """The precisions worth measuring here: fp32, and bf16 where the hardware runs it natively."""
    bf16 = (cpu_has_bf16() if device.type == "cpu" else device.type == "cuda"
            and torch.cuda.is_bf16_supported())
    return ["fp32", "bf16"] if bf16 else ["fp32"]


def autocast(device: torch.device, precision: str):
    """Mixed precision for the block (bf16 or fp16), or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16"
                          else torch.float16)


def sync(device: torch.device | None) -> None:
    """Wait for queued device work, so host timers measure it (a no-op on CPU or without a
    device)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall-clock seconds of a block's device work: the device is synchronised before the clock
    starts and again before it stops (queued GPU kernels are counted, not left running).

        with Stopwatch(device) as watch:
            step()
        watch.seconds
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device, self.seconds, self._t0 = device, 0.0, 0.0

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self._t0


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(device: torch.device, precision: str | None = None) -> dict:
    """Where the numbers come from: device, its name, threads, cores, torch, CUDA and Python
    versions."""
    return {"device": str(device), "device_name": device_name(device),
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "precision": precision,
            "python": platform.python_version()}


def describe(device: torch.device) -> str:
    """One line for reports: the device name with the core count (CPU) ."""
    name = device_name(device)
    return name if device.type == "cuda" else f"{name}, {os.cpu_count()} cores"


def rng_state(device: torch.device) -> dict:
    """The random number generators' state (CPU, and CUDA on a CUDA device), for checkpoints."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None}


def set_rng_state(rng: dict, device: torch.device) -> None:
    """Restore `rng_state`'s result; CUDA states only for the GPUs this machine has (it may have
    fewer)."""
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and rng.get("cuda"):
        for i, state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, i)
