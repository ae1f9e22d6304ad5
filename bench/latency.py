"""Single-session latencies with a scripted instant model.

- harness overhead per step: a session runs 50 trivial cells in a row; time from a model reply
  to the next model request, minus the cell's own run time (median and p90).
- goal -> answer with the runner already running (`primefs run`): a goal file appears; time until
  result.md exists (one cell, then the answer). Repeated 10 times; median.

    python bench/latency.py
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from common import run_cli, scripted_workspace, step_overheads

from primefs.session import list_sessions

SCRIPT = """\
rules:
  - match: "^Steps"
    replies:
""" + "".join("      - code: \"x = %d\"\n" % i for i in range(50)) + """\
      - text: "steps done"
  - match: "^Quick"
    replies:
      - code: "y = 6 * 7"
      - text: "42"
"""


def steps() -> dict:
    ws = scripted_workspace(SCRIPT, {"max_steps_per_turn": 100})
    (ws.goals / "steps.md").write_text("Steps\n")
    wall, peak, r = run_cli(ws, "run", "--once", "--quiet")
    s = list_sessions(ws.sessions)[0]
    assert s.read_result() == "steps done", r.stderr
    o = sorted(step_overheads(s.events()))
    return {"steps": len(o) + 1, "overhead_per_step_ms_median": round(statistics.median(o) * 1000, 2),
            "overhead_per_step_ms_p90": round(o[int(len(o) * 0.9)] * 1000, 2)}


def goal_to_answer(repeats: int = 10) -> dict:
    ws = scripted_workspace(SCRIPT)
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--quiet"])
    try:
        time.sleep(3)  # let the runner start and warm its kernel pool
        times = []
        for i in range(repeats):
            started = time.monotonic()
            (ws.goals / f"q{i}.md").write_text("Quick question\n")
            while True:
                done = [s for s in list_sessions(ws.sessions) if s.meta.get("goal") == f"goals/q{i}.md"
                        and s.read_result() == "42"]
                if done:
                    break
                time.sleep(0.002)
            times.append(time.monotonic() - started)
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"goal_to_answer_s_median": round(statistics.median(times), 3),
            "goal_to_answer_s_max": round(max(times), 3)}


if __name__ == "__main__":
    print(json.dumps(steps()))
    print(json.dumps(goal_to_answer()))
