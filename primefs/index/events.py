"""Events in the index (index.py): for every history line, where it is (session, byte offset, length),
its time, type and model, and its text for full-text search (SQLite FTS5). `primefs logs` asks here.

The index holds no event itself: a matching event is read back from its history (or its archive), so
what is shown is always the file. Each session's row says how far into its history the events are
indexed (and the bytes before that offset): only lines appended since are read; a history rewritten
before that offset has its events indexed again. Text is indexed per field, each cut to FIELD_CHARS.
"""
from __future__ import annotations

import json
import os

from primefs.index.db import Index
from primefs.store import fastjson
from primefs.store.fsutil import open_regular
from primefs.store.history import NewEvents, check_at, still_there

TEXT_FIELDS = ("text", "task", "code", "output", "error", "answer", "report", "summary", "instructions", "detail")
FIELD_CHARS = 2000  # of each field: a cell's whole output is in the file, its start is enough to find it
BATCH = 50_000  # events written per transaction: other writers get their turn between batches


def event_text(e: dict) -> str:
    parts = [e[f][:FIELD_CHARS] for f in TEXT_FIELDS if isinstance(e.get(f), str)]
    return "\n".join(p for p in parts if p)


def read_events(key: int, model: str | None, f, size: int, indexed: int, check: str) -> tuple:
    """What EventIndexer stores of one open history `f`: its lines from `indexed` (its row's offset, with
    `check` its row's indexed_check) to `size`, as (key, (indexed, check) as read, (indexed, check) new, reset,
    events, texts)."""
    was = (indexed, check)
    reset = not still_there(f, indexed, check, size)
    if reset:
        indexed = 0
    events, texts = [], []
    read = NewEvents(f, indexed, size)
    for start, end, e in read:
        n, ts = e.get("n"), e.get("ts")
        events.append((key, n if isinstance(n, int) else None, ts if isinstance(ts, (int, float)) else None,
                       str(e.get("type")), str(e.get("model") or model or ""), start, end - start))
        texts.append(event_text(e))
    return key, was, (read.offset, check_at(f, read.offset)), reset, events, texts


def read_history(task: tuple) -> tuple | None:
    """read_events of a history file, task (key, path, model, indexed, check); None if it cannot be opened."""
    key, path, model, indexed, check = task
    try:
        with open_regular(path) as f:
            return read_events(key, model, f, f.seek(0, 2), indexed, check)
    except OSError:
        return None


class EventIndexer:
    """Adds the new lines of histories to the events table, in batches. A session's events are stored
    only if its row still says what was read before (offset and check): another writer that indexed
    the same lines meanwhile (two commands at once) made its row move on, and this one skips them."""

    def __init__(self, index: Index):
        self.index = index
        self.queued: list[tuple] = []  # read_events of each session
        self.count = 0
        self.added = 0

    def session(self, key: int, model: str | None, f, size: int, indexed: int, check: str) -> None:
        """Queue the events of one open history (read_events)."""
        self.add(read_events(key, model, f, size, indexed, check))

    def add(self, read: tuple | None) -> None:
        """Queue read_events of a session (None: read_history could not open it, nothing to queue)."""
        if read is None:
            return
        self.queued.append(read)
        self.count += len(read[4])
        if self.count >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.queued:
            return
        queued, self.queued, self.count = self.queued, [], 0
        added = 0

        def store(db):
            nonlocal added
            added = 0
            # ids given here (each past the largest ever given: AUTOINCREMENT's own rule), so that every event
            # and its text go in with one executemany each, not two statements per event
            (last,) = db.execute("SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)").fetchone()
            rows, text_rows = [], []
            for key, (old, old_check), (new, new_check), reset, events, texts in queued:
                if db.execute("UPDATE sessions SET indexed = ?, indexed_check = ? WHERE key = ? AND indexed = ? "
                              "AND indexed_check = ?", (new, new_check, key, old, old_check)).rowcount != 1:
                    continue  # another writer indexed these lines meanwhile (or the row is gone)
                if reset:  # its text entries stay behind, matched to no event (ids are never reused)
                    db.execute("DELETE FROM events WHERE session = ?", (key,))
                for event, text in zip(events, texts):
                    last += 1
                    rows.append((last, *event))
                    if text:
                        text_rows.append((last, text))
                added += len(events)
            db.executemany("INSERT INTO events (id, session, n, ts, type, model, pos, len) VALUES (?,?,?,?,?,?,?,?)",
                           rows)
            db.executemany("INSERT INTO events_text (rowid, text) VALUES (?, ?)", text_rows)

        if not self.index.write(store):
            return  # locked by another writer all along: these are read again next time
        self.added += added


