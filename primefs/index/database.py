"""The index's database: `.primefs/index.sqlite`, its schema and one connection to it (db.py keeps
the rows in it up to date)."""
from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

VERSION = 7  # PRAGMA user_version: another version is dropped and rebuilt
FILE = "index.sqlite"
SCHEMA = """
CREATE TABLE sessions (
  key INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL,
  name TEXT, parent TEXT, depth INTEGER, status TEXT, stop_reason TEXT, error TEXT, model TEXT, goal TEXT,
  created TEXT, updated TEXT, node TEXT, approval INTEGER,
  turns INTEGER, events INTEGER, usage TEXT, last TEXT, last_ts REAL, broken TEXT, result TEXT,
  keys TEXT,                              -- stat of history.jsonl, session.yaml, result.md the row came from
  place TEXT NOT NULL DEFAULT '',         -- '' for sessions/<id>/, else the archive file holding it
  indexed INTEGER NOT NULL DEFAULT 0,     -- bytes of history.jsonl whose events are in `events`
  indexed_check TEXT NOT NULL DEFAULT '', -- the bytes before that offset (history.still_there)
  marks TEXT                              -- mtimes of its folder, mail/new, mail/cur when last seen settled
);
CREATE INDEX sessions_parent ON sessions(parent);
CREATE INDEX sessions_name ON sessions(name);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: text entries of dropped events match nothing
  session INTEGER NOT NULL, n INTEGER, ts REAL, type TEXT, model TEXT,
  pos INTEGER NOT NULL, len INTEGER NOT NULL   -- where its line is in the history: files stay the truth
);
CREATE INDEX events_session ON events(session, pos);
CREATE INDEX events_ts ON events(ts);
CREATE INDEX events_type ON events(type, model, session);  -- covers -t/-m filters and --counts
CREATE VIRTUAL TABLE events_text USING fts5(text, content='');
-- Bigger segments, merged less often (reindex of 4.8 M events: 104 s -> 84 s, a search still in milliseconds):
-- a transaction's terms are kept in memory up to 64 MB before a segment is written, and 16 segments of a level
-- are merged, not 4.
INSERT INTO events_text (events_text, rank) VALUES ('hashsize', 67108864);
INSERT INTO events_text (events_text, rank) VALUES ('automerge', 16);
CREATE TABLE archives (
  place TEXT PRIMARY KEY,                 -- archive/<root>.zip
  stat TEXT,                              -- the stat of the file when its manifest was read
  sessions TEXT NOT NULL                  -- the session ids its manifest names (archived.sync_archives)
);
"""
# Added beside version 7's tables too: the usage of each session with children and all its descendants, as
# `status --json` made it from the rows (accounting.tree_texts), and the sessions changed since. Triggers mark
# every row written and its parents, old and new, whatever version of primefs writes: a sum is made again for
# each marked session with children and each ancestor of a marked session. (No OR IGNORE in them: the conflict
# rule of the statement that fires a trigger replaces its own, and an upsert's would fail the write.)
TREES = """
CREATE TABLE IF NOT EXISTS trees (id TEXT PRIMARY KEY, usage TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trees_changed (id TEXT PRIMARY KEY);
CREATE TRIGGER IF NOT EXISTS trees_insert AFTER INSERT ON sessions BEGIN
  INSERT INTO trees_changed (id) SELECT value FROM (SELECT NEW.id AS value UNION SELECT NEW.parent)
    WHERE value IS NOT NULL AND value NOT IN (SELECT id FROM trees_changed); END;
CREATE TRIGGER IF NOT EXISTS trees_update AFTER UPDATE OF id, parent, usage, broken, place ON sessions BEGIN
  INSERT INTO trees_changed (id) SELECT value FROM (SELECT OLD.id AS value UNION SELECT NEW.id
    UNION SELECT OLD.parent UNION SELECT NEW.parent)
    WHERE value IS NOT NULL AND value NOT IN (SELECT id FROM trees_changed); END;
CREATE TRIGGER IF NOT EXISTS trees_delete AFTER DELETE ON sessions BEGIN
  INSERT INTO trees_changed (id) SELECT value FROM (SELECT OLD.id AS value UNION SELECT OLD.parent)
    WHERE value IS NOT NULL AND value NOT IN (SELECT id FROM trees_changed); END;
"""
# Also beside version 7's tables: each row's record as `status --json` prints it but its usage (`record`, made
# by SQLite when the row is written: made at each read it cost a third of the command at 50,000 sessions).
# Triggers make it, whatever version of primefs writes the row; triggers of another text (RECORD_KEYS changed)
# are made again, with every record.
RECORD_KEYS = ("id", "name", "parent", "depth", "status", "stop_reason", "error", "model", "goal", "created", "updated",
               "turns", "result", "node", "approval")  # in order; node: the Ray node of its kernel (None: this machine)
RECORD = "json_object(" + ", ".join(f"'{k}', " + ("coalesce(depth, 0)" if k == "depth" else k)
                                    for k in RECORD_KEYS) + ")"
RECORDS = {
    "records_insert": f"CREATE TRIGGER records_insert AFTER INSERT ON sessions BEGIN "
                      f"UPDATE sessions SET record = {RECORD} WHERE key = NEW.key; END",
    "records_update": f"CREATE TRIGGER records_update AFTER UPDATE OF {', '.join(RECORD_KEYS)} ON sessions BEGIN "
                      f"UPDATE sessions SET record = {RECORD} WHERE key = NEW.key; END",
}
COMPACT = "usage compact"  # the state key saying usage was made compact in every row stored before
BUSY_S = 10.0


