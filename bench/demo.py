"""How reliably `make demo` shows the loop on the embedded model.

Each run makes a fresh workspace from example_workspace/ (as `make demo` does) and runs
`primefs run --once` in a new process, so every run pays the server start like a newcomer does.
Counted per run: cells the session ran, whether result.md contains 391 (17 * 23), wall time.
`--model local` runs the demo goal on the plain `local` alias instead of `local-demo` (no grammar on
the first reply): the model unconstrained, as the demo ran before.

    python bench/demo.py [-n 10] [--model ALIAS] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parent.parent


def primefs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "primefs", *args], capture_output=True, text=True, timeout=600)


def one_run(root: Path, model: str | None) -> dict:
    init = primefs("init", "--from", str(REPO / "example_workspace"), str(root))
    if init.returncode:
        raise SystemExit(f"init failed: {init.stderr}")
    if model:
        goal = root / "goals" / "demo.md"
        text = goal.read_text()
        goal.write_text("\n".join(f"model: {model}" if line.startswith("model:") else line
                                  for line in text.split("\n")))
    started = time.monotonic()
    run = primefs("-w", str(root), "run", "--once", "-v")  # as `make demo` runs it
    wall = time.monotonic() - started
    cells, replies, result = 0, [], ""
    for d in sorted(p.parent for p in (root / "sessions").glob("*/history.jsonl")):
        for line in (d / "history.jsonl").read_text().splitlines():
            e = json.loads(line)
            cells += e["type"] == "cell"
            if e["type"] == "assistant":
                replies.append(e.get("text") or "")
        if (d / "result.md").exists():
            result += (d / "result.md").read_text()
    return {"rc": run.returncode, "cells": cells, "result": result.strip(), "has_391": "391" in result,
            "wall_s": round(wall, 1), "first_reply": replies[0] if replies else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10, help="runs (default 10)")
    ap.add_argument("--model", help="alias for the demo goal (default: the goal's own, local-demo)")
    ap.add_argument("--keep", help="keep the workspaces in this folder (default: a temp folder, removed)")
    args = ap.parse_args()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="primefs-demo-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    runs = []
    try:
        for i in range(args.n):
            r = one_run(base / f"ws-{i}", args.model)
            runs.append(r)
            print(f"run {i + 1}: rc {r['rc']}, cells {r['cells']}, 391 {'yes' if r['has_391'] else 'no'}, "
                  f"{r['wall_s']} s, result {r['result'][:60]!r}", flush=True)
            print(f"   first reply: {r['first_reply'][:160]!r}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    n = len(runs)
    walls = [r["wall_s"] for r in runs]
    print(f"\n{n} runs: {sum(r['cells'] > 0 for r in runs)} ran >= 1 cell, "
          f"{sum(r['has_391'] for r in runs)} have 391 in the result, "
          f"wall time mean {statistics.mean(walls):.1f} s, median {statistics.median(walls):.1f} s, "
          f"range {min(walls):.1f}-{max(walls):.1f} s")


if __name__ == "__main__":
    main()
