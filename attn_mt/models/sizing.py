"""A model's size: its weights (`count_params`), and whether it fits in memory, known before it is
built: the model as shapes only (`shapes_only`: on the meta device, nothing initialised), and
`check_memory`, which compares what its weights and tables need with what this process can still
allocate.

Tested in tests/models/test_size_check.py.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from attn_mt.config import ConfigError, ModelConfig


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class NoInit(TorchFunctionMode):
    """Initialisers and in-place fills do nothing (on meta tensors some cost seconds of imports); a
    torch function mode holds for this thread only, so a model built meanwhile in another is
    initialised."""

    SKIP = frozenset({"normal_", "uniform_", "trunc_normal_", "xavier_uniform_", "xavier_normal_",
                      "kaiming_uniform_", "kaiming_normal_", "zeros_", "ones_", "constant_",
                      "zero_", "fill_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.SKIP:
            return args[0] if args else next(iter((kwargs or {}).values()))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Modules built inside have their shapes only: on the meta device, not initialised."""
    with torch.device("meta"), NoInit():
        yield


# a table's name -> the config keys that size it
KEYS = {"pos.pe": ("model.max_positions", "model.d_model"),
        "embed": ("tokenizer.vocab_size", "model.d_model"),
        "out_proj.weight": ("tokenizer.vocab_size", "model.d_model")}


def check_memory(cfg: ModelConfig, shapes: nn.Module) -> None:
    """Refuse (ConfigError naming the largest table and its keys) a model whose float32 weights and
    tables, with the temporaries that compute its sinusoids, need more memory than this process
    can still get."""
    tables = dict([*shapes.named_parameters(), *shapes.named_buffers()])
    need = sum(t.numel() * 4 for t in tables.values())
    need += sum(3 * t.numel() * 4 for n, t in shapes.named_buffers()
                if n.endswith("pos.pe"))  # float64 sin, cos
    free = memory_free()
    if need <= free:
        return
    name, big = max(tables.items(), key=lambda kv: kv[1].numel())
    keys = next((v for k, v in KEYS.items() if k in name),
                ("model.d_model", "model.d_ff", "model.n_layers"))
    raise ConfigError(f"{keys[0]}: the model needs {need / 2**30:.1f} GiB ({name} "
                      f"{tuple(big.shape)}: {big.numel() * 4 / 2**30:.1f} GiB, sized by "
                      f"{' and '.join(keys)}), more than the {free / 2**30:.1f} GiB of memory this "
                      "process can get; make it smaller", keys[0])


def memory_free() -> int:
    """Bytes this process can still allocate: the system's available memory (Linux: MemAvailable),
    less where an address-space limit (ulimit -v, RLIMIT_AS) is nearer."""
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("MemAvailable:"))
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, StopIteration, ValueError):
        return free
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return free if soft == resource.RLIM_INFINITY else min(free, soft - used)
