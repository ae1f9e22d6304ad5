"""The change journal (store/journal.py, runner/journalwatch.py): with a runner up, commands bring only the
sessions the journal names up to date, and still see what a person changed by hand; without one (or once
its watch lost events) they look at every session. Real runners, real files, a real index."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time

from conftest import answered_under_a_runner, cli, run_once, session_named, wait_for

from primefs.index.db import WATCHED, Index
from primefs.runner.core import RunnerLock
from primefs.runner.journalwatch import JournalWatch
from primefs.store import journal
from primefs.store.goals import write_goal

SCRIPT = 'rules:\n  - replies:\n      - code: "print(1)"\n      - text: "done"\n'


def statuses(ws) -> dict:
    r = cli(ws, "status", "--json")
    assert r.returncode == 0, r.stderr
    return {x["id"]: x for x in json.loads(r.stdout)}


def falsify_row(ws, sid: str) -> None:
    """The row of `sid` says another name and another stat of its files: a look at its files would mend it."""
    db = sqlite3.connect(ws.root / ".primefs" / "index.sqlite")
    db.execute("UPDATE sessions SET name = 'from-the-row', keys = '[null,null,null]' WHERE id = ?", (sid,))
    db.commit()
    db.close()


def trusted(ws) -> bool:
    with Index(ws.root) as index:
        return index.trusted()


def hold_look(watch) -> None:
    """The watch's next complete look waits for `watch.held` (so what is true before it can be asserted)."""
    look, watch.held = watch._complete, threading.Event()
    watch._complete = lambda: (watch.held.wait(10), look())


def test_with_a_runner_up_only_journaled_sessions_are_looked_at_and_hand_edits_are_seen(ws, scripted,
                                                                                        daemon_cleanup):
    ws = scripted(SCRIPT)
    write_goal(ws, "first", name="old")
    write_goal(ws, "third", name="arch")
    run_once(ws)
    old, arch = session_named(ws, "old"), session_named(ws, "arch")
    new = answered_under_a_runner(ws, "new", "second", "done")  # `primefs up`, then a goal answered
    wait_for(lambda: trusted(ws), what="the journal trusted")
    assert statuses(ws)[new.id]["status"] == "idle"  # the runner's own writes were journaled

    # Only what the journal names is read: a row made false by hand in the index stays as it is ...
    falsify_row(ws, old.id)
    assert statuses(ws)[old.id]["name"] == "from-the-row"
    # ... until its files change: a person's edit of session.yaml is seen by the runner's watch.
    meta = old.dir / "session.yaml"
    meta.write_text(meta.read_text().replace("name: old\n", "name: renamed\n"))
    wait_for(lambda: statuses(ws)[old.id]["name"] == "renamed", 10, "the hand edit seen")
    (new.dir / "result.md").write_text("edited by hand\n")
    wait_for(lambda: statuses(ws)[new.id]["result"] == "edited by hand\n", 10, "result.md edited")
    # a folder a person removes is gone from status (its row dropped)
    os.rename(old.dir, ws.root / "elsewhere")
    wait_for(lambda: old.id not in statuses(ws), 10, "a removed folder dropped")
    # an archived tree leaves sessions/ (its row stays in the index, for `logs`, but not in status)
    r = cli(ws, "archive", "--status", "idle", "--json")
    assert r.returncode == 0 and arch.id in r.stdout, r.stderr
    assert arch.id not in statuses(ws) and cli(ws, "log", arch.id).returncode == 0
    os.rename(ws.root / "elsewhere", old.dir)  # put back by hand: seen again
    wait_for(lambda: statuses(ws).get(old.id, {}).get("name") == "renamed", 10, "a folder put back")
    assert not list((ws.state / journal.FOLDER).glob("*"))  # every marker taken

    # The runner killed: nobody watches, so every session is looked at again (a stale row is mended).
    pid = int((ws.state / "runner.lock").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not trusted(ws), 10, "untrusted")
    falsify_row(ws, old.id)
    assert statuses(ws)[old.id]["name"] == "renamed"