def broken_database(exc: Exception) -> bool:
    """A file that is not our database (garbage, cut, another schema): rebuilt. A lock is not damage."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return "no such" in text or "malformed" in text or "not a database" in text
    return isinstance(exc, sqlite3.DatabaseError)



class Database:
    """One SQLite connection to `.primefs/index.sqlite`, shared by a process's threads: made (or made again,
    when damaged, of another version, or a folder) on open, a cache in memory where the workspace is
    read-only; `run` and `write` rebuild a damaged file once and go on."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / ".primefs" / FILE
        self.lock = threading.RLock()  # one connection, shared by the runner's threads
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        for attempt in (0, 1):
            try:
                self.path.parent.mkdir(exist_ok=True)
                db = sqlite3.connect(self.path, timeout=BUSY_S, isolation_level=None, check_same_thread=False)
                try:
                    self._prepare(db)
                except BaseException:
                    db.close()
                    raise
                return db
            except sqlite3.DatabaseError as exc:
                if attempt or not (broken_database(exc) or self.path.is_dir()):
                    break
                self.remove_files()
            except OSError:  # a read-only workspace: a cache in memory, filled again by each command
                break
        db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._prepare(db)
        return db

    def _prepare(self, db: sqlite3.Connection) -> None:
        if db.execute("PRAGMA user_version").fetchone()[0] != VERSION:
            db.execute("PRAGMA journal_mode=WAL")
            with immediate(db):  # another process may be creating it too: one does, the other sees it
                if db.execute("PRAGMA user_version").fetchone()[0] != VERSION:
                    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT "
                                              "LIKE 'sqlite_%' AND name NOT LIKE 'events_text_%'").fetchall():
                        db.execute(f'DROP TABLE IF EXISTS "{name}"')
                    for statement in SCHEMA.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version={VERSION}")
        # Added beside version 7's tables, not as a new version (which would index every event again): older
        # primefs versions ignore it. key -> value: "watched", the runner whose change journal is trusted.
        db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT)")
        made = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE name IN ('trees', 'trees_changed', "
                               "'trees_insert', 'trees_update', 'trees_delete', 'records_insert', 'records_update')"))
        if len(made.keys() - RECORDS.keys()) != 5:  # (made once: a script costs more than the look at each open)
            db.executescript(TREES)  # (a trigger's body holds ";": not split as SCHEMA is)
        if any(made.get(name) != sql for name, sql in RECORDS.items()):
            self._make_records(db)
        if state_of(db, COMPACT) is None:  # usage stored with json.dumps's spaces: compact, as status --json prints it
            with immediate(db):
                db.execute("UPDATE sessions SET usage = json(usage) WHERE instr(usage, '\": ')")
                put_state(db, COMPACT, "1")
        db.execute("SELECT 1 FROM sessions, events, events_text, archives, state, trees, trees_changed LIMIT 0")  # damaged tables fail here
        db.execute("PRAGMA synchronous=NORMAL")

    @staticmethod
    def _make_records(db: sqlite3.Connection) -> None:
        with immediate(db):  # (another process may be at it too: one makes them, the other sees them made)
            made = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE name LIKE 'records_%'"))
            if any(made.get(name) != sql for name, sql in RECORDS.items()):
                if "record" not in {c[1] for c in db.execute("PRAGMA table_info(sessions)")}:
                    db.execute("ALTER TABLE sessions ADD COLUMN record TEXT")
                for name, sql in RECORDS.items():
                    db.execute(f"DROP TRIGGER IF EXISTS {name}")
                    db.execute(sql)
                db.execute(f"UPDATE sessions SET record = {RECORD}")

    def remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            path = f"{self.path}{suffix}"
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except IsADirectoryError:  # a folder in a cache file's place: nothing of anyone's
                shutil.rmtree(path, ignore_errors=True)

    def rebuild(self) -> None:
        """Start from an empty database (`primefs reindex`)."""
        with self.lock:
            self.db.close()
            self.remove_files()
            self.db = self._open()

    def run(self, fn, *args):
        """fn(db, *args) with the lock held; a damaged database is rebuilt once and fn run again."""
        with self.lock:
            try:
                return fn(self.db, *args)
            except sqlite3.DatabaseError as exc:
                if not broken_database(exc):
                    raise
            self.rebuild()
            return fn(self.db, *args)

    def write(self, fn, *args) -> bool:
        """A write transaction; False (nothing written) if the database stays locked by another process."""
        def tx(db, *a):
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    return False
                raise
            try:
                fn(db, *a)
                db.execute("COMMIT")
                return True
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return self.run(tx, *args)

    def get_state(self, key: str) -> str | None:
        return self.run(state_of, key)

    def set_state(self, key: str, value: str | None) -> bool:
        return self.write(put_state, key, value)

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def immediate(db: sqlite3.Connection):
    """A write transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on any exception."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def state_of(db: sqlite3.Connection, key: str) -> str | None:
    """A value of the `state` table (also inside a transaction of Database.write)."""
    row = db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def put_state(db: sqlite3.Connection, key: str, value: str | None) -> None:
    db.execute("INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
               (key, value))
