"""A kernel's memory over many cells: a session's kernel lives for days, so what it keeps of each cell must
be bounded (it keeps its last 1,000 cells: primefs/kernels/inside/cells.py).

    python bench/cells.py              # 5,000 cells that each print 10 KB
    python bench/cells.py 20000 1000   # 20,000 cells that each print 1 KB

Prints the kernel's RSS every tenth of the run (cells so far, MiB), then JSON: RSS at the start, after the
first 1,000 cells and at the end, and the growth per 1,000 cells after the first 1,000.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from primefs.cli.daemon import proc_memory
from primefs.kernels.host import KernelSpec
from primefs.kernels.local import LocalKernelHost


def rss_mib(pid: int) -> float:
    return round(proc_memory(pid)["rss_kb"] / 1024, 1)


def main(cells: int = 5000, printed: int = 10_000) -> dict:
    root = Path(tempfile.mkdtemp(prefix="primefs-bench-cells-"))
    host = LocalKernelHost(root / "rt", root, lambda *a: None)
    try:
        k = host.start(KernelSpec("s", root))
        k.execute("print(1)", timeout=60)
        samples = {0: rss_mib(k.pid)}
        started = time.monotonic()
        for i in range(1, cells + 1):
            # a new cell each time (the same code would share its cached lines), printing `printed` bytes
            assert k.execute(f"print('x' * {printed - 8}, {i:6d})", timeout=60).error is None
            if i % max(1, cells // 10) == 0 or i in (1000, cells):
                samples[i] = rss_mib(k.pid)
                print(f"cells={i} rss_mib={samples[i]}", file=sys.stderr, flush=True)
        after = min(1000, cells)
        return {"cells": cells, "printed_bytes": printed, "seconds": round(time.monotonic() - started, 1),
                "rss_mib_start": samples[0], "rss_mib_after_1000": samples[after], "rss_mib_end": samples[cells],
                "mib_per_1000_cells_after_1000":
                    round((samples[cells] - samples[after]) * 1000 / max(1, cells - after), 2)}
    finally:
        host.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main(*[int(a) for a in sys.argv[1:3]]), indent=1))
