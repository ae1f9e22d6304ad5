"""A runner's memory over days: what glibc's malloc keeps of what was freed, given back.

Under steady work a runner's live objects stay flat, yet its RSS grows: memory freed and kept by the
allocators (docs/reliability.md, "Leaks over time"). malloc gives back only the top of its heaps unless
asked, and keeps a heap per thread that allocated at the same moment as another. `primefs run` (not
`--once`; `up` runs it) asks for one heap and gives its free pages back every TRIM_S seconds: in a
program that uses primefs in process nothing is changed. Only where the C library is glibc.
"""
from __future__ import annotations

import os
import sys
import threading
import time

TRIM_S = 30.0
M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)


def keep_flat() -> bool:
    """For the life of this process: one malloc heap for every thread, its free pages given back every TRIM_S
    seconds (a daemon thread). False (nothing done) where the C library is not glibc."""
    try:
        glibc = sys.platform == "linux" and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError, AttributeError):
        glibc = False
    if not glibc:
        return False
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mallopt(M_ARENA_MAX, 1)

    def trim() -> None:
        while True:
            time.sleep(TRIM_S)
            libc.malloc_trim(0)

    threading.Thread(target=trim, name="primefs-trim", daemon=True).start()
    return True
