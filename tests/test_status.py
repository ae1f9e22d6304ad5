"""`primefs status` folds what is finished: finished children into a count, finished trees beyond the newest
FINISHED_TREES into one "+N older trees" line, read from light rows without reading those trees whole
(cli/views.folded). The folded view must say what folding every session's full record says."""
from __future__ import annotations

from collections import Counter

from conftest import cli

from primefs.cli.views import STATUS_COLUMNS, folded, session_record, status_row
from primefs.index.accounting import UsageIndex, tree_order
from primefs.store.session import create_session
from primefs.views.sessions import FINISHED_TREES, Folded, arrange


def tree(ws, name: str, statuses: list[str]) -> str:
    """A root with one child per status (the root's own status is the first)."""
    root = create_session(ws.sessions, task=name, name=name, model="scripted/x")
    root.set_status(statuses[0])
    for i, status in enumerate(statuses[1:]):
        create_session(ws.sessions, task=f"{name}.{i}", name=f"{name}.{i}", model="scripted/x", parent=root.id,
                       depth=1).set_status(status)
    return root.id


def shape(items) -> list:
    return [("folded", x.depth, x.trees, dict(x.counts)) if isinstance(x, Folded) else (x.id, x.depth, x.label)
            for x in items]


def test_old_finished_trees_fold_unread_as_every_record_would(ws):
    old = [tree(ws, f"old{i}", ["idle", "done", "idle"]) for i in range(4)]
    failed_old = tree(ws, "failed-old", ["idle", "failed"])  # older than the newest 20: shown all the same
    newer = [tree(ws, f"new{i}", ["idle", "stopped"]) for i in range(FINISHED_TREES)]
    busy = tree(ws, "busy", ["running", "idle", "pending"])

    everyone = UsageIndex(ws.sessions, columns=STATUS_COLUMNS)
    full = arrange([status_row(session_record(everyone, sid)) for sid in tree_order(everyone)],
                   trees=FINISHED_TREES)
    index, shown, light = folded(ws)
    rows = {sid: status_row(session_record(index, sid)) for sid in shown if isinstance(sid, str)}
    fast = arrange([rows[x] if isinstance(x, str) else x for x in shown], trees=FINISHED_TREES)
    assert shape(fast) == shape(full)

    assert len(light) == 3 * 4 + 2 + 2 * FINISHED_TREES + 3  # every session's light row
    assert not set(index.rows) & set(old)  # the old trees were not read whole
    assert {failed_old, busy, *newer} <= set(index.rows)
    [line] = [x for x in fast if isinstance(x, Folded) and x.trees]
    assert line.trees == 4 and line.counts == Counter({"idle": 8, "done": 4})

    out = cli(ws, "status").stdout
    assert "+4 older trees" in out and "8 idle, 4 done" in out and "failed-old" in out and "busy" in out
    assert "old0" not in out and "new0" in out
    everything = cli(ws, "status", "--all").stdout
    assert "old0" in everything and "older trees" not in everything


