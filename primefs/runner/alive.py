"""Which sessions the runner looks at: the awake ones. The rest are dormant, and cost one or two `stat`
calls now and then, never a parsed session.yaml or a read history.

At start (`start`), the index (index.py: three stats per session, a changed session read from its
summary) gives every session's parent, goal and status: the family links of all sessions and the goals
already taken come from it. Awake are: sessions not started yet or cut off mid-turn (pending,
running), sessions with unread mail (new, or claimed and not acknowledged before a crash), sessions
with heartbeats, and every session the runner starts or runs from then on. Their ancestors are linked,
and loaded when something needs them (a result mail wakes a finished parent). Stopped sessions take
no mail and fire no heartbeats while a runner runs: they are never woken.

A dormant (finished) session is woken when something arrives for it:
- the doorbell: whatever delivers mail, writes a stop or refine request or a heartbeat touches the
  session's folder (fsutil.ring); the runner watches sessions/ itself, and inotify reports the
  changed folder to that watch at once (alive sessions have their own folders watched);
- the periodic look: every few seconds the mtimes of each dormant session's folder and mail/new are
  compared with the ones it had when it was last seen settled (a file renamed in by hand changes
  them). Times within the last seconds are not trusted (two changes in one clock tick look alike):
  such a session is looked at again next time.
An awake session that has been settled (finished, no turn running or queued, no unread mail, no
heartbeats) for a minute goes dormant again, so the periodic look does not grow with the sessions
a long-running runner has run.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.index.db import Index, session_ids
from primefs.runner.inotify import CHANGES, IN_ATTRIB, Inotify
from primefs.store import mail
from primefs.store.control import REFINE_FILE, STOP_FILE
from primefs.store.fsutil import NAME_RE
from primefs.store.gitops import uncommitted
from primefs.store.history import turn_cut_off
from primefs.store.session import broken_goal_line
from primefs.store.settings import FINISHED

DORMANT_AFTER_S = 60.0  # an awake session settled this long goes dormant
RACY_S = 2.0  # mtimes this recent are not trusted: a second change in the same clock tick keeps the time
LOOK_S = 5.0  # the least time between two periodic looks at the dormant sessions
LOOK_SHARE = 0.02  # ... and at most this share of the runner's time


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class Alive:
    def __init__(self, ws, tree, intake, turns, scheduler, log, *, apply_stop, apply_refine):
        self.ws, self.tree, self.intake, self.turns, self.scheduler, self.log = ws, tree, intake, turns, scheduler, log
        self.apply_stop, self.apply_refine = apply_stop, apply_refine
        self.awake: dict[str, float] = {}  # sid -> when it was last seen busy (monotonic)
        self.dormant: dict[str, list | None] = {}  # sid -> _marks() when seen settled; None: look next time
        self.folder_mtime: int | None = None  # of sessions/: a new or removed session folder changes it
        self.watch: Inotify | None = None
        self.frozen: set[str] = set()  # being archived: not looked at, never woken
        self.lock = threading.RLock()
        self._next_look = 0.0
        self._next_line_look = 0.0  # the next look at the sessions queued for a slot (scan)
        self.changed: list[tuple] = []  # (sid, goal, marks if stopped): finished, changed since last seen (start)
        self._seen: dict = {}  # sid -> marks to store once settle_changed has looked at them
        self.committing: threading.Thread | None = None  # settle_changed's commits (the runner's stop waits for it)

    # -- start ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.folder_mtime = _mtime(str(self.ws.sessions))
        with Index(self.ws.root) as index:
            rows = index.sync(meta_only=True)
        for sid, row in rows.items():
            if row["broken"]:
                self.log(f"warning: session {sid} skipped: {row['broken']}")
                goal = broken_goal_line(self.ws.sessions / sid / "session.yaml")
                if goal:  # its goal stays taken: never start a goal twice
                    self.intake.claimed.add(goal)
                continue
            self.tree.link(sid, row["parent"])
            if row["goal"]:
                self.intake.claimed.add(row["goal"])
        seen, self.changed = {}, []
        for sid, row in rows.items():
            if row["broken"]:
                continue
            if row["status"] == "stopped":  # never woken; but its last turn's end may have been cut off
                marks = self._marks(sid)
                if marks is None or marks != row["marks"]:
                    self.changed.append((sid, row["goal"], marks))
                continue
            if row["status"] in ("pending", "running"):
                self.wake(sid)
                self.scheduler.add(sid)
                if os.path.isdir(f"{self.ws.sessions}/{sid}/heartbeats"):  # due ones fire at start, bad ones said
                    self.intake.watch_heartbeats(sid)
                continue
            marks = self._marks(sid)
            if marks is not None and marks == row["marks"]:  # as when last seen settled: nothing came
                self.dormant[sid] = marks
                continue
            self.changed.append((sid, row["goal"], None))  # (settled: its marks are stored by settle_changed)
            if marks is None or mail.what_waits(f"{self.ws.sessions}/{sid}"):
                self.dormant[sid] = None
                self.look(sid)
            else:
                self.dormant[sid] = seen[sid] = marks
        self._next_look = time.monotonic() + LOOK_S  # all were just looked at
        self._seen = seen

    def settle_changed(self) -> None:
        """After start: the finished sessions that changed since a runner last saw them settled may have been
        cut off by the runner's end. A turn whose `turn_end` is missing (killed between its answer and the
        end: the goal's verdict, the result mail to the parent, the commit) is queued: its end is done then
        (turns.py). What git shows uncommitted is committed, beside the runner's work (a commit queued when a
        runner was killed is lost with it); then their marks are stored: the next runner looks at none of
        this again. One read of each history's tail, one `git status`."""
        changed, seen, self.changed, self._seen = self.changed, self._seen, [], {}
        for sid, _goal, marks in changed:
            if marks is not None:  # a stopped session: woken only for its cut-off end
                seen[sid] = marks
            if turn_cut_off(self.ws.sessions / sid / "history.jsonl"):
                self.log(f"{sid}: its last turn was cut off after its answer; its end is done now")
                self.wake(sid)
                self.scheduler.add(sid)
        if changed:  # (beside the runner's work: one `git status`, then the commits)
            self.committing = threading.Thread(target=self._commit_changed, args=(changed, seen), daemon=True,
                                               name="primefs-recovered-commits")
            self.committing.start()

    def _commit_changed(self, changed: list, seen: dict) -> None:
        """What git shows uncommitted among the sessions (and their goals) is committed; then the marks of
        the sessions looked at are stored (not before: a runner killed meanwhile leaves them to the next)."""
        committer = self.turns.committer
        try:
            if committer is not None:
                goals = {goal for _sid, goal, _marks in changed if goal}  # (a person's goal not taken yet: theirs)
                for path in uncommitted(self.ws.root):
                    if path.startswith("sessions/") or path in goals:
                        committer.request(path, "recovered: not committed before a runner stopped")
                committer.flush()
            if seen:
                with Index(self.ws.root) as index:
                    index.set_marks(seen)
        except Exception as exc:  # noqa: BLE001 - looked at again by the next runner
            self.log(f"warning: committing what a stopped runner left: {type(exc).__name__}: {exc}")

    def _marks(self, sid: str) -> list | None:
        """The mtimes of a session's folder, mail/new and mail/cur, or None if one is too recent to
        trust. Mail delivered, claimed or acknowledged, a request or heartbeat written: one of them moves."""
        base = f"{self.ws.sessions}/{sid}"
        marks = [_mtime(base), _mtime(base + "/mail/new"), _mtime(base + "/mail/cur")]
        if None in marks or max(marks) > (time.time() - RACY_S) * 1e9:
            return None
        return marks

    # -- awake and dormant ----------------------------------------------------------------------------
    def wake(self, sid: str) -> None:
        """Look at this session at every scan, and watch its folders."""
        with self.lock:
            self.dormant.pop(sid, None)
            fresh = sid not in self.awake
            self.awake[sid] = time.monotonic()
        if fresh and self.watch is not None:
            folder = self.ws.sessions / sid
            for path in (folder, folder / "mail" / "new", folder / "heartbeats"):
                self.watch.add(path)
            self._watch_tree(folder / "harness")

    def watch_harness(self, sid: str, folder: Path) -> None:
        if sid in self.awake:
            self._watch_tree(folder)

    def _watch_tree(self, top: Path) -> None:
        if self.watch is None or not top.is_dir():
            return
        for folder, dirs, _files in os.walk(top):
            self.watch.add(Path(folder))

    def settle(self, sid: str) -> None:
        """Dormant: marks taken now, before anything is looked at (a change after them is seen)."""
        with self.lock:
            was = self.awake.pop(sid, None) is not None
            self.dormant[sid] = self._marks(sid)
        if was and self.watch is not None:
            folder = self.ws.sessions / sid
            for path in (folder, folder / "mail" / "new", folder / "heartbeats"):
                self.watch.remove(path)

    def look(self, sid: str) -> None:
        """Something may have arrived for this session: requests, heartbeats, mail. Wakes it if so."""
        if not NAME_RE.fullmatch(sid) or sid in self.frozen:
            return
        folder = self.ws.sessions / sid
        if not (folder / "session.yaml").is_file():
            return  # still being created, or gone (archived, removed)
        if not self.tree.knows(sid):  # a folder the runner did not know: put there by hand, restored
            self._adopt_foreign(sid)
        if (folder / STOP_FILE).exists():
            self.apply_stop(sid)
        if (folder / REFINE_FILE).exists():
            self.apply_refine(sid)
        news = False
        if (folder / "heartbeats").is_dir() and not self._stopped(sid):
            self.intake.watch_heartbeats(sid)
            news = True
        if self._unacked(sid, folder) and not self._stopped(sid):  # claimed before a crash: taken again
            self.scheduler.add(sid)
            news = True
        if mail.new_files(folder / "mail"):
            self.turns.mail_arrived(sid)
            news = True
        if news or self.scheduler.busy(sid):
            self.wake(sid)

    def _unacked(self, sid: str, folder: Path) -> bool:
        """Mail claimed and never acknowledged: once the session's reader has listed mail/cur/ (every message
        the session ever took), what it holds; before that, the listing."""
        reader = self.turns.agents.get(sid)
        held = reader.claimed if reader is not None else None
        return bool(held) if held is not None else bool(mail.unacked(folder / "mail"))

    def _status_in(self, sid: str, statuses: tuple) -> bool:
        """Whether its session.yaml says one of these statuses (unreadable: as if it did)."""
        try:
            return self.tree.session(sid).reload().get("status") in statuses
        except (PrimefsError, OSError):
            return True

    def _stopped(self, sid: str) -> bool:
        return self._status_in(sid, ("stopped",))

    def _adopt_foreign(self, sid: str) -> None:
        s = self.tree.session(sid)
        try:
            meta = s.reload()
        except (PrimefsError, OSError) as exc:
            self.log(f"warning: session {sid} skipped: {exc}")
            return
        self.tree.link(sid, meta.get("parent"))
        if meta.get("goal"):
            self.intake.claimed.add(meta["goal"])
        if meta.get("status") in ("pending", "running"):
            self.scheduler.add(sid)
            self.wake(sid)

    # -- the periodic look ----------------------------------------------------------------------------
    def scan(self) -> None:
        """Awake sessions: each looked at; settled ones go dormant. Dormant ones: their mtimes, when due."""
        now = time.monotonic()
        with self.lock:
            awake = set(self.awake)
        state = self.scheduler.snapshot()
        in_line = set(state["queued_sessions"]) - set(state["active_sessions"])
        if now >= self._next_line_look:  # sessions waiting for a slot: their folders are watched, so this
            started = time.monotonic()   # look is only the safety net, rate-limited like the dormant ones'
            self._look_awake(sorted(in_line), now)  # (10,000 queued children took most of the runner's time)
            self._next_line_look = time.monotonic() + max(LOOK_S, (time.monotonic() - started) / LOOK_SHARE)
        self._look_awake(sorted(awake - in_line), now)
        if now >= self._next_look:
            started = time.monotonic()
            self.look_dormant()
            took = time.monotonic() - started
            self._next_look = time.monotonic() + max(LOOK_S, took / LOOK_SHARE)

    def _look_awake(self, sids: list[str], now: float) -> None:
        for sid in sids:
            try:
                self.look(sid)
                if self.scheduler.busy(sid) or not self._status_in(sid, FINISHED):
                    with self.lock:
                        self.awake[sid] = now
                elif now - self.awake.get(sid, now) > DORMANT_AFTER_S and sid not in self.intake.heartbeat_sessions:
                    self.settle(sid)
            except (PrimefsError, OSError) as exc:  # one broken session never stops the others
                self.log(f"warning: session {sid}: {exc}")

    def look_dormant(self) -> None:
        """One or two stats per dormant session; a listing of sessions/ only when it changed."""
        mtime = _mtime(str(self.ws.sessions))
        if mtime != self.folder_mtime:
            self.folder_mtime = mtime
            for sid in session_ids(self.ws.sessions):
                if not self.tree.knows(sid):
                    self.look(sid)
        with self.lock:
            dormant = list(self.dormant.items())
        for sid, marks in dormant:
            if marks is not None and self._marks(sid) == marks:
                continue
            with self.lock:
                if sid not in self.dormant:
                    continue
                self.dormant[sid] = self._marks(sid)  # before looking: a change after it is seen next time
            try:
                self.look(sid)
            except (PrimefsError, OSError) as exc:
                self.log(f"warning: session {sid}: {exc}")

    def look_soon(self) -> None:
        with self.lock:
            self._next_look = 0.0
            self.folder_mtime = None
            self.dormant = {sid: None for sid in self.dormant}

    def freeze(self, sids: list[str]) -> None:
        with self.lock:
            self.frozen |= set(sids)

    def archived(self, gone: list[str], back: list[str]) -> None:
        """An archive ended: `gone` left sessions/ (forgotten), `back` stayed (looked at again)."""
        for sid in gone:
            self.settle(sid)
            with self.lock:
                self.dormant.pop(sid, None)
            self.tree.drop(sid)
        with self.lock:
            self.frozen -= set(gone) | set(back)
            for sid in back:
                if sid in self.dormant:
                    self.dormant[sid] = None

    # -- the watch ------------------------------------------------------------------------------------
    def start_watch(self, on_path) -> None:
        """inotify on sessions/ (new folders, the doorbell) and on awake sessions' folders; without it
        (not Linux, no watches left) the periodic looks do the same, a few seconds later."""
        try:
            self.watch = Inotify(on_path, on_overflow=lambda: on_path(self.ws.sessions))
        except (OSError, AttributeError) as exc:
            self.log(f"warning: no inotify ({exc}); sessions are looked at every {LOOK_S:g} s")
            return
        self.watch.add(self.ws.sessions, CHANGES | IN_ATTRIB)
        with self.lock:
            awake = list(self.awake)
        for sid in awake:
            with self.lock:
                self.awake.pop(sid, None)
            self.wake(sid)

    def stop_watch(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
