"""Helpers for the long-use tests: a real fan-out run (scripted model), copies of its session trees
(bench/bigworkspace.py's Copier: new ids, parents, senders and times), a full recount of usage."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import configure, run_once

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bigworkspace import Copier  # noqa: E402

from primefs.store.history import iter_events  # noqa: E402
from primefs.store.workspace import git_env  # noqa: E402

FAN = """\
rules:
  - match: "^Fan out"
    replies:
      - code: "hs = [rlm(f'child {i}') for i in range(3)]\\nprint(wait_all(hs))"
      - code: "done('all done')"
      - code: "print(send('children', 'ping'))"
      - text: "pinged"
  - match: "^child"
    replies:
      - code: "print(llm('a question'))"
      - code: "done('ok')"
      - text: "pong"
default:
  - text: "an answer"
"""


def fan_out(ws, goal: str = "fan", extra: str = "") -> object:
    """A real run: a root that fans out to three children (model calls from turns and from llm())."""
    (ws.root / "fan.yaml").write_text(FAN)
    ws = configure(ws, model="scripted/fan.yaml")
    (ws.goals / f"{goal}.md").write_text(f"{extra}Fan out to children\n")
    run_once(ws)
    return ws


def grow(ws, copies: int, parent: str | None = None) -> list[str]:
    """`copies` more copies of the workspace's first session tree (as it is now), committed. With
    `parent`, each copy's root becomes a child of that session (one big tree)."""
    copier = Copier(ws.root)
    start = time.time() - 10 * 86400
    made = []
    for tag in range(1, copies + 1):
        made += copier.copy(ws.sessions, start + tag * 60, len(copier.ids), tag, parent=parent)
    subprocess.run(["git", "-C", str(ws.root), "add", "-A", "sessions"], check=True, env=git_env())
    subprocess.run(["git", "-C", str(ws.root), "commit", "-qm", f"{copies} copies"], check=True, env=git_env())
    return made


def recount(folder: Path) -> tuple[dict, int]:
    """Own usage and turns, counted from every event of history.jsonl as docs/cli.md defines them."""
    u = {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0,
         "cost_usd": 0.0, "wall_s": 0.0, "cost_unknown_calls": 0, "tool_calls": 0, "tools": {}}
    turns = 0
    for e in iter_events(Path(folder) / "history.jsonl"):
        if e["type"] == "model_call":
            u["calls"] += 1
            u["input_tokens"] += e["input_tokens"]
            u["output_tokens"] += e["output_tokens"]
            u["cache_read_tokens"] += e.get("cache_read_tokens", 0)  # in the event only when not 0
            u["cache_write_tokens"] += e.get("cache_write_tokens", 0)
            u["cost_usd"] += e["cost_usd"]
            u["cost_unknown_calls"] += 0 if e["cost_known"] else 1
        elif e["type"] == "turn_end":
            u["wall_s"] += e["elapsed_s"]
        elif e["type"] == "tool_call":
            u["tool_calls"] += 1
            t = u["tools"].setdefault(e["name"], {"calls": 0, "errors": 0, "seconds": 0.0})
            t["calls"] += 1
            t["errors"] += 1 if e["error"] else 0
            t["seconds"] = round(t["seconds"] + e["duration_s"], 4)
        elif e["type"] == "turn_start" and not e.get("resumed"):
            turns += 1
    u["cost_usd"], u["wall_s"] = round(u["cost_usd"], 10), round(u["wall_s"], 4)
    return u, turns

