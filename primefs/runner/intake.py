"""Intake: what comes into the runner from files people write. Goal files become sessions (each goal
file once, across restarts), heartbeats that are due become mail, and hand edits of harness files
become commits (`Primefs-Source: user`)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.runner.postoffice import PostOffice
from primefs.runner.scheduler import Scheduler
from primefs.runner.tree import SessionTree
from primefs.store import heartbeat
from primefs.store.fsutil import open_for_writing, write_atomic
from primefs.store.goals import goal_listing, parse_goal
from primefs.store.session import Session, create_session

GOAL_SETTLE_S = 0.5  # a goal file is read once unchanged this long (and no process has it open for writing)
REJECTED = "goals.json"  # .primefs/goals.json: goal files the runner refused, and why (for `primefs status`)


class Intake:
    def __init__(self, ws, tree: SessionTree, scheduler: Scheduler, post: PostOffice, conditions: dict, log):
        self.ws, self.tree, self.scheduler, self.post, self.conditions, self.log = (
            ws, tree, scheduler, post, conditions, log)
        self.claimed: set[str] = set()  # goal files that have a session (workspace-relative paths)
        self.reported: dict[str, float] = {}  # broken goal file -> mtime reported (report each version once)
        self.rejected: dict[str, dict] = {}  # broken goal file -> {mtime, error}, as written to REJECTED
        self.whole: dict[str, float] = {}  # goal file -> the mtime it had when it arrived whole (goal_event)
        self.next_look: float | None = None  # monotonic time to look again at a goal file being written
        self.config_stamp = ws.config_stamp()
        self.heartbeat_sessions: set[str] = set()
        self.harness_dirty = True  # hand edits of harness files may wait to be committed
        self._lock = threading.RLock()  # scan_goals -> add_heartbeat -> watch_heartbeats
        self.on_adopt = lambda sid: None  # the runner looks at adopted sessions (alive.py)

    # -- primefs.yaml ------------------------------------------------------------------------------
    def check_config(self) -> bool:
        """Read primefs.yaml again if it changed (a model alias just added is known to the next goal).
        True when new settings are in force; a broken file is reported and the old settings stay."""
        stamp = self.ws.config_stamp()
        if stamp == self.config_stamp:
            return False
        self.config_stamp = stamp
        try:
            self.ws.reload_config()
        except PrimefsError as exc:
            self.log(f"error: primefs.yaml not reloaded (the settings read before stay in force): {exc}")
            return False
        self.log("primefs.yaml reloaded: its models and limits apply to new sessions and turns "
                 "(hosts and mcp_servers at the next start)")
        return True

    # -- goals ------------------------------------------------------------------------------------
    def scan_goals(self) -> None:
        with self._lock:
            self.next_look = None
            files, strays = goal_listing(self.ws)
            for stray in strays:
                self.log(f"goal error: {stray}")  # said once
            rejected = dict(self.rejected)
            for path in files:
                rel = path.relative_to(self.ws.root).as_posix()
                if rel not in self.claimed:
                    try:
                        self._take_goal(path, rel)
                    except Exception as exc:  # noqa: BLE001 - one goal file never stops the others
                        self.log(f"goal error: {rel}: {type(exc).__name__}: {exc}")
            present = {p.relative_to(self.ws.root).as_posix() for p in files}
            self.rejected = {rel: r for rel, r in self.rejected.items() if rel in present and rel not in self.claimed}
            self.whole = {rel: m for rel, m in self.whole.items() if rel in present and rel not in self.claimed}
            if self.rejected != rejected:
                self._write_rejected()
        if self.next_look is not None:  # the loop's wait is cut to it (else it sleeps up to a second more)
            self.scheduler.bell.ring()

    def goal_event(self, path: Path, whole: bool) -> None:
        """A goal file appeared or changed; `whole`: renamed into place or closed after writing (as `primefs
        goal`, the Python API and careful scripts write): it is read now, not once it has settled."""
        if whole:
            try:
                self.whole[path.relative_to(self.ws.root).as_posix()] = path.stat().st_mtime
            except (OSError, ValueError):
                pass
        self.scan_goals()

    def _settled(self, path: Path, rel: str) -> float | None:
        """The file's mtime once it is settled; None while it is being written (look again soon)."""
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        if mtime in (self.rejected.get(rel, {}).get("mtime"), self.whole.get(rel)):  # known whole: no wait, no /proc
            return mtime
        age = time.time() - mtime
        if 0 <= age < GOAL_SETTLE_S or (0 <= age < 600 and open_for_writing(path)):
            wait = max(GOAL_SETTLE_S - age, 0.1) if age < GOAL_SETTLE_S else GOAL_SETTLE_S
            soon = time.monotonic() + wait
            self.next_look = soon if self.next_look is None else min(self.next_look, soon)
            return None
        return mtime

    def _write_rejected(self) -> None:
        try:
            write_atomic(self.ws.state / REJECTED, json.dumps(self.rejected, indent=1), durable=False)
        except OSError:
            pass

    def _take_goal(self, path: Path, rel: str) -> None:
        mtime = self._settled(path, rel)
        if mtime is None:
            return
        try:
            goal = parse_goal(self.ws, path, self.conditions)
        except PrimefsError as exc:
            self.rejected[rel] = {"mtime": mtime, "error": str(exc)}
            if self.reported.get(rel) != mtime:
                self.reported[rel] = mtime
                self.log(f"goal error: {exc}")
            return
        self.rejected.pop(rel, None)
        extra = dict(goal.control)
        if goal.limits:
            extra["limits"] = goal.limits
        files = {"context" + Path(goal.data).suffix: self.ws.root / goal.data} if goal.data else None
        try:
            session = create_session(self.ws.sessions, task=goal.task, name=goal.name, model=goal.model,
                                     goal=rel, context=goal.context, extra=extra, files=files)
        except Exception as exc:  # noqa: BLE001 - refused like a bad goal: said once, not tried at every scan
            self.rejected[rel] = {"mtime": mtime, "error": f"{rel}: cannot start a session: {exc}"}
            self.log(f"goal error: {rel}: cannot start a session: {exc}")
            return
        self.claimed.add(rel)
        self.log(f"goal {rel} -> session {session.id} ({goal.name}, model {goal.model})")
        if goal.control.get("heartbeat"):
            self.add_heartbeat(session, goal.control["heartbeat"])
        self.adopt(session)

    def adopt(self, session: Session) -> None:
        """A new session (from a goal or rlm()): link it into the tree and queue its first turn."""
        self.tree.put(session)  # the object that knows its session.yaml: the turn's agent uses it
        self.tree.link(session.id, session.meta.get("parent"))
        self.on_adopt(session.id)
        self.scheduler.add(session.id)

    # -- heartbeats -------------------------------------------------------------------------------
    def add_heartbeat(self, session: Session, spec) -> dict:
        """A goal's `heartbeat:` ('every 10m', or {every|cron: ..., prompt: ...})."""
        hb = heartbeat.add(session.dir, *heartbeat.from_spec(spec))
        self.watch_heartbeats(session.id)
        return hb

    def watch_heartbeats(self, sid: str) -> None:
        with self._lock:
            self.heartbeat_sessions.add(sid)

    def tick_heartbeats(self) -> None:
        with self._lock:
            sids = list(self.heartbeat_sessions)
        for sid in sids:
            s = self.tree.session(sid)
            try:
                if s.reload().get("status") == "stopped":
                    continue
                problems: list[str] = []
                for hb, ticks in heartbeat.claim_due(s.dir, problems=problems):
                    self.post.deliver(sid, sender="heartbeat", kind="heartbeat", text=heartbeat.message_text(hb, ticks),
                                      extra={"heartbeat": hb["id"], "ticks": ticks})
                for problem in problems:  # said once (the runner's log says a warning once)
                    self.log(f"warning: heartbeat skipped: {problem}")
            except Exception as exc:  # noqa: BLE001 - a broken heartbeat file never stops the others
                self.log(f"warning: heartbeats of {sid}: {type(exc).__name__}: {exc}")

    # -- hand edits of the harness ----------------------------------------------------------------
    def harness_touched(self) -> None:
        self.harness_dirty = True

    def commit_hand_edits(self) -> None:
        """Harness files a person edited are committed as `Primefs-Source: user` at turn boundaries."""
        with self._lock:
            dirty, self.harness_dirty = self.harness_dirty, False
        if dirty:
            from primefs.harness.entries import commit_user_edits

            try:
                commit_user_edits(self.ws)
            except Exception as exc:
                self.log(f"warning: could not commit hand edits of the harness: {exc}")
