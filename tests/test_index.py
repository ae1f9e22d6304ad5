"""The index (.primefs/index.sqlite): a cache that may be deleted, damaged or locked at any time;
`primefs logs` and `primefs reindex` on it."""
from __future__ import annotations

import json
import re
import sqlite3
import time

import pytest
from conftest import cli
from scaletools import fan_out, grow, recount

from primefs.index import database as indexmod
from primefs.index.db import Index, session_ids
from primefs.store.session import Session


def usage_of_all(ws) -> dict:
    r = cli(ws, "status", "--json")
    assert r.returncode == 0 and not r.stderr, r.stderr
    return {rec["id"]: rec["usage"] for rec in json.loads(r.stdout)}


def truth(ws) -> dict:
    return {sid: recount(ws.sessions / sid)[0] for sid in session_ids(ws.sessions)}


def test_deleted_damaged_or_locked_index_still_gives_exact_answers(ws, monkeypatch):
    ws = fan_out(ws)
    path = ws.state / indexmod.FILE
    assert usage_of_all(ws) == truth(ws) and path.exists()
    for damage in (lambda: path.unlink(), lambda: path.write_bytes(b"garbage" * 1000),
                   lambda: path.write_bytes(path.read_bytes()[:3000])):
        for suffix in ("-wal", "-shm"):
            (ws.state / (indexmod.FILE + suffix)).unlink(missing_ok=True)
        damage()
        assert usage_of_all(ws) == truth(ws)
    # a row damaged by hand (its own table, not the file): the row is written again from the summary
    db = sqlite3.connect(path)
    db.execute("UPDATE sessions SET usage = '{}', keys = '[]'")
    db.commit()
    db.close()
    assert usage_of_all(ws) == truth(ws)
    # another process holds the write lock: answers stay right, the write is skipped (tried again next time)
    monkeypatch.setattr(indexmod, "BUSY_S", 0.2)
    s = Session(ws.sessions / session_ids(ws.sessions)[1])
    s.history.append("model_call", model="m", purpose="llm", input_tokens=3, output_tokens=4, cost_usd=0.0,
                     cost_known=True, latency_s=0.1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        index = Index(ws.root)
        rows = index.sync()
        index.close()
        assert {sid: row["usage"] for sid, row in rows.items()} == truth(ws)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert usage_of_all(ws) == truth(ws)


def test_names_and_new_sessions_are_found_without_a_full_look(ws):
    ws = fan_out(ws)
    grow(ws, 3)
    index = Index(ws.root)
    index.sync()
    newest = max(sid for sid in session_ids(ws.sessions))
    assert index.find("fan") == max(sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).name == "fan")
    index.close()
    r = cli(ws, "usage", "fan", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    own, _ = recount(ws.sessions / data["session"])
    assert data["own"] == own and newest


def test_logs_filters_counts_and_json(ws):
    ws = fan_out(ws)
    grow(ws, 2)
    sids = session_ids(ws.sessions)
    everything = [json.loads(line) for sid in sids for line in open(ws.sessions / sid / "history.jsonl")]
    r = cli(ws, "logs", "-n", "0", "--json")
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)
    assert len(events) == len(everything) and all("session" in e and "session_name" in e for e in events)
    spawns = [e for e in events if e["type"] == "spawn"]  # an event's own `name` (the child's) is kept
    assert spawns and all(e["name"] != e["session_name"] for e in spawns)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)  # newest last
    # -n: the newest N; the footer says how many matched
    r = cli(ws, "logs", "-n", "3")
    assert len(r.stdout.splitlines()) == 3 and f"{len(everything):,} matching event(s)" in r.stderr
    # by type and model, counted
    r = cli(ws, "logs", "--counts", "--json", "-t", "model_call")
    counts = json.loads(r.stdout)
    assert counts["events"] == sum(e["type"] == "model_call" for e in everything)
    assert counts["model_calls"] == {"scripted/fan.yaml": counts["events"]} and counts["sessions"] == len(sids)
    r = cli(ws, "logs", "--counts", "--json", "-m", "openai/*")
    assert json.loads(r.stdout)["events"] == 0
    # by session (a name: the newest of that name) and its tree, by name pattern, by status
    root = max(sid for sid in sids if Session(ws.sessions / sid).name == "fan")
    tree = [sid for sid in sids if sid == root or Session(ws.sessions / sid).meta.get("parent") == root]
    r = cli(ws, "logs", "-s", "fan", "--tree", "-n", "0", "--json")
    assert {e["session"] for e in json.loads(r.stdout)} == set(tree)
    r = cli(ws, "logs", "--name", "fan.*", "--counts", "--json")
    assert json.loads(r.stdout)["sessions"] == len(sids) - 3
    r = cli(ws, "logs", "--status", "done", "--counts", "--json")
    assert json.loads(r.stdout)["events"] == len(everything)
    # text: words (not parts of words: "child" is not "children"), a prefix
    r = cli(ws, "logs", "-q", "child", "-t", "task", "-n", "0", "--json")
    assert sorted(e["text"] for e in json.loads(r.stdout)) == sorted(
        e["text"] for e in everything if e["type"] == "task" and re.search(r"\bchild\b", e["text"]))
    r = cli(ws, "logs", "-q", "child*", "-t", "task", "--counts", "--json")
    assert json.loads(r.stdout)["events"] == sum(e["type"] == "task" for e in everything)
    # time
    middle = sorted(e["ts"] for e in everything)[len(everything) // 2]
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(middle + 1))
    r = cli(ws, "logs", "--since", since, "--counts", "--json")
    assert json.loads(r.stdout)["events"] == sum(e["ts"] >= int(middle + 1) for e in everything)
    r = cli(ws, "logs", "--until", "1d", "--counts", "--json")  # a day ago: the copies are ten days old
    assert json.loads(r.stdout)["events"] == sum(e["ts"] < time.time() - 86400 for e in everything) > 0


