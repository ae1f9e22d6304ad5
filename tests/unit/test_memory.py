"""runner/memory.py: a runner that runs for days gives back what malloc keeps of freed memory (a process of its
own: the settings are for the life of the process)."""
from __future__ import annotations

import subprocess
import sys

CODE = """
import time
from primefs.runner import memory

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

kept = [bytearray(1000) for _ in range(200_000)][::64]  # ~200 MB through malloc, 1 block in 64 kept: holes
before = rss_mib()
memory.TRIM_S = 0.1
assert memory.keep_flat()  # (after `before`: its thread trims only once TRIM_S has passed)
deadline = time.monotonic() + 20
while rss_mib() > before - 100 and time.monotonic() < deadline:
    time.sleep(0.05)
print(before, rss_mib())
"""


def test_freed_memory_between_live_blocks_is_given_back():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after = map(float, out.stdout.split())
    assert before > 150 and after < before - 100, (before, after)  # (without trimming it stays ~before)