def sync_events(index: Index, ids: list[str] | None = None, progress=None) -> int:
    """Index the events appended to these sessions' histories (default: every session in sessions/)
    since they were last indexed. Rows are brought up to date first. Returns events added. `progress`:
    index_histories's."""
    if ids is None:
        index.sync(columns=("id",))  # every row in sessions/ current: the folders they name are there
        return index_histories(index, lambda sid: index.sessions_dir / sid, None, progress)
    rows = index.sync(ids, light=True)
    return index_histories(index, lambda sid: index.sessions_dir / sid if sid in rows else None, list(rows), progress)


def index_histories(index: Index, folder_of, ids: list[str] | None, progress=None) -> int:
    """Index what was appended to the histories of these sessions (`folder_of(id)`: its folder, wherever it
    is now, or None) since their rows were last indexed; `ids`: the sessions to look at (None: every row in
    sessions/). `progress(k, total=N)`: told of the histories to read, then of each read."""
    todo = index.run(lambda db: db.execute(  # those whose history's size (keys[0][2]) is not what was indexed
        "SELECT key, id, model, indexed, indexed_check, keys FROM sessions WHERE place = '' "
        "AND indexed IS NOT json_extract(keys, '$[0][2]')" +
        ("" if ids is None else " AND id IN (SELECT value FROM json_each(?))"),
        () if ids is None else (json.dumps(ids),)).fetchall())
    tasks = []
    for key, sid, model, indexed, check, keys in todo:
        history = json.loads(keys)[0]  # the history as the row's summary counted it (just brought up to date)
        folder = folder_of(sid)
        if folder is None or history is None or history[2] == indexed:
            continue  # all indexed (a file rewritten to the same size also changes the summary: reset below)
        tasks.append((key, str(folder / "history.jsonl"), model, indexed, check))
    progress = progress or (lambda k, total=None: None)
    progress(0, total=len(tasks))
    indexer = EventIndexer(index)
    done = read_apart(tasks, indexer, progress) if len(tasks) >= APART_AT else 0
    for task in tasks[done:]:
        indexer.add(read_history(task))
        progress(1)
    indexer.flush()
    return indexer.added


APART_AT = 500  # histories: more are read in a process of their own, while this one writes (reindex)
APART_BATCH = BATCH  # events sent at a time, each batch one transaction here


