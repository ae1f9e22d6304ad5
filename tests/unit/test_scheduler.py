"""runner/scheduler.py and runner/bell.py on their own: a fake turn for `work`, no runner, no kernel."""
from __future__ import annotations

import threading

import pytest

from primefs.runner.bell import Bell, Stopping
from primefs.runner.scheduler import Scheduler


class FakeTurns:
    """work(sid): blocks until released; records who ran, and at most how many at once."""

    def __init__(self, bell):
        self.bell, self.ran, self.running, self.most = bell, [], set(), 0
        self.release: dict[str, threading.Event] = {}
        self.more: set[str] = set()  # sessions whose turn says more input came meanwhile

    def work(self, sid):
        with self.bell.cond:
            self.ran.append(sid)
            self.running.add(sid)
            self.most = max(self.most, len(self.running))
            self.bell.cond.notify_all()
        self.release.setdefault(sid, threading.Event()).wait(10)
        with self.bell.cond:
            self.running.discard(sid)
        if sid == "boom":
            raise RuntimeError("a bug in a turn")
        return sid in self.more and not self.more.discard(sid)


def make(cap=2):
    bell, log = Bell(), []
    turns = FakeTurns(bell)
    return bell, turns, Scheduler(bell, lambda: cap, turns.work, log.append), log


def dispatch_until(bell, sched, ready):
    with bell.cond:
        sched.dispatch()
    assert bell.wait_until(ready, timeout=10)


def test_at_most_cap_sessions_run_and_a_free_slot_takes_the_next():
    bell, turns, sched, _ = make(cap=2)
    for sid in ("a", "b", "c"):
        sched.add(sid)
    dispatch_until(bell, sched, lambda: len(turns.running) == 2)
    assert sorted(turns.ran) == ["a", "b"] and sched.busy("c") and not sched.idle()
    turns.release.setdefault("a", threading.Event()).set()
    dispatch_until(bell, sched, lambda: "a" not in sched.active)
    dispatch_until(bell, sched, lambda: "c" in turns.running)
    for sid in ("b", "c"):
        turns.release.setdefault(sid, threading.Event()).set()
    assert bell.wait_until(sched.idle, timeout=10) and turns.most == 2


def test_a_session_waiting_for_its_children_frees_its_slot():
    bell, turns, sched, _ = make(cap=1)
    sched.add("parent")
    dispatch_until(bell, sched, lambda: "parent" in turns.running)
    with sched.waiting_for_others("parent"):
        sched.add("child")
        dispatch_until(bell, sched, lambda: "child" in turns.running)  # the parent's slot
        turns.release.setdefault("child", threading.Event()).set()
        assert bell.wait_until(lambda: "child" not in sched.active, timeout=10)
    turns.release.setdefault("parent", threading.Event()).set()
    assert bell.wait_until(sched.idle, timeout=10)


def test_more_input_during_a_turn_queues_the_session_again_and_a_failing_turn_is_logged():
    bell, turns, sched, log = make(cap=2)
    turns.more.add("a")
    for sid in ("a", "boom"):
        turns.release.setdefault(sid, threading.Event()).set()
        sched.add(sid)
    dispatch_until(bell, sched, lambda: turns.ran.count("a") == 1 and "a" in sched.queued)
    dispatch_until(bell, sched, lambda: turns.ran.count("a") == 2)
    assert bell.wait_until(sched.idle, timeout=10)
    assert log == ["error in the worker of boom: RuntimeError: a bug in a turn"]


def test_nothing_starts_once_the_runner_stops_and_waiters_give_up():
    bell, turns, sched, _ = make(cap=2)
    bell.stop()
    sched.add("a")
    with bell.cond:
        sched.dispatch()
    assert turns.ran == [] and sched.busy("a")
    with pytest.raises(Stopping):
        bell.wait_until(lambda: False, timeout=5)


def test_a_waiter_sees_why_it_must_give_up_and_a_timeout_is_false():
    bell = Bell()
    with pytest.raises(RuntimeError, match="the child failed"):
        bell.wait_until(lambda: False, timeout=5, abort=lambda: "the child failed")
    assert bell.wait_until(lambda: False, timeout=0.05) is False
