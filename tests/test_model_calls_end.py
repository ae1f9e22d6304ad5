"""Model calls always end: a timeout, a stream that goes quiet, a stop or a runner stop, long before the model would answer."""
from __future__ import annotations

import time

from conftest import BackgroundRunner, run_once, use_server, wait_for

from primefs.store.control import request_stop
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def only(ws):
    return list_sessions(ws.sessions)[0]


def test_a_model_that_never_answers_times_out_and_is_retried(ws, server):
    server.delay = 30
    ws = use_server(ws, server, limits={"model_timeout_s": 1, "model_retries": 1})
    write_goal(ws, "hello", name="slow")
    started = time.monotonic()
    run_once(ws)
    s = only(ws)
    assert time.monotonic() - started < server.delay  # the timeout ended it, not the server
    assert s.status == "failed" and "did not answer within 1 s (limits.model_timeout_s)" in s.meta["error"]
    assert len(s.events("model_error")) == 2  # tried, then retried once


def test_a_stream_that_goes_quiet_is_cut(ws, server):
    server.set_script([{"text": "a long answer that never finishes"}])
    server.stall = 30
    ws = use_server(ws, server, stream=True, limits={"stream_idle_timeout_s": 1, "model_retries": 0})
    write_goal(ws, "hello", name="quiet")
    started = time.monotonic()
    run_once(ws)
    s = only(ws)
    assert time.monotonic() - started < server.stall  # the idle timeout ended it, not the server
    assert s.status == "failed" and "sent nothing for 1 s (limits.stream_idle_timeout_s)" in s.meta["error"]


def test_stop_ends_a_model_call_in_flight(ws, server):
    server.delay = 60
    ws = use_server(ws, server)
    write_goal(ws, "hello", name="hung")
    with BackgroundRunner(ws):
        wait_for(lambda: server.requests, what="the model call")
        s = only(ws)
        request_stop(ws, [s.id])
        # the server would answer after 60 s: stopped within 10, the call was cut, not waited out
        wait_for(lambda: s.reload()["status"] == "stopped", timeout=10, what="stopped")


def test_runner_stop_ends_a_model_call_in_flight(ws, server):
    server.delay = 60
    ws = use_server(ws, server)
    write_goal(ws, "hello", name="hung")
    br = BackgroundRunner(ws)
    with br:
        wait_for(lambda: server.requests, what="the model call")
        s = only(ws)
        br.runner.stop()
        wait_for(lambda: s.events("turn_end"), timeout=10, what="the turn cut off")  # not the server's 60 s
    assert s.events("turn_end")[-1]["outcome"] == "interrupted" and s.reload()["status"] == "running"
