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
