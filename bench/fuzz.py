"""Long fuzzing of the runner: batches of generated bad files (goals, mail, session.yaml, harness entries,
heartbeats; wrong types, NaN, huge or nested YAML, NUL bytes, folders and links where files belong) are
planted in fresh workspaces, each batch followed by `primefs run --once` and `primefs status`.

Counts runner crashes, tracebacks shown, hot loops (a run over its time limit or a history that
explodes) and bad files nobody reported. tests/test_fuzz.py runs the same, bounded.

    python bench/fuzz.py              # 2,000 files (about 150 batches)
    python bench/fuzz.py 500
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzzfiles import bad_files, fuzz_workspace, plant, run_and_check  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class Enough(Exception):
    """Ends hypothesis's generation once enough files were tried."""


def main(total_files: int) -> dict:
    totals = {"files": 0, "batches": 0, "crashes": 0, "tracebacks": 0, "hot_loops": 0, "unreported": [],
              "by_kind": {}, "slowest_batch_s": 0.0}
    started = time.monotonic()

    @settings(max_examples=10**6, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.lists(bad_files, min_size=8, max_size=20))
    def batch(files):
        if totals["files"] >= total_files:
            raise Enough()
        ws, target = fuzz_workspace()
        planted = plant(ws, files, target)
        outcome = run_and_check(ws, planted)
        totals["files"] += len(files)
        totals["batches"] += 1
        totals["crashes"] += outcome["crash"]
        totals["tracebacks"] += outcome["traceback"]
        totals["hot_loops"] += outcome["hot_loop"]
        totals["unreported"] += outcome["unreported"]
        totals["slowest_batch_s"] = max(totals["slowest_batch_s"], outcome["seconds"])
        for kind, _, shape in files:
            key = f"{kind}/{shape}"
            totals["by_kind"][key] = totals["by_kind"].get(key, 0) + 1
        if totals["batches"] % 10 == 0:
            print(f"{totals['files']} files, {totals['batches']} batches, {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
        if outcome["crash"] or outcome["traceback"] or outcome["hot_loop"] or outcome["unreported"]:
            print(json.dumps({"problem": outcome, "workspace": str(ws.root)}, default=str), file=sys.stderr,
                  flush=True)

    try:
        batch()
    except Enough:
        pass
    totals["seconds"] = round(time.monotonic() - started, 1)
    return totals


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000), indent=1))
