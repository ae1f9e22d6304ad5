"""What the web view knows of the sessions: one incremental index per server, shared by every page.

Each history is read once, then only the bytes appended since (summary.follow: counted by the fold
that `primefs usage` uses, so the figures are the same), and each
session.yaml is parsed again only when it changed (Session.reload): a page or a live update of a
workspace with thousands of sessions costs a directory listing and a few stats per session, never a
re-read of every history. A refresh is skipped if the last one was very recent (throttled by how long
refreshes take), so any number of open pages share one reader.
"""
from __future__ import annotations

import os
import threading
import time
from array import array
from collections import defaultdict

from primefs.index.accounting import total
from primefs.store import summary as summaries
from primefs.store.control import runner_state
from primefs.store.session import Session, subtree

SERIES_POINTS = 400  # a chart line never needs more points than this


def parent_of(meta: dict) -> str | None:
    parent = meta.get("parent")
    return parent if isinstance(parent, str) and parent else None  # a hand edit may put anything there


class Track:
    """One session's history as summary.py counts it (the same fold as `primefs usage`), fed by the bytes
    appended since the last look, plus what only the web view shows: its kernel and its calls over time."""

    __slots__ = ("path", "summary", "kernel", "points", "_usage")

    def __init__(self, path):
        self.path = path
        self.summary = summaries.empty(path.parent.name)
        self.kernel: dict | None = None  # the last `kernel` event: where its kernel runs
        # ts and the session's tokens and cost so far, at every model call, flat: compact for big workspaces
        self.points = array("d")
        self._usage: dict | None = None

    def update(self) -> bool:
        changed = summaries.follow(self.summary, self.path, self._each)
        if changed:
            self._usage = None
            if self.summary["events"] == 0:  # emptied or gone: nothing counted
                self.kernel, self.points = None, array("d")
        return changed

    def _each(self, start: int, end: int, e) -> None:
        if self.summary["events"] == 1:  # the first event counted: a new file, or counted again from the start
            self.kernel, self.points = None, array("d")
        if not isinstance(e, dict):
            return
        if e.get("type") == "model_call":
            u, last = self.summary["usage"], self.summary["last"]
            self.points.extend((last["ts"] or 0.0, u["input_tokens"] + u["output_tokens"], u["cost_usd"]))
        elif e.get("type") == "kernel" and e.get("event") != "stopped":  # (the last kernel's pid and node stay shown)
            self.kernel = e

    @property
    def turns(self) -> int:
        return self.summary["turns"]

    @property
    def last(self) -> dict | None:
        return self.summary["last"]

    def usage(self) -> dict:
        """Its usage as `primefs usage` gives it, plus tokens; made once per change (read it, never change it)."""
        if self._usage is None:
            u = summaries.usage(self.summary)
            self._usage = {**u, "tokens": u["input_tokens"] + u["output_tokens"]}
        return self._usage


