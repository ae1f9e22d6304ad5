"""`python bench/allocators.py OUT -w WS run ...`: `primefs ...` with a thread that writes, every 10 s, what the
process's allocators hold and what of it is live, to the JSON file OUT (replaced whole each time). bench/leaks.py
runs its runner this way: RSS that grows while the live memory stays flat is memory the allocators keep
(fragmentation), not a leak.

    py_mib / py_live_mib          Python's allocator (objects up to 512 bytes): its 1 MiB arenas / blocks in use
    malloc_mib / malloc_live_mib  glibc's malloc (bigger objects, C libraries): its heap and maps / chunks in use
    objects                       objects the cycle collector tracks (containers)
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import runpy
import sys
import tempfile
import threading
import time

EVERY_S = 10.0


class MallInfo2(ctypes.Structure):  # malloc.h (glibc 2.33+)
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def pymalloc() -> dict:
    """Python's allocator, from sys._debugmallocstats (which only prints, to fd 2: borrowed for the call)."""
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        stats = {}
        for line in out:
            key, _, value = line.partition("=")
            if "bytes/arena" in key or key.startswith("# bytes in allocated blocks"):
                stats["py_live_mib" if key.startswith("#") else "py_mib"] = int(value.replace(",", ""))
    return stats


def sample() -> dict:
    row = pymalloc()
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = MallInfo2
        m = libc.mallinfo2()
        row.update(malloc_mib=m.arena + m.hblkhd, malloc_live_mib=m.uordblks + m.hblkhd)
    except (AttributeError, OSError):  # not glibc, or older than 2.33
        pass
    row = {k: round(v / (1 << 20), 1) for k, v in row.items()}
    row["objects"] = len(gc.get_objects())
    return row


def write_samples(path: str) -> None:
    while True:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(sample(), f)
        os.replace(tmp, path)
        time.sleep(EVERY_S)


if __name__ == "__main__":
    threading.Thread(target=write_samples, args=(sys.argv[1],), name="allocators", daemon=True).start()
    sys.argv = ["primefs", *sys.argv[2:]]
    runpy.run_module("primefs", run_name="__main__", alter_sys=True)
