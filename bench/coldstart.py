"""Cold start with a litellm-backed model: `primefs run --once` of one goal whose two model calls go over
HTTP to a scripted OpenAI-compatible server on loopback (tests/openai_server.py). Reports, per run, the
seconds from process start to the goal's `turn_start`, to its first `model_call` recorded (the first
call pays for `import litellm` unless it was begun earlier), and to the process's exit.

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


def once(pythonpath: str) -> tuple[float, float, float]:
    with ScriptServer([{"code": "y = 6 * 7"}, {"text": "42"}]) as server:
        ws = scripted_workspace("rules: []\n")
        configure_model(ws, {"model": "openai/test-model", "api_base": server.url, "api_key": "k",
                             "tool_mode": "native"})
        (ws.goals / "q.md").write_text("Quick\n")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # bytecode cached
        env["PYTHONPATH"] = pythonpath
        started = time.time()
        r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--once", "-q"], env=env,
                           capture_output=True, text=True, timeout=300)
        ended = time.time()
        if r.returncode != 0:
            raise SystemExit(f"run --once failed: {r.stderr[-2000:]}")
        folder = next(p for p in ws.sessions.iterdir() if p.is_dir())
        events = [json.loads(line) for line in open(folder / "history.jsonl")]
        shutil.rmtree(ws.root.parent, ignore_errors=True)
        turn = next(e["ts"] for e in events if e["type"] == "turn_start")
        call = next(e["ts"] for e in events if e["type"] == "model_call")
        return round(turn - started, 2), round(call - started, 2), round(ended - started, 2)


def main(before: str | None) -> None:
    for label, path in ([("before", before)] if before else []) + [("now", HERE)]:
        runs = [once(path) for _ in range(RUNS)]  # the first one warms the page cache
        medians = [statistics.median(r[i] for r in runs[1:]) for i in range(3)]
        print(json.dumps({"source": label, "runs": runs, "turn_start_s": medians[0], "first_model_call_s": medians[1],
                          "exit_s": medians[2]}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[args.index("--before") + 1] if "--before" in args else None)
