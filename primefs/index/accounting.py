"""Usage from history: every model call is recorded once, by the session that made it.

`own` sums a session's `model_call` events; `tree` sums own over the session and all its
descendants (found through `parent` in session.yaml), so nothing is counted twice or missed,
whatever state the children ended in. `wall_s` is time spent in turns (summed over a tree).
Sums come from each session's summary (summary.py: kept current with its history, exactly a
recount), found through the index (index.py); no history is read whole.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from primefs.index.db import Entry, Index
from primefs.store import summary as summaries
from primefs.store.session import Session, subtree


def own_usage(session: Session) -> dict:
    return summaries.usage(session.summary())


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
    """Own and tree usage of every session of a workspace, or of one tree (`root`), from the index."""

    def __init__(self, sessions_dir: Path, root: str | None = None):
        with Index(Path(sessions_dir).parent) as index:
            self.rows = index.tree(root) if root else index.sync()
        self.sessions: dict[str, Entry] = {}
        self.problems: list[str] = []
        self.broken: dict[str, str] = {}  # id -> why its session.yaml cannot be used (shown, not fatal)
        for sid, row in self.rows.items():
            if row["broken"]:
                self.problems.append(row["broken"])
                self.broken[sid] = row["broken"]
            else:
                self.sessions[sid] = Entry(row)
        self.children: dict[str | None, list[str]] = defaultdict(list)
        for sid, s in self.sessions.items():
            self.children[s.meta.get("parent")].append(sid)
        self.own = {sid: row["usage"] for sid, row in self.rows.items()}  # a broken one's history still counts
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
    orphans = [sid for sid, s in index.sessions.items()
               if s.meta.get("parent") and s.meta.get("parent") not in index.sessions]
    tops = sorted(orphans + list(getattr(index, "broken", {}))) + sorted(index.children.get(None, []))
    return [sid for top in tops for sid in subtree(index.children, top)]