def test_status_json_says_what_every_record_says(ws):
    """status --json makes each object in SQLite and sums only trees with children: it must say exactly what
    session_record says of every session, with tree sums, per-tool counts, a broken session.yaml, a session cut
    off mid-turn (no runner), text with quotes and `},{"id":` in it, and a row stored before cached tokens."""
    import json
    import sqlite3

    from primefs.store.session import Session

    root = tree(ws, "root", ["idle", "idle", "running"])
    kids = sorted(p.name for p in ws.sessions.iterdir() if p.is_dir() and p.name != root)
    grandchild = create_session(ws.sessions, task="g", name='q"},{"id":"x', model="m", parent=kids[0], depth=2)
    lone = tree(ws, "lone", ["idle"])
    for i, sid in enumerate([root, kids[0], grandchild.id, lone]):
        h = Session(ws.sessions / sid).history
        h.append("model_call", model="m", purpose="llm", input_tokens=3 + i, output_tokens=4, cost_usd=0.25 * i,
                 cost_known=True, cache_read_tokens=i, latency_s=0.1)
        h.append("tool_call", name=["python", "rlm"][i % 2], duration_s=0.5 + i, error="x" if i == 2 else None)
    (ws.sessions / grandchild.id / "result.md").write_text("é ✓ \"quoted\" },{\"id\":1}\n")
    broken = create_session(ws.sessions, task="b", name="b", model="m", parent=root, depth=1)
    (ws.sessions / broken.id / "session.yaml").write_text("status: [unclosed\n")

    def both(*args):
        r = cli(ws, "status", "--json", *args)
        assert r.returncode == 0, r.stderr
        index = UsageIndex(ws.sessions, columns=STATUS_COLUMNS)
        records = [session_record(index, sid) for sid in tree_order(index)]
        for rec in records:
            if rec["status"] == "running":
                rec["interrupted"] = True
        return json.loads(r.stdout), records

    shown, records = both()
    assert shown == records and len(shown) == 6
    [top] = [x for x in shown if x["id"] == root]
    assert top["tree_usage"]["calls"] == 3 and top["tree_usage"]["tools"] == {
        "python": {"calls": 2, "errors": 1, "seconds": 3.0}, "rlm": {"calls": 1, "errors": 0, "seconds": 1.5}}
    assert top["tree_usage"]["cost_usd"] == 0.75 and top["tree_usage"]["cache_read_tokens"] == 3
    assert [x["interrupted"] for x in shown if x["status"] == "running"] == [True]
    assert [x["status"] for x in shown if x["id"] == broken.id] == ["broken"]

    # a row stored before cached tokens were counted: given with them (0), as Index.rows gives it
    db = sqlite3.connect(ws.root / ".primefs" / "index.sqlite")
    db.execute("UPDATE sessions SET usage = json_remove(usage, '$.cache_read_tokens', '$.cache_write_tokens') "
               "WHERE id = ?", (lone,))
    # and one stored with json.dumps's spaces (as an earlier primefs wrote it): printed compact all the same
    db.execute("UPDATE sessions SET usage = ? WHERE id = ?",
               (json.dumps(json.loads(db.execute("SELECT usage FROM sessions WHERE id = ?", (kids[1],)).fetchone()[0])),
                kids[1]))
    db.commit()
    db.close()
    shown, records = both()
    assert shown == records and [x["usage"]["cache_read_tokens"] for x in shown if x["id"] == lone] == [0]
    assert [x["id"] for x in json.loads(cli(ws, "status", "--json", kids[0]).stdout)] == [kids[0], grandchild.id]


def test_status_json_records_are_made_whatever_wrote_the_row(ws):
    """Each row's record (database.RECORD) is made by triggers when the row is written: also by a writer that
    knows nothing of it (an older primefs). An index from before it, or with triggers of another text, gets the
    column and every record on open."""
    import json
    import sqlite3

    from primefs.index.database import RECORDS
    from primefs.index.db import Index

    root = tree(ws, "root", ["idle", "done"])
    path = ws.root / ".primefs" / "index.sqlite"

    def check() -> list[dict]:
        shown = json.loads(cli(ws, "status", "--json").stdout)
        index = UsageIndex(ws.sessions, columns=STATUS_COLUMNS)
        assert shown == [session_record(index, sid) for sid in tree_order(index)]
        return shown

    check()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE sessions SET status = 'failed', error = 'by hand' WHERE id = ?", (root,))  # no record named
    (record,) = db.execute("SELECT record FROM sessions WHERE id = ?", (root,)).fetchone()
    assert json.loads(record)["error"] == "by hand"
    for name in RECORDS:  # an index from before records: no triggers, no column
        db.execute(f"DROP TRIGGER {name}")
    db.execute("ALTER TABLE sessions DROP COLUMN record")
    db.execute("UPDATE sessions SET status = 'stopped'")
    db.close()
    (ws.sessions / root / "result.md").write_text("mended\n")  # a row written again on the next look
    shown = check()
    assert [x["status"] for x in shown] == ["idle", "stopped"]  # the root's row from its files, the child's as set
    db = sqlite3.connect(path, isolation_level=None)  # triggers of another text (RECORD_KEYS changed): made again
    db.execute("DROP TRIGGER records_update")
    db.execute("CREATE TRIGGER records_update AFTER UPDATE ON sessions BEGIN UPDATE sessions SET record = '{}' "
               "WHERE key = NEW.key; END")
    db.execute("UPDATE sessions SET record = '{}'")
    db.close()
    check()
    with Index(ws.root) as index:
        assert index.run(lambda c: c.execute("SELECT sql FROM sqlite_master WHERE name = 'records_update'")
                         .fetchone()[0]) == RECORDS["records_update"]


