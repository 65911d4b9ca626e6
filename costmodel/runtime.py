"""Process settings that make the vectorised batch path fast. Called by entry points, never on import.

Scoring 100,000 configs allocates and frees tens of megabytes of numpy temporaries per call. With
glibc's defaults every such block above the (dynamic) mmap threshold is a fresh mmap whose pages
fault in one by one and go back to the kernel on free: 20-30 % of the batch path's time. Raising the
mmap and trim thresholds keeps those blocks in the heap for reuse (the effect of starting Python with
MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 256 * 2**20
_done = False


def tune_allocator() -> bool:
    """Apply the thresholds once per process; returns False where the C library is not glibc."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    _done = ok
    return ok
