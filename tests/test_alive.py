"""The runner loads what is alive: finished sessions are dormant (alive.py). They are not read at start,
cost a stat now and then, and still wake when mail comes: from `primefs send` (the doorbell), a file
written by hand (the periodic look), a parent's send()."""
from __future__ import annotations

import os

import pytest
from conftest import BackgroundRunner, cli, wait_for
from scaletools import fan_out, grow

from primefs.runner import alive
from primefs.store import mail
from primefs.index.db import session_ids
from primefs.runner.core import Runner
from primefs.store.session import Session


def turns(ws, sid: str) -> int:
    return sum(1 for e in Session(ws.sessions / sid).events("turn_start") if not e.get("resumed"))


def names(ws) -> dict[str, str]:
    return {Session(ws.sessions / sid).name: sid for sid in sorted(session_ids(ws.sessions))}


def test_runner_start_loads_only_what_is_alive(ws, monkeypatch):
    ws = fan_out(ws)
    grow(ws, 40)  # 164 finished sessions
    finished = set(session_ids(ws.sessions))
    root = names(ws)["fan"]
    mail.deliver(ws.sessions / root / "mail", sender="user", to=root, kind="user", text="ping")  # alive: mail waits
    assert cli(ws, "status").returncode == 0  # the index knows them (as any earlier runner or status leaves it)
    parsed, read = [], []
    real_meta = Session.read_meta
    monkeypatch.setattr(Session, "read_meta", lambda self: parsed.append(self.id) or real_meta(self))
    import primefs.store.history as history

    real_iter = history.iter_lines
    monkeypatch.setattr(history, "iter_lines", lambda f, *a, **k: read.append(getattr(f, "name", "")) or real_iter(f, *a, **k))
    runner = Runner(ws, log=lambda m: None)
    runner.run(once=True)
    woken = {root} | set(runner.tree.children(root))  # the root took a turn and mailed its children
    assert turns(ws, root) >= 2 and all(turns(ws, c) == 2 for c in runner.tree.children(root))  # (their results: more)
    untouched = finished - woken
    assert not set(parsed) & untouched, "a dormant session's session.yaml was parsed"
    assert not [p for p in read if any(sid in str(p) for sid in untouched)], "a dormant session's history was read"
    assert set(runner.tree._sessions) <= woken
    assert len(runner.tree._parents) == len(finished)  # every session linked: budgets, 'all', children still see them


@pytest.fixture
def quiet_periodic_look(monkeypatch):
    """Only the doorbell can wake a dormant session in time."""
    monkeypatch.setattr(alive, "LOOK_S", 1000.0)


def test_send_and_a_parent_wake_finished_sessions(ws, quiet_periodic_look):
    ws = fan_out(ws)
    root = names(ws)["fan"]
    with BackgroundRunner(ws) as br:
        wait_for(lambda: (ws.state / "runner.json").exists(), 30, "the runner")
        assert br.runner.alive.awake == {}  # everything finished: nothing loaded
        r = cli(ws, "send", "fan", "ping the children")
        assert r.returncode == 0, r.stderr
        kids = [sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).meta.get("parent") == root]
        wait_for(lambda: all(turns(ws, k) == 2 for k in kids), 30, "the parent's mail woke its finished children")
        assert turns(ws, root) >= 2


def test_hand_written_mail_wakes_a_dormant_session(ws, monkeypatch):
    ws = fan_out(ws)
    grow(ws, 2)
    monkeypatch.setattr(alive, "LOOK_S", 0.5)
    target = sorted(sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).meta.get("parent"))[0]
    with BackgroundRunner(ws) as br:
        wait_for(lambda: (ws.state / "runner.json").exists(), 30, "the runner")
        box = ws.sessions / target / "mail"
        (box / "tmp" / "note").write_text("---\nkind: message\nfrom: alice\n---\nagain\n")
        os.rename(box / "tmp" / "note", box / "new" / "note")  # as docs/workspace.md says: no doorbell
        wait_for(lambda: turns(ws, target) == 2, 30, "the periodic look found the mail")
        assert target in br.runner.alive.awake


def test_stopped_sessions_stay_asleep(ws, quiet_periodic_look):
    ws = fan_out(ws)
    child = names(ws)["fan.1"]
    assert cli(ws, "stop", child).returncode == 0
    with BackgroundRunner(ws) as br:
        wait_for(lambda: (ws.state / "runner.json").exists(), 30, "the runner")
        assert cli(ws, "send", child, "wake up").returncode == 0
        br.runner.alive.look_soon()
        br.runner.scan()
        assert mail.new_files(ws.sessions / child / "mail") and turns(ws, child) == 1


def test_dormant_sessions_cost_stats_not_listings(ws, monkeypatch):
    ws = fan_out(ws)
    grow(ws, 20)
    monkeypatch.setattr(alive, "RACY_S", 0.0)  # (the copies were all just made: their times count as recent)
    run = Runner(ws, log=lambda m: None)
    run.alive.start()
    run.alive.settle_changed()  # (as the runner does after its start: their marks stored)
    run.alive.committing.join(30)
    assert not run.alive.awake and len(run.alive.dormant) == len(session_ids(ws.sessions))
    listed = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(str(p)) or real(p))
    run.alive._next_look = 0
    run.alive.scan()
    assert listed == [], "nothing changed: no mailbox listed"
    target = sorted(run.alive.dormant)[7]
    mail.deliver(ws.sessions / target / "mail", sender="user", to=target, kind="user", text="hi")
    run.alive._next_look = 0
    run.alive.scan()
    assert target in run.alive.awake and run.scheduler.busy(target)
    assert all(target in p for p in listed if "/sessions/" in p)
    # a second start: the marks kept in the index spare the listings of unchanged mailboxes
    news = []
    monkeypatch.setattr(mail, "what_waits", lambda folder, stopped=False: news.append(os.path.basename(folder)) or None)
    again = Runner(ws, log=lambda m: None)
    again.alive.start()
    assert set(news) <= {target}