def test_status_json_keeps_tree_sums_and_makes_again_what_changed_below(ws):
    """The index keeps the tree sums status --json made (database.TREES); a change anywhere below a session (a
    model call, a child moved by hand, broken, mended, removed) must make its sum again, and its ancestors'."""
    import json
    import sqlite3

    from primefs.cli.views import json_status
    from primefs.store.session import Session

    root = tree(ws, "root", ["idle", "idle", "idle"])
    kids = sorted(p.name for p in ws.sessions.iterdir() if p.is_dir() and p.name != root)
    grandchild = create_session(ws.sessions, task="g", name="g", model="m", parent=kids[0], depth=2).id
    other = tree(ws, "other", ["idle", "idle"])

    def call(sid, n):
        Session(ws.sessions / sid).history.append("model_call", model="m", purpose="llm", input_tokens=n,
                                                  output_tokens=1, cost_usd=0.1, cost_known=True, latency_s=0.1)

    def kept():
        db = sqlite3.connect(ws.root / ".primefs" / "index.sqlite")
        try:
            return dict(db.execute("SELECT id, usage FROM trees").fetchall())
        finally:
            db.close()

    def check():
        text = "[" + ",".join(json_status(ws, None)[0]) + "]"
        index = UsageIndex(ws.sessions, columns=STATUS_COLUMNS)
        assert json.loads(text) == [session_record(index, sid) for sid in tree_order(index)]
        return {r["id"]: r["tree_usage"] for r in json.loads(text)}

    for sid in (root, kids[0], grandchild, other):
        call(sid, 10)
    sums = check()
    assert sums[root]["calls"] == 3 and set(kept()) == {root, kids[0], other}  # sessions with children only
    assert check() == sums  # from what was kept

    call(grandchild, 5)  # two levels below the root
    sums = check()
    assert sums[root]["calls"] == 4 and sums[kids[0]]["input_tokens"] == 25

    meta = ws.sessions / grandchild / "session.yaml"  # moved to another tree by hand: both trees change
    meta.write_text(meta.read_text().replace(kids[0], other))
    sums = check()
    assert sums[root]["calls"] == 2 and sums[other]["calls"] == 3 and kids[0] not in kept()

    meta = ws.sessions / kids[1] / "session.yaml"  # broken, then mended
    good = meta.read_text()
    meta.write_text("status: [unclosed\n")
    call(kids[1], 7)
    assert check()[root]["calls"] == 2
    meta.write_text(good)
    sums = check()
    assert sums[root]["calls"] == 3
    create_session(ws.sessions, task="n", name="n", model="m", parent=kids[1], depth=2)  # a leaf gets a child
    call(kids[1], 1)
    assert check()[root]["calls"] == sums[root]["calls"] + 1

    import shutil
    shutil.rmtree(ws.sessions / other)  # its children are shown as trees of their own
    check()


