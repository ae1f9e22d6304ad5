"""Usage from history: every model call is recorded once, by the session that made it.

`own` sums a session's `model_call` events; `tree` sums own over the session and all its
descendants (found through `parent` in session.yaml), so nothing is counted twice or missed,
whatever state the children ended in. `wall_s` is time spent in turns (summed over a tree).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .errors import PrimefsError
from .history import iter_events
from .session import Session, list_sessions, subtree

FIELDS = ("calls", "input_tokens", "output_tokens", "cost_usd", "wall_s")


def zero() -> dict:
    return {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "wall_s": 0.0,
            "cost_unknown_calls": 0, "tool_calls": 0, "tools": {}}


def own_usage(session: Session) -> dict:
    u = zero()
    for e in iter_events(session.dir / "history.jsonl"):
        t = e.get("type")
        if t == "model_call":
            u["calls"] += 1
            u["input_tokens"] += int(e.get("input_tokens") or 0)
            u["output_tokens"] += int(e.get("output_tokens") or 0)
            u["cost_usd"] += float(e.get("cost_usd") or 0.0)
            u["cost_unknown_calls"] += 0 if e.get("cost_known") else 1
        elif t == "turn_end":
            u["wall_s"] += float(e.get("elapsed_s") or 0.0)
        elif t == "tool_call":
            u["tool_calls"] += 1
            per = u["tools"].setdefault(str(e.get("name")), {"calls": 0, "errors": 0, "seconds": 0.0})
            per["calls"] += 1
            per["errors"] += 1 if e.get("error") else 0
            per["seconds"] = round(per["seconds"] + float(e.get("duration_s") or 0.0), 4)
    u["cost_usd"] = round(u["cost_usd"], 10)
    u["wall_s"] = round(u["wall_s"], 4)
    return u


def add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if k == "tools":  # per tool: calls, errors, seconds
            merged = {name: dict(per) for name, per in out.get("tools", {}).items()}
            for name, per in v.items():
                m = merged.setdefault(name, {"calls": 0, "errors": 0, "seconds": 0.0})
                m["calls"] += per["calls"]
                m["errors"] += per["errors"]
                m["seconds"] = round(m["seconds"] + per["seconds"], 4)
            out["tools"] = merged
            continue
        out[k] = out.get(k, 0) + v
    out["cost_usd"] = round(out["cost_usd"], 10)
    out["wall_s"] = round(out["wall_s"], 4)
    return out


class UsageIndex:
    """Own and tree usage for every session of a workspace, read once."""

    def __init__(self, sessions_dir: Path):
        self.sessions, self.problems = {}, []
        self.broken: dict[str, str] = {}  # id -> why its session.yaml cannot be used (shown, not fatal)
        for s in list_sessions(sessions_dir):
            try:
                s.meta
                self.sessions[s.id] = s
            except (PrimefsError, OSError) as exc:
                self.problems.append(str(exc))
                self.broken[s.id] = str(exc)
        self.children: dict[str | None, list[str]] = defaultdict(list)
        for sid, s in self.sessions.items():
            self.children[s.meta.get("parent")].append(sid)
        self.own = {sid: own_usage(s) for sid, s in self.sessions.items()}
        for sid in self.broken:  # its history still counts
            self.own[sid] = own_usage(Session(Path(sessions_dir) / sid))
        self._tree: dict[str, dict] = {}

    def tree(self, sid: str) -> dict:
        if sid in self.broken:
            return self.own[sid]
        if sid not in self._tree:
            total = dict(self.own[sid])
            for child in subtree(self.children, sid)[1:]:
                total = add(total, self.own[child])
            self._tree[sid] = total
        return self._tree[sid]


def tree_order(index) -> list[str]:
    """Roots in creation order, each followed by its descendants (depth first)."""
    order: list[str] = []
    stack = sorted((sid for sid in index.children.get(None, [])), reverse=True)
    orphans = [sid for sid, s in index.sessions.items()
               if s.meta.get("parent") and s.meta.get("parent") not in index.sessions]
    stack += sorted(orphans + list(getattr(index, "broken", {})), reverse=True)
    while stack:
        sid = stack.pop()
        order.append(sid)
        stack.extend(sorted(index.children.get(sid, []), reverse=True))
    return order
