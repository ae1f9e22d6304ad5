"""Single-session latencies with an instant model.

- step overhead, harness only: a session runs 50 trivial cells with the scripted provider (no HTTP,
  no litellm); from the end of one model call to the start of the next, minus the cell's run time.
- step overhead as a user sees it: the same 50 cells with the model behind litellm and a local
  OpenAI-compatible HTTP server (tests/openai_server.py); from the server answering one request to
  the next request arriving, minus the cell's run time: litellm's client, both ways, is included.
- goal -> answer with the runner already running (`primefs run`): a goal file appears; time until
  result.md exists (one cell, then the answer). Repeated 10 times; median.
- goal -> first model request with the runner already running (litellm, the local HTTP server): a goal
  file renamed into goals/; time until the server reads the session's first request. 15 goals.
- with --ray: the harness-only step overhead with the kernel on a local 3-node Ray cluster, beside the
  same on the local host, alternating, 3 runs each (in a loopback-only network namespace, as
  bench/fanout.py --ray).

    python bench/latency.py
    unshare -rn sh -c 'ip link set lo up && exec python bench/latency.py --ray'
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import configure_model, run_cli, scripted_workspace, step_overheads

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from openai_server import ScriptServer  # noqa: E402

from primefs.store.session import list_sessions  # noqa: E402

STEPS = 50
STEP_REPLIES = [{"code": f"x = {i}"} for i in range(STEPS)] + [{"text": "steps done"}]
SCRIPT = """\
rules:
  - match: "^Steps"
    replies:
""" + "".join("      - code: \"x = %d\"\n" % i for i in range(STEPS)) + """\
      - text: "steps done"
  - match: "^Quick"
    replies:
      - code: "y = 6 * 7"
      - text: "42"
"""


def _stats(values: list[float]) -> dict:
    v = sorted(values)
    return {"median_ms": round(statistics.median(v) * 1000, 2), "p90_ms": round(v[int(len(v) * 0.9)] * 1000, 2)}


def steps_harness_only(ray: str | None = None) -> dict:
    ws = scripted_workspace(SCRIPT, {"max_steps_per_turn": 100, "loop_window": 0, "loop_repeat": 0})
    (ws.goals / "steps.md").write_text("Steps\n")
    _, _, r = run_cli(ws, "run", "--once", "--quiet", *(["--ray", ray] if ray else []))
    s = list_sessions(ws.sessions)[0]
    assert s.read_result() == "steps done", r.stderr
    return {"steps": STEPS, **_stats(step_overheads(s.events()))}


def steps_with_litellm() -> dict:
    with ScriptServer(STEP_REPLIES) as server:
        ws = scripted_workspace(SCRIPT, {"max_steps_per_turn": 100, "loop_window": 0, "loop_repeat": 0})
        configure_model(ws, {"model": "openai/test-model", "api_base": server.url, "api_key": "k",
                             "tool_mode": "native"})
        (ws.goals / "steps.md").write_text("Steps\n")
        _, _, r = run_cli(ws, "run", "--once", "--quiet")
        s = list_sessions(ws.sessions)[0]
        assert s.read_result() == "steps done", r.stderr
        cells = [c["elapsed_s"] for c in s.events("cell")]
        t = server.timings
        user = [t[i + 1][0] - t[i][1] - cells[i] for i in range(len(cells))]
        return {"steps": len(user), "user_view": _stats(user), "harness_only": _stats(step_overheads(s.events()))}


def goal_to_answer(repeats: int = 10) -> dict:
    ws = scripted_workspace(SCRIPT)
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--quiet"])
    try:
        time.sleep(3)  # let the runner start and its kernel template import
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


def goal_to_first_request(repeats: int = 15) -> dict:
    """A runner up (`primefs run`, litellm against the local HTTP server): a goal file renamed into goals/ (as
    `primefs goal` and the Python API write it), until its first model request reaches the server."""
    with ScriptServer([{"text": "42"}] * (repeats + 2)) as server:
        ws = scripted_workspace(SCRIPT)
        configure_model(ws, {"model": "openai/test-model", "api_base": server.url, "api_key": "k", "tool_mode": "native"})
        proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--quiet"])
        try:
            def ask(name: str) -> float:
                count = len(server.timings)
                tmp = ws.goals / f".{name}.tmp"
                tmp.write_text("Quick question\n")
                started = time.time()
                tmp.rename(ws.goals / f"{name}.md")
                while len(server.timings) == count:
                    time.sleep(0.0005)
                return server.timings[count][0] - started

            ask("warm")  # the runner's start, litellm's import, the first kernel: not what is measured
            times = []
            for i in range(repeats):
                times.append(ask(f"g{i}"))
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(30)
    return {"goal_to_first_request_ms": _stats(times)}


def steps_ray_and_local(runs: int = 3) -> None:
    from fanout import local_cluster

    cluster = local_cluster()
    try:
        for _ in range(runs):
            print(json.dumps({"step_overhead_harness_only_local": steps_harness_only()}), flush=True)
            print(json.dumps({"step_overhead_harness_only_ray": steps_harness_only(cluster.address)}), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    if "--ray" in sys.argv:
        steps_ray_and_local()
        raise SystemExit(0)
    print(json.dumps({"step_overhead_harness_only": steps_harness_only()}))
    print(json.dumps({"step_overhead_with_litellm": steps_with_litellm()}))
    print(json.dumps(goal_to_answer()))
    print(json.dumps(goal_to_first_request()))
