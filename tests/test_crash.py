"""kill -9 of the runner at any moment loses nothing (files are the truth)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from conftest import configure, run_once, sigkill_runner_when

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.store.history import iter_events
from primefs.store.session import list_sessions

pytestmark = pytest.mark.slow


def start_runner(ws):
    return subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def assert_history_clean(s):
    events = list(iter_events(s.dir / "history.jsonl"))
    assert [e["n"] for e in events] == list(range(len(events)))  # nothing torn, nothing twice
    raw = (s.dir / "history.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    return events


def test_sigkill_during_a_long_cell_then_resume(ws):
    (ws.root / "s.yaml").write_text(
        "rules:\n"
        "  - match: '^Long'\n"
        "    replies:\n"
        "      - code: \"v = 41\\nimport time\\ntime.sleep(60)\"\n"
        "      - code: \"print('v' in dir())\"\n"
        "      - text: recovered\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "Long job", name="long")
    sigkill_runner_when(ws, lambda: any(s.events("assistant") for s in list_sessions(ws.sessions)))
    s = list_sessions(ws.sessions)[0]
    assert s.reload()["status"] == "running"
    # a torn line and a stale index.lock, as a kill can leave them
    with open(s.dir / "history.jsonl", "ab") as f:
        f.write(b'{"ts": 1, "type": "cell", "half')
    (ws.root / ".git" / "index.lock").write_text("")
    run_once(ws)
    assert s.reload()["status"] == "idle" and s.read_result() == "recovered"
    events = assert_history_clean(s)
    cells = [e for e in events if e["type"] == "cell"]
    assert "interrupted" in cells[0]["shown"] and cells[1]["output"] == "False\n"  # variables were gone
    assert any(e["type"] == "notice" and "runner restarted" in e["text"] for e in events)
    assert not (ws.root / ".git" / "index.lock").exists()
    st = subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "sessions"], capture_output=True,
                        text=True).stdout
    assert st == ""  # committed after recovery


def test_sigkill_during_a_burst_of_200_mail_deliveries(ws):
    (ws.root / "s.yaml").write_text("default:\n" + "".join(f"  - text: reply {i}\n" for i in range(400)))
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "Inbox", name="inbox")
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    proc = start_runner(ws)
    ids = []
    try:
        time.sleep(2)
        for i in range(200):
            ids.append(mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=f"message {i}").id)
            if i == 120:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_once(ws)
    events = assert_history_clean(s)
    seen = Counter(e["id"] for e in events if e["type"] == "message")
    assert set(seen) == set(ids) and max(seen.values()) == 1  # every message once, none twice
    assert mail.new_files(s.mail) == [] and mail.unacked(s.mail) == []
    turns = [e for e in events if e["type"] == "turn_start"]
    assert 1 < len(turns) <= 201  # a message never starts two turns (several may share one)
    assert s.reload()["status"] == "idle"


def rooms_hold(ws, name: str) -> bool:
    return any((s.dir / "work" / name).exists() for s in list_sessions(ws.sessions))


def named(ws, name: str):
    return next(s for s in list_sessions(ws.sessions) if s.meta.get("name") == name)


def test_sigkill_after_the_answer_before_the_turns_end(ws):
    """The runner killed between a turn's answer (status saved) and the turn's end (the goal's verdict,
    turn_end, the commit): the next runner does the end. Before, the session looked finished and an
    autonomous goal never took its next turn. Here it is killed while the end condition runs."""
    (ws.root / "s.yaml").write_text("rules:\n  - match: '^Auto'\n    replies:\n"
                                    "      - text: first answer\n      - text: second answer\n")
    ws = configure(ws, model="scripted/s.yaml")
    (ws.goals / "auto.md").write_text(
        "---\nautonomous: true\nbudget:\n  turns: 2\nend_conditions:\n"
        "- command: 'test -e again || { touch again; sleep 60; }; exit 1'\n---\nAuto job\n")
    sigkill_runner_when(ws, lambda: rooms_hold(ws, "again"), what="the end condition running")
    s = named(ws, "auto")
    assert s.reload()["status"] == "idle" and not s.events("turn_end")  # answered, its end cut off
    lines = run_once(ws)
    assert any("cut off after its answer" in line for line in lines), lines
    events = assert_history_clean(s)
    ends = [e for e in events if e["type"] == "turn_end"]
    assert [(e["turn"], e["outcome"]) for e in ends] == [(1, "idle"), (2, "idle")]
    assert s.read_result() == "second answer" and s.reload()["stop_reason"] == "budget:turns"
    st = subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "sessions", "goals"], capture_output=True,
                        text=True).stdout
    assert st == ""


def test_sigkill_in_a_childs_turn_end_still_reports_to_its_parent(ws):
    """A child killed after its answer, before its result mail went to its parent (here: while its turn-end
    snapshot pickles a slow object): the next runner ends the child's turn, and the parent gets the result.
    Before, the parent waited for it for ever."""
    (ws.root / "s.yaml").write_text(
        "rules:\n"
        "  - match: '^Fan'\n"
        "    replies:\n"
        "      - code: \"h = rlm('child one')\\nprint(wait(h))\"\n"
        "      - text: parent done\n"
        "      - text: parent read its mail\n"
        "  - match: '^child'\n"
        "    replies:\n"
        "      - code: |\n"
        "          class Slow:\n"
        "              def __reduce__(self):\n"
        "                  import time\n"
        "                  open('pickled', 'w').close()\n"
        "                  time.sleep(60)\n"
        "          s = Slow()\n"
        "      - text: child answer\n")
    ws = configure(ws, model="scripted/s.yaml", limits={"snapshot": "turn"})
    write_goal(ws, "Fan out", name="fan")
    sigkill_runner_when(ws, lambda: rooms_hold(ws, "pickled"), what="the child's turn-end snapshot")
    parent = named(ws, "fan")
    child = next(s for s in list_sessions(ws.sessions) if s.meta.get("parent") == parent.id)
    assert child.reload()["status"] == "idle" and not child.events("turn_end")
    run_once(ws)
    assert [e["outcome"] for e in child.events("turn_end")] == ["idle"]
    results = [e for e in parent.events("message") if e.get("from") == child.id and e.get("kind") == "result"]
    assert [e["text"] for e in results] == ["child answer"]
    assert_history_clean(child)
    assert_history_clean(parent)


def test_what_a_killed_runner_never_committed_is_committed_by_the_next(ws):
    """A runner killed with commits queued (its turn ends written, their commit not made): the folders
    stayed out of git for good, a finished session taking no turn that would commit it (found by a probe:
    7 folders untracked after 5 more runner starts). The next runner commits what git shows uncommitted
    among the sessions that changed since a runner last saw them."""
    (ws.root / "s.yaml").write_text("default:\n  - text: answered\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "Answer", name="one")
    run_once(ws)
    s = named(ws, "one")
    git = ["git", "-C", str(ws.root)]
    # as if the runner died before this session's turn commit: its folder not in git, its files written
    subprocess.run([*git, "rm", "-r", "-q", "--cached", f"sessions/{s.id}"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "forget"], check=True)
    with open(s.dir / "history.jsonl", "a") as f:
        f.write('{"ts": 1, "type": "notice", "n": 999, "text": "the last line of a killed runner"}\n')
    assert f"sessions/{s.id}/" in subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
    run_once(ws)
    st = subprocess.run([*git, "status", "--porcelain", "sessions"], capture_output=True, text=True).stdout
    assert st == ""
    log = subprocess.run([*git, "log", "-1", "--format=%B"], capture_output=True, text=True).stdout
    assert "recovered: not committed before a runner stopped" in log