def test_tree_sums_made_from_rows_another_process_changed_are_not_kept(ws):
    """A sum made from rows read before another process wrote may be stale: keep_trees keeps nothing then, and
    the sessions marked changed stay marked."""
    from primefs.index.db import Index
    from primefs.store.session import Session

    def count(db, table):
        return db.run(lambda c: c.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    root = tree(ws, "root", ["idle", "idle"])
    with Index(ws.root) as mine, Index(ws.root) as theirs:
        mine.sync()
        marked = count(mine, "trees_changed")
        assert marked == 2  # each row written (the root, also as the parent of the other)
        Session(ws.sessions / root).history.append("notice", text="a row marked already, written again")
        mine.sync()
        assert count(mine, "sessions") == 2 and count(mine, "trees_changed") == marked
        version = mine.data_version()
        theirs.set_state("x", "1")
        mine.keep_trees({"a": "{}"}, set(), version)
        assert (count(mine, "trees"), count(mine, "trees_changed")) == (0, marked)
        mine.keep_trees({"a": "{}"}, set(), mine.data_version())
        assert (count(mine, "trees"), count(mine, "trees_changed")) == (1, 0)


def test_names_that_begin_alike_stay_apart_at_80_columns(ws, scripted):
    """Goals named by the second they came begin alike, and so do a parent's children (`fan.1` ... `fan.12`):
    an ellipsis at the end made different sessions look the same at 80 columns. Names are cut in the middle."""
    from conftest import cli, run_once

    from primefs.store.goals import write_goal

    ws = scripted("rules:\n  - match: '^Fan'\n    replies:\n"
                  "      - code: \"print(wait_all([rlm(f'kid {i}') for i in range(12)]))\"\n      - text: fanned\n"
                  "  - match: '^kid'\n    replies:\n      - text: kid done\n"
                  "  - match: '^Other'\n    replies:\n      - text: other done\n")
    write_goal(ws, "Fan out", name="20261206-162500-fan-out-to-kids")
    write_goal(ws, "Other job", name="20261206-162500-other-job")
    run_once(ws)
    import re

    out = cli(ws, "status", "-a", env={"COLUMNS": "80", "FORCE_COLOR": "1"}).stdout  # (as on a terminal)
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(len(line) <= 80 for line in lines), out
    names = [line.split()[0] for line in lines[1:] if not line.lstrip().startswith("+")]
    assert len(names) == 14 and len(set(names)) == 14, out  # two roots, twelve children: fourteen names
    assert any(n.endswith("kids.12") for n in names) and any(n.endswith("other-job") for n in names), out


def test_logs_fit_an_80_column_terminal_and_stay_whole_when_piped(ws, scripted):
    """At a terminal each event is one line of its width, the session by its name (cut in the middle), none
    when one session is asked for; piped, lines stay whole with ids, for scripts."""
    import re

    from conftest import cli, run_once

    from primefs.store.goals import write_goal

    reply = "The sum of the numbers from zero to nine is forty-five, as the kernel computed it just now."
    ws = scripted(f"default:\n  - code: print(sum(range(10)))\n  - text: {reply}\n")
    write_goal(ws, "Add up the numbers from zero to nine and say what the total is", name="20261206-193343-add-them-up")
    run_once(ws)
    term = {"COLUMNS": "80", "FORCE_COLOR": "1"}  # (as on a terminal)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", cli(ws, "logs", "-n", "0", env=term).stdout).splitlines()
    assert lines and all(len(line) <= 80 for line in lines), lines
    assert all(not line.startswith("2026") and "202612…3-add-them-up  " in line for line in lines), lines
    assert any(re.search(r"  result  The sum of the numbers.*…$", line) for line in lines), lines
    one = re.sub(r"\x1b\[[0-9;]*m", "", cli(ws, "logs", "-n", "0", "-s", "20261206-193343-add-them-up",
                                             env=term).stdout).splitlines()
    assert one and all(len(line) <= 80 and "add-them-up" not in line for line in one), one
    piped = cli(ws, "logs", "-n", "0", env={"FORCE_COLOR": ""}).stdout.splitlines()
    assert any(line.endswith(f"result  {reply}") and "(20261206-193343-add-them-up)" in line for line in piped), piped
