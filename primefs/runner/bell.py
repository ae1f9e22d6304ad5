"""The bell: one condition the runner's parts ring when something changed (a turn ended, mail came,
a stop was asked for). Waiters hold no state of their own: they re-check what they wait for."""
from __future__ import annotations

import threading
import time
from typing import Callable


class Stopping(Exception):
    """The runner is stopping: whatever waited gives up (the work resumes with the next runner)."""


class Bell:
    def __init__(self):
        self.cond = threading.Condition()
        self.stopping = False

    def ring(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def wait_until(self, ready: Callable[[], bool], timeout: float | None = None,
                   abort: Callable[[], str | None] = lambda: None) -> bool:
        """Block until `ready()` (checked under the lock at every ring); False on timeout.
        Raises RuntimeError with `abort()`'s text if it returns one, Stopping if the runner stops."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                if ready():
                    return True
                reason = abort()
                if reason:
                    raise RuntimeError(reason)
                if self.stopping:
                    raise Stopping("the runner is stopping")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(1.0 if left is None else min(1.0, left))
