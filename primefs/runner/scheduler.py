"""The scheduler: which sessions have work, which run a turn now, and the worker threads.

At most `cap()` sessions run turns at once (limits.max_concurrent_sessions). A session blocked in
wait() for its children does not count: a parent must not hold the slot its children need.
All state is guarded by the bell's lock, so waiters can check it atomically.
"""
from __future__ import annotations

import heapq
import threading
import time
from contextlib import contextmanager
from typing import Callable

from primefs.runner.bell import Bell
from primefs.runner.workers import Workers


class Scheduler:
    def __init__(self, bell: Bell, cap: Callable[[], int], work: Callable[[str], bool], log):
        self.bell, self.cap, self.work_fn, self.log = bell, cap, work, log
        self.queued: set[str] = set()   # sessions with input waiting for a turn
        self._line: list[str] = []  # the queued ids as a heap, oldest first (ids discarded since: skipped)
        self.active: set[str] = set()   # sessions whose worker runs now
        self.waiting: set[str] = set()  # active sessions blocked in wait(): their slot is free
        self.workers = Workers("session", log)
        self.turns: list[threading.Event] = []  # set when a worker's turn has returned

    def add(self, sid: str) -> None:
        with self.bell.cond:
            self._enqueue(sid)
            self.bell.cond.notify_all()

    def discard(self, sid: str) -> None:
        with self.bell.cond:
            self.queued.discard(sid)

    def busy(self, sid: str) -> bool:
        """A turn of the session runs or is queued."""
        with self.bell.cond:
            return sid in self.active or sid in self.queued

    def idle(self) -> bool:
        with self.bell.cond:
            return not self.queued and not self.active

    def snapshot(self) -> dict:
        with self.bell.cond:
            return {"active_sessions": sorted(self.active), "waiting_sessions": sorted(self.waiting),
                    "queued_sessions": sorted(self.queued)}

    def dispatch(self) -> None:
        """Start workers for queued sessions while slots are free (call with the bell's lock held)."""
        free = self.cap() - len(self.active - self.waiting)
        if free <= 0 or self.bell.stopping or not self.queued:
            return  # (called at every ring: with thousands queued, looking at them all each time cost seconds)
        later = []  # queued while a turn of theirs runs: for a later dispatch
        while free > 0 and self._line:
            sid = heapq.heappop(self._line)
            if sid not in self.queued:
                continue  # discarded, or an earlier copy was taken
            if sid in self.active:
                later.append(sid)
                continue
            free -= 1
            self.queued.discard(sid)
            self.active.add(sid)
            self.turns = [t for t in self.turns if not t.is_set()] + [self.workers.submit(self._worker, sid)]
        for sid in later:
            heapq.heappush(self._line, sid)

    def _enqueue(self, sid: str) -> None:
        if sid not in self.queued:
            self.queued.add(sid)
            heapq.heappush(self._line, sid)

    def _worker(self, sid: str) -> None:
        more = False
        try:
            more = self.work_fn(sid)
        except Exception as exc:  # work_fn contains its own failures; this is the last net
            self.log(f"error in the worker of {sid}: {type(exc).__name__}: {exc}")
        finally:
            with self.bell.cond:
                self.active.discard(sid)
                if more and not self.bell.stopping:
                    self._enqueue(sid)
                self.bell.cond.notify_all()

    @contextmanager
    def waiting_for_others(self, sid: str):
        """While `sid` waits for other sessions, its slot is free for them."""
        with self.bell.cond:
            self.waiting.add(sid)
            self.bell.cond.notify_all()
        try:
            yield
        finally:
            with self.bell.cond:
                self.waiting.discard(sid)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in list(self.turns):
            t.wait(max(0.0, deadline - time.monotonic()))