def test_the_watch_trusts_after_a_complete_look_and_stops_trusting_when_events_are_lost(ws, scripted):
    ws = scripted(SCRIPT)
    write_goal(ws, "first", name="a")
    run_once(ws)
    a = session_named(ws, "a")
    lock = RunnerLock(ws)  # this process is "the runner"
    said: list[str] = []
    watch = JournalWatch(ws, said.append)
    try:
        watch.start()
        wait_for(lambda: trusted(ws), 10, "trusted after the complete look")
        (a.dir / "result.md").write_text("by hand\n")
        wait_for(lambda: (ws.state / journal.FOLDER / a.id).exists(), 10, "the hand edit marked")
        hold_look(watch)
        watch._on_overflow()  # as inotify reports a queue overflow
        assert not trusted(ws)
        watch.held.set()
        wait_for(lambda: trusted(ws), 10, "trusted again after another complete look")
        assert said == []
    finally:
        watch.stop()
        lock.release()
    assert not trusted(ws)  # no runner holds the lock


def test_which_sessions_hold_a_harness_folder_is_kept_by_the_journal_and_dropped_with_its_trust(ws, scripted):
    """`status` reports broken session-local harness files. With the journal trusted it knows which sessions have
    a harness folder without a stat of every session: made, and removed, by hand, both are seen."""
    ws = scripted(SCRIPT)
    write_goal(ws, "first", name="a")
    write_goal(ws, "second", name="b")
    run_once(ws)
    a = session_named(ws, "a")
    lock = RunnerLock(ws)
    watch = JournalWatch(ws, lambda msg: None)

    def holders():
        with Index(ws.root) as index:
            index.sync(columns=("id",))  # what a command does first: the journal taken
            return index.harness_sessions()

    try:
        watch.start()
        wait_for(lambda: trusted(ws), 10, "trusted")
        assert holders() == []
        (a.dir / "harness" / "notes").mkdir(parents=True)  # by hand: a file that is no harness entry
        (a.dir / "harness" / "notes" / "todo.txt").write_text("x\n")
        wait_for(lambda: holders() == [a.id], 10, "the new harness folder seen")
        r = cli(ws, "status")
        assert r.returncode == 0 and "harness file skipped" in r.stderr and "todo.txt" in r.stderr, r.stderr
        os.rename(a.dir / "harness", ws.root / "put-aside")
        wait_for(lambda: holders() == [], 10, "the harness folder gone")
        assert "harness file skipped" not in cli(ws, "status").stderr
        hold_look(watch)
        watch._on_overflow()
        assert holders() is None  # untrusted: every session is looked at
        watch.held.set()
        wait_for(lambda: holders() == [], 10, "trusted again, the harness set made again")
    finally:
        watch.stop()
        lock.release()


def test_an_index_built_anew_under_a_watching_runner_is_trusted_again_without_a_restart(ws, scripted, monkeypatch):
    """`primefs reindex` builds the index anew, without the trust the runner's watch gave it: the watch sees that
    (RECHECK_S) and looks at every session again, so commands go back to reading the journal."""
    from primefs.runner import journalwatch

    monkeypatch.setattr(journalwatch, "RECHECK_S", 0.2)
    ws = scripted(SCRIPT)
    write_goal(ws, "first", name="a")
    run_once(ws)
    lock = RunnerLock(ws)
    said: list[str] = []
    watch = JournalWatch(ws, said.append)
    looks = []
    look = watch._complete
    watch._complete = lambda: (looks.append(1), look())
    try:
        watch.start()
        wait_for(lambda: trusted(ws), 10, "trusted after the complete look")
        time.sleep(3 * journalwatch.RECHECK_S)
        assert len(looks) == 1  # checked, and still given: no look again
        r = cli(ws, "reindex")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: len(looks) == 2 and trusted(ws), 10, "trusted again after another complete look")
        assert said == []
    finally:
        watch.stop()
        lock.release()


def test_a_reader_killed_after_taking_leaves_the_marker_for_the_next(tmp_path):
    root = tmp_path / "ws"
    (root / "sessions" / "s1").mkdir(parents=True)
    journal.mark_session(root / "sessions" / "s1")
    journal.mark_session(root / "sessions" / "s1")  # marked twice: one marker
    assert journal.take(root) == ["s1"]  # taken, the reader "killed" before done()
    journal.mark_session(root / "sessions" / "s1")  # written again meanwhile
    assert journal.take(root) == ["s1"]
    journal.done(root, ["s1"])
    assert journal.take(root) == [] and not list((root / ".primefs" / "changed").iterdir())
    assert journal.marker_of(tmp_path / "elsewhere" / "s2") is None  # not a workspace's session: no marker
