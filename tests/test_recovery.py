"""Recovery of interrupted work: waits cut short, mail recorded before a crash, broken session files, stops under
--once, names beside a broken session."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from conftest import by_name, configure, run_once, use_server, wait_for

from primefs.store import mail
from primefs.store.control import request_stop
from primefs.store.goals import write_goal
from primefs.runner.core import Runner
from primefs.store.session import list_sessions


def test_an_interrupted_wait_does_not_take_the_childs_later_result(ws, server):
    parent = {"match": "^Impatient", "replies": [
        {"code": "h = rlm('Slow child', name='slow')\nprint(h.wait())"},   # interrupted by the cell timeout
        {"code": "import time\ntime.sleep(1.4)"}, {"code": "time.sleep(1.4)"},  # the child answers meanwhile
        {"text": "turn one over"},
        {"text": "saw the result"}]}
    child = {"match": "^Slow", "replies": [{"code": "import time\ntime.sleep(1.2)"}, {"code": "time.sleep(1.2)"},
                                           {"text": "late answer"}]}
    server.set_script({"rules": [parent, child]})
    ws = use_server(ws, server, limits={"cell_timeout_s": 1.5})
    write_goal(ws, "Impatient parent", name="imp")
    run_once(ws)
    p = by_name(ws)["imp"]
    results = [m for m in p.events("message") if m["kind"] == "result"]
    assert len(results) == 1 and results[0]["text"] == "late answer"
    assert not results[0].get("read_by")  # shown to the model (a prompt), not swallowed by the dead wait()
    assert p.events("cell")[0]["timed_out"]


def test_message_recorded_before_a_crash_still_gets_its_turn(ws):
    (ws.root / "s.yaml").write_text("- text: one\n- text: two\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "x", name="m")
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    msg = mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="are you there?")
    claimed = mail.claim(msg.path)
    s.history.append("message", id=msg.id, **{"from": "user"}, kind="user", text="are you there?")  # then: kill -9
    s.history.close()
    assert claimed.exists()
    run_once(ws)
    assert s.read_result() == "two" and len(s.events("turn_start")) == 2


def two_done_sessions(ws):
    """Sessions a and b, each with one finished turn; returns the workspace and a."""
    (ws.root / "s.yaml").write_text("- text: fine\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "first", name="a")
    write_goal(ws, "second", name="b")
    run_once(ws)
    return ws, by_name(ws)["a"]


def test_a_broken_session_file_is_skipped_not_fatal_and_its_goal_not_restarted(ws):
    ws, a = two_done_sessions(ws)
    text = (a.dir / "session.yaml").read_text()
    (a.dir / "session.yaml").write_text(text.replace("status:", "status: [broken\nx:"))
    mail.deliver(a.mail, sender="user", to=a.id, kind="user", text="hello")
    lines = run_once(ws)
    assert any("skipped" in line for line in lines)
    assert len(list_sessions(ws.sessions)) == 2  # goal a was not started again
    r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "status", "--json"],
                       capture_output=True, text=True)
    records = {x["id"]: x for x in json.loads(r.stdout)}
    assert r.returncode == 0 and [x["name"] for x in records.values() if x["status"] != "broken"] == ["b"]
    assert records[a.id]["status"] == "broken" and "bad YAML" in records[a.id]["error"]  # shown as broken
    assert "session broken" in r.stderr and "Traceback" not in r.stderr


def test_stop_is_applied_under_run_once(ws):
    (ws.root / "s.yaml").write_text("default:\n" + "  - code: import time; time.sleep(1)\n" * 30)
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "loop", name="loop")
    t = threading.Thread(target=lambda: Runner(ws, log=lambda m: None).run(once=True), daemon=True)
    started = time.monotonic()
    t.start()
    s = wait_for(lambda: by_name(ws).get("loop"))
    wait_for(lambda: s.events("cell"))
    request_stop(ws, [s.id])
    t.join(30)
    assert not t.is_alive() and time.monotonic() - started < 20
    assert s.reload()["status"] == "stopped" and len(s.events("cell")) < 15


def test_names_still_resolve_beside_a_broken_session(ws):
    ws, a = two_done_sessions(ws)
    (a.dir / "session.yaml").write_text("status: [broken\n")
    r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "log", "b"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "second" in r.stdout
