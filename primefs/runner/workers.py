"""Threads kept for reuse: the runner's turns and model calls run on them.

A job runs on an idle worker, or on a new one when none is idle: never bounded (a turn may wait in
`wait()` for hours, a model call may hang), and every worker is a daemon thread, so a hung job can never
keep the runner from stopping. A worker idle for IDLE_S ends. Reuse is the point: a runner that lives
for months would otherwise make two threads a turn (its worker, its model call), each with a fresh
stack and thread state.
"""
from __future__ import annotations

import queue
import threading

IDLE_S = 300.0


class Workers:
    def __init__(self, name: str, log=None):
        self.name, self.log = name, log
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0   # workers done with their last job: each takes exactly one of the next ones
        self.made = 0

    def submit(self, fn, *args) -> threading.Event:
        """Run fn(*args) on a worker; the event is set when it has returned (or raised)."""
        done = threading.Event()
        with self.lock:
            spawn = self.idle == 0
            if spawn:
                self.made += 1
                n = self.made
            else:
                self.idle -= 1
        self.jobs.put((fn, args, done))
        if spawn:
            threading.Thread(target=self._loop, name=f"{self.name}-{n}", daemon=True).start()
        return done

    def _loop(self) -> None:
        while True:
            try:
                fn, args, done = self.jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self.lock:
                    if self.idle:  # still counted idle: no job is on its way to this worker
                        self.idle -= 1
                        return
                continue  # a submit counted on this worker just now: its job is coming
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - a job handles its own failures; this is the last net
                if self.log:
                    self.log(f"error in a {self.name} worker: {type(exc).__name__}: {exc}")
            finally:
                with self.lock:  # idle before done: a caller that waited for this job and submits again reuses it
                    self.idle += 1
                done.set()
