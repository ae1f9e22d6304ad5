"""primefs-ruler's generators: N items of each benchmark at a size, timed, hashed twice in two processes.

    python bench/ruler.py                       # 1,000 items at 1,000,000 characters each
    python bench/ruler.py --items 100 --chars 4000000

Each benchmark runs in a fresh process, twice: the time to make the N items (the data's first load
counted apart), the time of their oracle, and a sha256 of all items' bytes, which must be the same in
both processes (items are made from their seed alone).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import hashlib, json, sys, time
import primefs_ruler as r
bench = {b.name: b for b in r.BENCHMARKS}[sys.argv[1]]
n, chars = int(sys.argv[2]), int(sys.argv[3])
t = time.perf_counter()
bench.make(__import__('random').Random('warm-up'), 2_000)  # loads the data
load = time.perf_counter() - t
h, made, solved, size = hashlib.sha256(), 0.0, 0.0, 0
it = bench.items(n, 0, chars=chars)
for _ in range(n):
    t = time.perf_counter()
    item = next(it)
    made += time.perf_counter() - t
    t = time.perf_counter()
    assert bench.score(bench.oracle(item), item['expected']) == 1.0
    solved += time.perf_counter() - t
    h.update(json.dumps(item, sort_keys=True).encode())
    size += len(item['context'])
print(json.dumps({'load': load, 'made': made, 'solved': solved, 'sha': h.hexdigest(), 'chars': size / n}))
"""


def run(name: str, n: int, chars: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, name, str(n), str(chars)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--chars", type=int, default=1_000_000)
    args = ap.parse_args()
    import primefs_ruler

    print(f"{args.items:,} items at {args.chars:,} characters")
    print("| benchmark | data load | make all items | oracle, all items | mean context chars | same bytes twice |")
    print("|---|---:|---:|---:|---:|---|")
    for bench in primefs_ruler.BENCHMARKS:
        a, b = run(bench.name, args.items, args.chars), run(bench.name, args.items, args.chars)
        print(f"| {bench.name} | {a['load']:.2f} s | {a['made']:.1f} s | {a['solved']:.1f} s | {a['chars']:,.0f} "
              f"| {'yes' if a['sha'] == b['sha'] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
