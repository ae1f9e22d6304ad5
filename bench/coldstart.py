"""Cold start with a litellm-backed model, whose calls go over HTTP to a scripted OpenAI-compatible server on
loopback (tests/openai_server.py). Reports, per run, the seconds from process start to the session's
`turn_start`, to its first `model_call` recorded (the first call pays for `import litellm` unless it was
begun earlier), and to the process's exit. Three ways in:

- `run`: `primefs run --once` of one goal;
- `ask`: `primefs ask` with no runner up (a runner in the ask process);
- `ask-kept`: a second `primefs ask` of a workspace where the first one ran with `--keep-alive`,
  so the runner it started is still up (cli.md, "Keep-alive").

    python bench/coldstart.py                          # 4 runs of this source tree; medians of the last 3
    python bench/coldstart.py --before /tmp/old-src    # also with another source tree on PYTHONPATH
                                                       # (e.g. `git archive main primefs | tar -x -C /tmp/old-src`)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import configure_model, scripted_workspace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from openai_server import ScriptServer  # noqa: E402

HERE = str(Path(__file__).resolve().parent.parent)
RUNS = 4


def primefs(ws, pythonpath: str, *args: str) -> tuple[float, float]:
    """Run `primefs -w ws ARGS`: (its start, its end) as time.time()."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # bytecode cached
    env["PYTHONPATH"] = pythonpath
    started = time.time()
    r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), *args], env=env,
                       capture_output=True, text=True, timeout=300)
    ended = time.time()
    if r.returncode != 0:
        raise SystemExit(f"primefs {' '.join(args)} failed: {r.stderr[-2000:]}")
    return started, ended


def first_events(ws, started: float) -> tuple[float, float]:
    """(turn_start, first model_call) of the session made after `started`, as seconds since `started`."""
    folder = max((p for p in ws.sessions.iterdir() if p.is_dir()), key=lambda p: p.name)
    events = [json.loads(line) for line in open(folder / "history.jsonl")]
    turn = next(e["ts"] for e in events if e["type"] == "turn_start")
    call = next(e["ts"] for e in events if e["type"] == "model_call")
    return turn - started, call - started


def once(pythonpath: str, how: str) -> tuple[float, float, float]:
    with ScriptServer([{"code": "y = 6 * 7"}, {"text": "42"}]) as server:
        ws = scripted_workspace("rules: []\n")
        configure_model(ws, {"model": "openai/test-model", "api_base": server.url, "api_key": "k",
                             "tool_mode": "native"})
        try:
            if how == "run":
                (ws.goals / "q.md").write_text("Quick\n")
                started, ended = primefs(ws, pythonpath, "run", "--once", "-q")
            elif how == "ask":
                started, ended = primefs(ws, pythonpath, "ask", "Quick")
            else:  # the first ask starts the keep-alive runner; the second is measured
                primefs(ws, pythonpath, "ask", "--keep-alive", "60", "Warm up")
                started, ended = primefs(ws, pythonpath, "ask", "Quick")
            turn, call = first_events(ws, started)
        finally:
            if how == "ask-kept":
                primefs(ws, pythonpath, "down")
            shutil.rmtree(ws.root.parent, ignore_errors=True)
        return round(turn, 2), round(call, 2), round(ended - started, 2)


def main(before: str | None, ways: list[str]) -> None:
    for how in ways:
        for label, path in ([("before", before)] if before else []) + [("now", HERE)]:
            runs = [once(path, how) for _ in range(RUNS)]  # the first one warms the page cache
            medians = [round(statistics.median(r[i] for r in runs[1:]), 2) for i in range(3)]
            print(json.dumps({"way": how, "source": label, "runs": runs, "turn_start_s": medians[0],
                              "first_model_call_s": medians[1], "exit_s": medians[2]}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[args.index("--before") + 1] if "--before" in args else None,
         [a for a in ("run", "ask", "ask-kept") if a in args] or ["run", "ask", "ask-kept"])