def test_logs_sees_new_events_and_rewritten_histories(ws):
    ws = fan_out(ws)
    assert cli(ws, "logs", "-n", "1").returncode == 0  # indexed
    sid = session_ids(ws.sessions)[0]
    s = Session(ws.sessions / sid)
    s.history.append("notice", text="an unusual marker word: zanzibar")
    r = cli(ws, "logs", "-q", "zanzibar", "--json")
    assert [e["text"] for e in json.loads(r.stdout)] == ["an unusual marker word: zanzibar"]
    path = ws.sessions / sid / "history.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))  # cut (a hand edit)
    r = cli(ws, "logs", "-q", "zanzibar", "--json")
    assert json.loads(r.stdout) == []


@pytest.mark.parametrize("args, words", [
    (("--since", "yesterday-ish"), "--since"), (("-q", '"unbalanced'), "--query"), (("--status", "sleeping"), "--status"),
    (("-s", "nobody"), "nobody"), (("-n", "-1"), "--count"), (("--tree",), "--tree")])
def test_logs_mistakes_are_one_line(ws, args, words):
    ws = fan_out(ws)
    r = cli(ws, "logs", *args)
    assert r.returncode == 1 and r.stderr.startswith("error:") and words in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_reindex_rebuilds_everything(ws):
    ws = fan_out(ws)
    grow(ws, 2)
    before = cli(ws, "logs", "-n", "0", "--json").stdout
    (ws.state / indexmod.FILE).write_bytes(b"not a database")
    r = cli(ws, "reindex", "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    total = sum(1 for sid in session_ids(ws.sessions) for _ in open(ws.sessions / sid / "history.jsonl"))
    assert done["sessions"] == len(session_ids(ws.sessions)) and done["events"] == total
    assert cli(ws, "logs", "-n", "0", "--json").stdout == before
    r = cli(ws, "reindex", "--summaries")
    assert r.returncode == 0 and "indexed" in r.stdout
    assert usage_of_all(ws) == truth(ws)


def _two_writers_at_once(monkeypatch, *calls) -> None:
    """Each call reads what to index; only then do their writes happen, one after the other (two
    commands that read the same rows before either wrote)."""
    from primefs.index import events as eventindex

    held = []
    real = eventindex.EventIndexer.flush
    monkeypatch.setattr(eventindex.EventIndexer, "flush", lambda self: held.append(self))
    for call in calls:
        call()
    monkeypatch.setattr(eventindex.EventIndexer, "flush", real)
    for indexer in held:
        indexer.flush()


def _events_per_session(index: Index) -> dict:
    return dict(index.run(lambda db: db.execute(
        "SELECT s.id, count(e.id) FROM sessions s LEFT JOIN events e ON e.session = s.key GROUP BY s.id").fetchall()))


def _lines(data: bytes) -> int:
    return sum(1 for line in data.splitlines() if line.strip())


def test_two_index_writers_at_once_store_each_event_once(ws, monkeypatch):
    from primefs.index.events import sync_events

    ws = fan_out(ws)
    one, two = Index(ws.root), Index(ws.root)
    one.sync(), two.sync()
    _two_writers_at_once(monkeypatch, lambda: sync_events(one), lambda: sync_events(two))
    counts = _events_per_session(one)
    assert counts == {sid: _lines((ws.sessions / sid / "history.jsonl").read_bytes()) for sid in session_ids(ws.sessions)}
    # appended lines, again read by both before either writes
    Session(ws.sessions / session_ids(ws.sessions)[0]).history.append("notice", text="appended")
    _two_writers_at_once(monkeypatch, lambda: sync_events(two), lambda: sync_events(one))
    assert sum(_events_per_session(two).values()) == sum(counts.values()) + 1
    r = cli(ws, "logs", "--counts", "--json")
    assert json.loads(r.stdout)["events"] == sum(counts.values()) + 1
    one.close(), two.close()


def test_two_processes_adding_the_same_archive_store_its_events_once(ws, monkeypatch):
    import zipfile

    from primefs.index.archived import index_archive

    ws = fan_out(ws)
    assert cli(ws, "archive", "--json").returncode == 0
    (place,) = [f"archive/{p.name}" for p in (ws.root / "archive").glob("*.zip")]
    with zipfile.ZipFile(ws.root / place) as z:
        truth = {n.split("/")[1]: _lines(z.read(n)) for n in z.namelist() if n.endswith("/history.jsonl")}
    for suffix in ("", "-wal", "-shm"):
        (ws.state / (indexmod.FILE + suffix)).unlink(missing_ok=True)
    one, two = Index(ws.root), Index(ws.root)
    _two_writers_at_once(monkeypatch, lambda: index_archive(one, place), lambda: index_archive(two, place))
    assert _events_per_session(one) == truth
    one.close(), two.close()


def test_a_session_renamed_by_hand_is_found_by_its_new_name_only(ws):
    from primefs.index.db import find_session, session_names

    ws = fan_out(ws)
    grow(ws, 1)
    index = Index(ws.root)
    index.sync()
    fans = sorted(sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).name == "fan")
    assert len(fans) == 2 and index.find("fan") == fans[1]
    path = ws.sessions / fans[1] / "session.yaml"
    path.write_text(path.read_text().replace("name: fan\n", "name: renamed\n"))  # by hand, the row not told
    assert index.find("renamed") == fans[1]
    assert index.find("fan") == fans[0]  # the other one of the old name
    path.write_text(path.read_text().replace("name: renamed\n", "name: again\n"))
    assert session_names(ws.sessions)[fans[1]] == "again"
    assert find_session(ws.sessions, "again").id == fans[1]
    r = cli(ws, "usage", "again", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["session"] == fans[1], r.stderr
    assert index.find("renamed") is None
    index.close()


def test_a_mended_session_yaml_puts_its_subtree_back_for_stop_tree(ws):
    from primefs.index.db import descendants

    ws = fan_out(ws)
    root = next(sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).meta.get("parent") is None)
    child = next(sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).meta.get("parent") == root)
    below = grow(ws, 1, parent=child)  # a tree under the child
    everyone = sorted(set(session_ids(ws.sessions)) - {root})
    assert sorted(descendants(ws, root)) == everyone
    path = ws.sessions / child / "session.yaml"
    good = path.read_text()
    path.write_text(good + "limits: [not closed\n")  # broken by hand ...
    assert "session broken" in cli(ws, "status", "--json").stderr  # a `status` stores its row as broken
    assert sorted(descendants(ws, root)) == sorted(set(everyone) - {child, *below})
    path.write_text(good)  # ... and mended
    assert sorted(descendants(ws, root)) == everyone
    r = cli(ws, "logs", "--counts", "--json", "-s", root, "--tree")
    assert r.returncode == 0 and json.loads(r.stdout)["sessions"] == len(everyone) + 1, r.stderr
    # a parent changed by hand counts too
    other = below[0]
    meta = ws.sessions / other / "session.yaml"
    meta.write_text(meta.read_text().replace(f"parent: {child}", f"parent: {root}"))
    assert set(descendants(ws, root)) == set(everyone)
    index = Index(ws.root)
    assert index.subtree(child) == [child] and index.subtree(root)[:1] == [root]
    index.close()


