"""Process memory: let glibc keep freed memory for reuse instead of returning it to the OS.

A training step allocates and frees the same large tensors every time (the logits of a 4096-token
batch over an 8000-word vocabulary are 65-130 MB). glibc serves blocks above its mmap threshold
(32 MB at most) with fresh pages from the kernel and unmaps them on free, so every step faults in
and zeroes hundreds of megabytes again: about 190k page faults per step on Multi30k, 20-30% of the
step time on a 2-core CPU (`scripts/malloc_check.py`). Serving every block from the heap and never
trimming it removes that cost; the price is that the process keeps its peak memory until it exits.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters, from glibc's malloc.h


def reuse_freed_memory() -> bool:
    """Apply the setting for this process; True when it took effect.

    Off with the environment variable ATTN_MT_MALLOC=system, and a no-op where the C library is not
    glibc (macOS, Windows, musl): those allocators have no `mallopt` or need no help.
    """
    if os.environ.get("ATTN_MT_MALLOC") == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