def read_apart(tasks: list[tuple], indexer: EventIndexer, progress) -> int:
    """Read these histories (read_history) in a process of their own (`python -m primefs.index.events`: one
    JSON line of tasks in, a JSON line per batch out) and store them here as they come: parsing is about half
    of indexing, SQLite's writes the other half, and each takes a core. Returns how many tasks (from the first)
    were stored; if that process cannot start or dies, the rest are left to the caller."""
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)  # (this primefs, wherever it was imported from: the folder that holds primefs/)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH"))))
    try:
        reader = subprocess.Popen([sys.executable, "-P", "-m", "primefs.index.events"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return 0
    done = 0
    try:
        reader.stdin.write(fastjson.dumps({"batch": APART_BATCH, "tasks": tasks}).encode() + b"\n")
        reader.stdin.close()
        for line in reader.stdout:
            if not line.endswith(b"\n"):
                break  # cut off: it died
            batch = fastjson.loads(line)
            for read in batch:
                indexer.add(read)
            indexer.flush()  # (each batch its own transaction: the reader goes on meanwhile)
            done += len(batch)
            progress(len(batch))
    except (OSError, ValueError):  # it died, or wrote what is not ours: what it did not send is read here
        pass
    finally:
        reader.kill()
        reader.stdout.close()
        reader.wait()
    return done


def _reader() -> None:
    """The reading process of read_apart."""
    import sys

    out = sys.stdout.buffer
    asked = fastjson.loads(sys.stdin.buffer.readline())
    batch, count = [], 0
    for task in asked["tasks"]:
        read = read_history(tuple(task))
        batch.append(read)
        count += len(read[4]) if read is not None else 0
        if count >= asked["batch"]:
            out.write(fastjson.dumps(batch).encode() + b"\n")
            out.flush()
            batch, count = [], 0
    out.write(fastjson.dumps(batch).encode() + b"\n")
    out.flush()


# filter -> (its condition, its arguments from the value); a filter given as None (or empty, but for
# `sessions`: an empty list matches nothing) is left out.
FILTERS = {
    "sessions": ("s.id IN (SELECT value FROM json_each(?))", lambda v: [json.dumps(v)]),
    "name": ("s.name GLOB ?", lambda v: [v]),  # a pattern: root.*, *report*
    "statuses": ("s.status IN (SELECT value FROM json_each(?))", lambda v: [json.dumps(v)]),
    "model": ("(e.model = ? OR e.model GLOB ?)", lambda v: [v, v]),
    "since": ("e.ts >= ?", lambda v: [v]),
    "until": ("e.ts < ?", lambda v: [v]),
    "types": ("e.type IN (SELECT value FROM json_each(?))", lambda v: [json.dumps(v)]),
    "text": ("e.id IN (SELECT rowid FROM events_text WHERE events_text MATCH ?)", lambda v: [v]),
}
KEEP_WHEN_EMPTY = {"sessions", "since", "until"}  # [] (no session) and 0 (the epoch) still filter


def query(index: Index, **filters) -> tuple[str, list]:
    """The FROM/WHERE part of a query over events and their sessions (filters: FILTERS), and its arguments."""
    where, args = [], []
    for key, value in filters.items():
        if value is None or (not value and key not in KEEP_WHEN_EMPTY):
            continue
        condition, arguments = FILTERS[key]
        where.append(condition)
        args += arguments(value)
    # the sessions table is joined only when a filter needs it (counting a million events is then a scan of one table)
    join = " JOIN sessions s ON s.key = e.session" if any("s." in w for w in where) else ""
    sql = "FROM events e" + join + (" WHERE " + " AND ".join(where) if where else "")
    return sql, args


def search(index: Index, limit: int | None, counts: bool = False, **filters) -> tuple[list[dict], dict]:
    """The newest `limit` matching events (oldest first, as a log reads; none if `counts`), and the
    number of matches: {"events", "sessions"}, with `counts` also "by_type" and "model_calls" (per model)."""
    sql, args = query(index, **filters)

    def run(db):
        hits = [] if counts else db.execute(
            f"SELECT h.id, s.id, s.name, s.place, h.pos, h.len FROM (SELECT e.id, e.session, e.ts, e.pos, e.len {sql} "
            "ORDER BY e.ts DESC, e.id DESC" + (" LIMIT ?" if limit else "") + ") h JOIN sessions s ON s.key = h.session "
            "ORDER BY h.ts DESC, h.id DESC", (*args, *([limit] if limit else []))).fetchall()
        if not counts:
            return hits, {"events": db.execute(f"SELECT count(*) {sql}", args).fetchone()[0]}
        found: dict = {"events": 0, "sessions": 0, "by_type": {}, "model_calls": {}}
        per = db.execute(f"SELECT e.session, e.type, e.model, count(*) {sql} GROUP BY 1, 2, 3", args).fetchall()
        sessions = set()
        for session, type_, model, n in per:  # one pass over the matches, summed here
            sessions.add(session)
            found["events"] += n
            found["by_type"][type_] = found["by_type"].get(type_, 0) + n
            if type_ == "model_call":
                found["model_calls"][model] = found["model_calls"].get(model, 0) + n
        found["sessions"] = len(sessions)
        for key in ("by_type", "model_calls"):
            found[key] = dict(sorted(found[key].items(), key=lambda kv: -kv[1]))
        return hits, found

    rows, counts = index.run(run)
    hits = [{"rowid": r[0], "session": r[1], "name": r[2], "place": r[3], "pos": r[4], "len": r[5]} for r in rows]
    return list(reversed(hits)), counts


if __name__ == "__main__":
    _reader()
