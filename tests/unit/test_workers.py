"""runner/workers.py: threads kept for reuse by turns and model calls. Real: the pool and its threads; the jobs
are the test's own functions (one that hangs stands for a model server that does)."""
from __future__ import annotations

import threading

from conftest import wait_for

from primefs.runner import workers as workers_mod
from primefs.runner.workers import Workers


def test_jobs_one_after_another_reuse_one_thread():
    w = Workers("t")
    for i in range(20):
        assert w.submit(lambda: None).wait(5)
    assert w.made == 1


def test_jobs_at_once_get_a_thread_each_and_a_hung_one_holds_none_back():
    w, release, started = Workers("t"), threading.Event(), []
    hung = w.submit(threading.Event().wait)  # never returns: a model server that hangs
    dones = [w.submit(lambda i=i: started.append(i) or release.wait(10)) for i in range(5)]
    wait_for(lambda: len(started) == 5, 10, "five jobs running at once")
    release.set()
    assert all(d.wait(5) for d in dones) and not hung.is_set()
    assert w.made == 6
    assert w.submit(lambda: None).wait(5) and w.made == 6  # an idle one took it


def test_a_job_that_raises_is_logged_and_its_worker_goes_on():
    said, w = [], None
    w = Workers("t", said.append)
    assert w.submit(lambda: 1 / 0).wait(5)
    assert said == ["error in a t worker: ZeroDivisionError: division by zero"]
    assert w.submit(lambda: None).wait(5) and w.made == 1


def test_idle_workers_end(monkeypatch):
    monkeypatch.setattr(workers_mod, "IDLE_S", 0.1)
    w = Workers("idle-test")
    assert w.submit(lambda: None).wait(5)
    wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("idle-test-")], 10, "the idle worker ended")
    assert w.idle == 0
    assert w.submit(lambda: None).wait(5) and w.made == 2  # a new one for the next job