def test_a_kernel_searches_every_session_archived_ones_too(ws, scripted):
    """history.search(..., scope="workspace") from a session's kernel finds what a session of another tree
    printed, after that tree went into an archive; scope="tree" keeps to its own tree."""
    from conftest import cli, run_once

    from primefs.store.goals import write_goal
    from primefs.store.session import list_sessions

    ws = scripted('rules:\n'
                  '  - match: "leave a mark"\n'
                  '    replies:\n'
                  '      - code: "print(\'zebra-crossing seen\')"\n'
                  '      - text: "marked"\n'
                  '  - match: "look around"\n'
                  '    replies:\n'
                  '      - code: "hits = history.search(\'zeb\' + \'ra\', scope=\'workspace\')\\n'
                  'print([(h[\'session_name\'], h[\'type\']) for h in hits if h[\'type\'] == \'cell\'])\\n'
                  'print(len(history.search(\'zeb\' + \'ra\', scope=\'tree\')))\\n'
                  'for bad in (dict(text=\'\\"open\', scope=\'workspace\'), dict(text=\'x\', scope=\'galaxy\')):\\n'
                  '    try:\\n'
                  '        history.search(bad[\'text\'], scope=bad[\'scope\'])\\n'
                  '    except ValueError as exc:\\n'
                  '        print(\'refused:\', str(exc)[:60])"\n'
                  '      - text: "looked"\n')
    write_goal(ws, "leave a mark", name="marker")
    run_once(ws)
    assert [s.read_result() for s in list_sessions(ws.sessions)] == ["marked"]
    r = cli(ws, "archive", "--status", "idle", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["sessions"] == 1, r.stdout + r.stderr
    write_goal(ws, "look around", name="looker")
    run_once(ws)
    [looker] = [s for s in list_sessions(ws.sessions) if s.name == "looker"]
    [cell] = looker.events("cell")
    lines = cell["output"].splitlines()
    assert lines[0] == "[('marker', 'cell')]" and lines[1] == "0", cell["output"]
    assert lines[2].startswith("refused: history.search() '\"open'") and "scope is 'session'" in lines[3]


def _index_contents(ws) -> tuple:
    db = sqlite3.connect(ws.root / ".primefs" / "index.sqlite")
    try:
        events = db.execute("SELECT s.id, e.n, e.ts, e.type, e.model, e.pos, e.len FROM events e "
                            "JOIN sessions s ON s.key = e.session ORDER BY s.id, e.pos").fetchall()
        found = db.execute("SELECT s.id, e.pos FROM events_text t JOIN events e ON e.id = t.rowid JOIN sessions s "
                           "ON s.key = e.session WHERE events_text MATCH 'children' ORDER BY 1, 2").fetchall()
        rows = db.execute("SELECT id, indexed, indexed_check FROM sessions ORDER BY id").fetchall()
    finally:
        db.close()
    return events, found, rows


def _reindexed(ws, monkeypatch, executable: str | None = None, apart: bool = True) -> tuple:
    import sys

    from primefs.index import events as eventindex

    with monkeypatch.context() as m:
        m.setattr(eventindex, "APART_AT", 1 if apart else 10 ** 9)
        m.setattr(eventindex, "APART_BATCH", 1)  # a batch per history: several lines to send
        if executable:
            m.setattr(sys, "executable", executable)
        with Index(ws.root) as index:
            index.rebuild()
            index.sync()
            seen: list = []
            added = eventindex.sync_events(index, progress=lambda k, total=None: seen.append((k, total)))
    assert seen[0] == (0, len(session_ids(ws.sessions))) and sum(k for k, _ in seen) == seen[0][1]
    return added, _index_contents(ws)


def test_histories_read_in_a_process_of_their_own_index_what_one_process_does(ws, monkeypatch, tmp_path):
    """reindex reads histories in a second process (events.read_apart) while it writes: the index must be the
    same, event for event, as one process makes; and if that process dies part way (here: its output cut after
    the first batch) or cannot start, the histories it did not send are read here."""
    import stat
    import sys

    ws = fan_out(ws)
    grow(ws, 2)
    alone = _reindexed(ws, monkeypatch, apart=False)
    assert alone[0] > 0 and alone[1][1]  # events, and text found
    assert _reindexed(ws, monkeypatch) == alone
    cut = tmp_path / "python-cut"  # the real reader, its output cut after one line
    cut.write_text(f'#!/bin/sh\n"{sys.executable}" "$@" | head -n 1\n')
    cut.chmod(cut.stat().st_mode | stat.S_IXUSR)
    assert _reindexed(ws, monkeypatch, executable=str(cut)) == alone
    assert _reindexed(ws, monkeypatch, executable=str(tmp_path / "no-such-python")) == alone
