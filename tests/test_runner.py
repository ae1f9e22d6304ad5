"""The watching runner reacts to new goal and mail files; mail is never lost or shown twice."""
from __future__ import annotations

import os

from conftest import BackgroundRunner, run_once, use_server, wait_for

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.store.history import iter_events
from primefs.store.session import list_sessions


def session_named(ws, name):
    return next((s for s in list_sessions(ws.sessions) if s.meta.get("name") == name), None)


def test_runner_reacts_to_goal_and_mail_files(ws, server):
    server.set_script({"rules": [
        {"match": "first", "replies": [{"text": "first answer"}, {"code": "print('again')"}, {"text": "second answer"}]}]})
    ws = use_server(ws, server)
    with BackgroundRunner(ws):
        # a goal written by hand, with an editor-like temp file and rename
        tmp = ws.goals / ".draft.md.swp"
        tmp.write_text("first task\n")
        os.rename(tmp, ws.goals / "hand.md")
        s = wait_for(lambda: session_named(ws, "hand"), what="session")
        wait_for(lambda: s.read_result() == "first answer", what="first result")
        wait_for(lambda: s.reload()["status"] == "idle", what="idle")
        # a user delivers mail by hand: write in tmp/, rename into new/
        (s.mail / "tmp" / "note1").write_text("please continue")
        os.rename(s.mail / "tmp" / "note1", s.mail / "new" / "note1")
        wait_for(lambda: s.read_result() == "second answer", what="second result")
    msgs = s.events("message")
    assert [(m["from"], m["kind"], m["text"]) for m in msgs] == [("user", "user", "please continue")]
    assert msgs[0]["id"].startswith("note1.")  # the name, then the file's identity (a name used again is new mail)
    last = server.requests[-1]["messages"]
    assert "[user from user]\nplease continue" in [m.get("content") for m in last]
    assert os.listdir(s.mail / "new") == [] and os.listdir(s.mail / "cur") == ["note1!2,S"]
    assert len(s.events("turn_start")) == 2


def test_bad_mail_is_moved_aside_with_reason(ws, server):
    server.set_script([{"text": "ok"}])
    ws = use_server(ws, server)
    write_goal(ws, "x", name="m")
    run_once(ws)
    s = session_named(ws, "m")
    (s.mail / "new" / "broken").write_text("---\nkind: [nope\n---\nbody\n")
    (s.mail / "new" / "weird").write_text("---\nkind: gossip\n---\nbody\n")
    run_once(ws)
    bad = sorted(os.listdir(s.mail / "bad"))
    assert bad == ["broken", "broken.reason", "weird", "weird.reason"]
    assert "gossip" in (s.mail / "bad" / "weird.reason").read_text()
    assert len(s.events("bad_mail")) == 2 and len(s.events("turn_start")) == 1


def test_claimed_but_unacknowledged_mail_runs_exactly_once(ws, server):
    server.set_script([{"text": "one"}, {"text": "two"}, {"text": "three"}])
    ws = use_server(ws, server)
    write_goal(ws, "x", name="m")
    run_once(ws)
    s = session_named(ws, "m")
    delivered = mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="hello")
    # a runner claimed it and died before showing it to the model
    mail.claim(delivered.path)
    run_once(ws)
    assert [m["id"] for m in s.events("message")] == [delivered.id]
    # ... or died after recording it but before acknowledging it: no second turn
    os.rename(s.mail / "cur" / f"{delivered.path.name}!2,S", s.mail / "cur" / f"{delivered.path.name}!2,")
    run_once(ws)
    assert [m["id"] for m in s.events("message")] == [delivered.id]
    assert len(s.events("turn_start")) == 2


def test_torn_history_line_is_cut_before_appending(ws, server):
    server.set_script([{"text": "one"}, {"text": "two"}])
    ws = use_server(ws, server)
    write_goal(ws, "x", name="t")
    run_once(ws)
    s = session_named(ws, "t")
    n_before = len(s.events())
    with open(s.dir / "history.jsonl", "ab") as f:
        f.write(b'{"ts": 1, "type": "cell", "TORN')  # a crash mid-write
    assert len(s.events()) == n_before  # readers skip it
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="more")
    run_once(ws)
    events = list(iter_events(s.dir / "history.jsonl"))
    assert len(events) > n_before and s.read_result() == "two"
    raw = (s.dir / "history.jsonl").read_bytes()
    assert b'TORN' not in raw and raw.endswith(b"\n")
    assert [e["n"] for e in events] == list(range(len(events)))
