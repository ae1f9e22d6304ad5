"""Benchmark generators at long-context sizes: time to make an item, its oracle's time, peak memory.

    python bench/generators.py            # every case, 3 items each
    python bench/generators.py --items 5

Each case runs in a fresh process (so peak memory is that case's alone): generation time per item
(median), oracle time per item (median), peak RSS growth over the process after its imports
(VmHWM - VmRSS before the first item), and the context size.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CASES = [
    ("needle", "primefs_needle", "NeedleBenchmark()", {"chars": 1_000_000}),
    ("needle", "primefs_needle", "NeedleBenchmark()", {"chars": 4_000_000}),
    ("needle", "primefs_needle", "NeedleBenchmark()", {"chars": 10_000_000}),
    ("needle, 3 keys", "primefs_needle", "NeedleBenchmark()", {"chars": 10_000_000, "keys": 3}),
    ("aggregate", "primefs_aggregate", "AggregateBenchmark('explicit')", {"lines": 2000}),
    ("aggregate", "primefs_aggregate", "AggregateBenchmark('explicit')", {"lines": 5000}),
    ("aggregate-inferred", "primefs_aggregate", "AggregateBenchmark('inferred')", {"lines": 5000}),
    ("pairs", "primefs_pairs", "PairsBenchmark('explicit')", {}),
    ("pairs", "primefs_pairs", "PairsBenchmark('explicit')", {"lines": 5000}),
    ("pairs-inferred", "primefs_pairs", "PairsBenchmark('inferred')", {"lines": 5000}),
]

CHILD = r"""
import json, sys, time
def kib(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1])
import {module} as m
bench = m.{ctor}
params, n = json.loads(sys.argv[1]), int(sys.argv[2])
base = kib('VmRSS')
made, solved, size = [], [], 0
for i in range(n):
    t = time.perf_counter()
    item = next(bench.items(1, i, **params))
    made.append(time.perf_counter() - t)
    t = time.perf_counter()
    assert bench.score(bench.oracle(item), item['expected']) == 1.0
    solved.append(time.perf_counter() - t)
    size = len(item['context'])
    del item
print(json.dumps({{'made': made, 'solved': solved, 'peak_mib': (kib('VmHWM') - base) / 1024, 'chars': size}}))
"""


def run_case(module: str, ctor: str, params: dict, n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(module=module, ctor=ctor), json.dumps(params), str(n)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=3)
    args = ap.parse_args()
    print("| benchmark | parameters | context chars | make an item (median) | oracle (median) | peak memory |")
    print("|---|---|---:|---:|---:|---:|")
    for name, module, ctor, params in CASES:
        r = run_case(module, ctor, params, args.items)
        shown = ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in params.items()) or "defaults"
        print(f"| {name} | {shown} | {r['chars']:,} | {statistics.median(r['made']) * 1000:,.0f} ms "
              f"| {statistics.median(r['solved']) * 1000:,.0f} ms | {r['peak_mib']:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
