"""The scheduler: which sessions have work, which run a turn now, and the worker threads.

At most `cap()` sessions run turns at once (limits.max_concurrent_sessions). A session blocked in
wait() for its children does not count: a parent must not hold the slot its children need.
All state is guarded by the bell's lock, so waiters can check it atomically.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable

from primefs.runner.bell import Bell


class Scheduler:
    def __init__(self, bell: Bell, cap: Callable[[], int], work: Callable[[str], bool], log):
        self.bell, self.cap, self.work_fn, self.log = bell, cap, work, log
        self.queued: set[str] = set()   # sessions with input waiting for a turn
        self.active: set[str] = set()   # sessions whose worker runs now
        self.waiting: set[str] = set()  # active sessions blocked in wait(): their slot is free
        self.threads: list[threading.Thread] = []

    def add(self, sid: str) -> None:
        with self.bell.cond:
            self.queued.add(sid)
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
        cap = self.cap()
        for sid in sorted(self.queued - self.active):
            if len(self.active - self.waiting) >= cap or self.bell.stopping:
                break
            self.queued.discard(sid)
            self.active.add(sid)
            t = threading.Thread(target=self._worker, args=(sid,), name=f"session-{sid}", daemon=True)
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
            t.start()

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
                    self.queued.add(sid)
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
        for t in list(self.threads):
            t.join(timeout)