class WorkspaceIndex:
    def __init__(self, ws):
        self.ws = ws
        self.sessions: dict[str, Session] = {}
        self.tracks: dict[str, Track] = {}
        self.meta: dict[str, dict] = {}  # the last readable session.yaml of each session
        self.problems: dict[str, str] = {}  # session id -> why its session.yaml cannot be read
        self.children: dict[str | None, list[str]] = defaultdict(list)
        self.order: list[str] = []  # every readable session: trees, newest root first
        self.roots: list[str] = []
        self.names: dict[str, str] = {}
        self.total: dict = {"sessions": 0, "calls": 0, "tokens": 0, "cost_usd": 0.0, "cost_unknown_calls": 0}
        self.version = 0  # bumped whenever anything shown changed
        self.runner: dict = {"running": False, "state": None}
        # held while reading what refresh() changes in place; pages hold it too while they gather a view
        self.lock = threading.RLock()
        self._last = 0.0
        self._took = 0.0
        self._cache: dict = {}  # what pages computed from this version: tree usage, the tree page's lists

    # -- reading ----------------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> int:
        """Read what changed (unless a refresh just ran); returns the version."""
        with self.lock:
            now = time.monotonic()
            if not force and now - self._last < max(0.25, 4 * self._took):
                return self.version
            changed = self._scan()
            runner = runner_state(self.ws)
            state = runner.get("state") or {}
            summary = {"running": runner["running"], "pid": runner.get("pid"), "state": {
                k: state.get(k) for k in ("active_sessions", "waiting_sessions", "queued_sessions", "live_kernels",
                                          "kernel_pids")}}
            if summary != self.runner:
                self.runner, changed = summary, True
            if changed:
                self.version += 1
                self._cache = {}
            self._last = time.monotonic()
            self._took = self._last - now
            return self.version

    def _scan(self) -> bool:
        changed = False
        try:
            present = {e.name for e in os.scandir(self.ws.sessions)
                       if e.is_dir() and not e.name.startswith(".") and os.path.isfile(os.path.join(e.path, "session.yaml"))}
        except FileNotFoundError:
            present = set()
        for sid in set(self.sessions) - present:
            for table in (self.sessions, self.tracks, self.meta, self.problems):
                table.pop(sid, None)
            changed = True
        for sid in sorted(present - set(self.sessions)):
            self.sessions[sid] = Session(self.ws.sessions / sid)
            self.tracks[sid] = Track(self.ws.sessions / sid / "history.jsonl")
            changed = True
        for sid, s in self.sessions.items():
            try:
                meta = s.reload()
                if meta is not self.meta.get(sid):
                    self.meta[sid], changed = meta, True
                if self.problems.pop(sid, None):
                    changed = True
            except Exception as exc:  # broken or half-written: keep the last good one, say why
                if self.problems.get(sid) != str(exc):
                    self.problems[sid], changed = str(exc), True
            changed = self.tracks[sid].update() or changed
        if changed:
            self.children = defaultdict(list)
            for sid, meta in self.meta.items():
                self.children[parent_of(meta)].append(sid)
            # newest trees first (live work on top), each root followed by its descendants in creation order
            self.roots = sorted((sid for sid, m in self.meta.items() if parent_of(m) not in self.meta), reverse=True)
            self.order = [sid for root in self.roots for sid in self.descendants(root)]
            self.names = {sid: str(m.get("name") or sid) for sid, m in self.meta.items()}
            self.total = {"sessions": len(self.meta), "calls": 0, "tokens": 0, "cost_usd": 0.0, "cost_unknown_calls": 0}
            for track in self.tracks.values():
                u = track.usage()
                for key in ("calls", "tokens", "cost_usd", "cost_unknown_calls"):
                    self.total[key] += u[key]
            self.total["cost_usd"] = round(self.total["cost_usd"], 10)
        return changed

    # -- what pages ask -----------------------------------------------------------------------------
    def own(self, sid: str) -> dict:
        return self.tracks[sid].usage()

    def cached(self, key, make):
        """make(), kept until the next change: pages and streams that ask the same share one answer."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def tree(self, sid: str) -> dict:
        """Usage of `sid` and all its descendants."""
        return self.cached(("tree", sid), lambda: total(self.own(x) for x in self.descendants(sid)))

    def descendants(self, sid: str) -> list[str]:
        """`sid`, then its descendants depth first, children in creation order (hand-made cycles cut)."""
        return subtree(self.children, sid)

    def depth(self, sid: str) -> int:
        d, cur, seen = 0, parent_of(self.meta.get(sid, {})), {sid}
        while cur and cur in self.meta and cur not in seen:
            seen.add(cur)
            d += 1
            cur = parent_of(self.meta[cur])
        return d

    def row(self, sid: str) -> dict:
        meta, track = self.meta[sid], self.tracks[sid]
        state = self.runner.get("state") or {}
        status = meta.get("status") or "pending"
        flag = (f"waiting: approval {meta['approval']}" if meta.get("approval") else
                "wait" if sid in (state.get("waiting_sessions") or []) else
                "queued" if sid in (state.get("queued_sessions") or []) else None)
        kernel = track.kernel or {}
        live = kernel.get("pid") in (state.get("kernel_pids") or []) if kernel else False
        return {"id": sid, "name": meta.get("name") or sid, "status": status, "flag": flag,
                "stop_reason": meta.get("stop_reason"), "error": meta.get("error"), "model": meta.get("model"),
                "parent": parent_of(meta), "depth": self.depth(sid), "turns": track.turns,
                "own": track.usage(), "tree": self.tree(sid), "last": track.last,
                "kernel": {"node": kernel.get("node"), "pid": kernel.get("pid"), "live": live} if kernel else None,
                "problem": self.problems.get(sid)}

    def series(self, sids: list[str], what: str = "tokens") -> list[tuple[float, float]]:
        """Cumulative tokens (or cost) of these sessions over time, at most SERIES_POINTS points."""
        col = 1 if what == "tokens" else 2
        points = []
        for sid in sids:  # each session's running totals, as the calls that added to them
            p = self.tracks[sid].points
            points.extend((p[i], p[i + col] - (p[i + col - 3] if i else 0.0)) for i in range(0, len(p), 3))
        points.sort()
        out, total = [(points[0][0], 0.0)] if points else [], 0.0  # from zero, at the first call
        for ts, v in points:
            total += v
            out.append((ts, total))
        if len(out) > SERIES_POINTS:  # keep the shape: evenly spaced samples and the last point
            step = len(out) / SERIES_POINTS
            out = [out[int(i * step)] for i in range(SERIES_POINTS)] + [out[-1]]
        return out
