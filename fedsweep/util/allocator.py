"""Keep freed tensor memory in the process instead of handing it back to the kernel at every op.

A federated round allocates and frees many (K, n) tensors of the same few sizes: the FedLGA MLP's
client states are 10 × 30,010 floats, 1.2 MB. glibc serves blocks above its mmap threshold
(128 KB at start, raised on the fly to the size of the last freed mmap'd block) with ``mmap`` and
returns them with ``munmap``, and trims the heap back to the kernel once 2 × that threshold is free
at its top. Both make the next tensor of that size come back as fresh pages: one page fault and a
zeroed page every 4 KB, ~300 per state tensor. Measured on 2 CPU cores, 12 trials of
``sweeps/fedlga.yaml`` in one process (1 thread, ``benchmarks/README.md``): 890,000 minor faults,
1.2 s of kernel time and 7.2 s of wall time as glibc sets it, 5,000 faults, 0.02 s and 5.3 s with
the thresholds below; two such processes side by side contend in the kernel and lose more.

``keep_freed_memory()`` raises both thresholds once per process (``mallopt``): tensors up to 32 MB
come from the heap, and up to 128 MB of freed heap stay in the process. A process's resident memory
is then its peak, which a training process reaches in its first round anyway. Elsewhere than glibc
(macOS, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1   # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once per process; True if they are set (glibc only)."""
    global _done
    if _done is None:
        _done = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):   # not glibc (musl has no mallopt)
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
