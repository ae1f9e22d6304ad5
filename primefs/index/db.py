"""The index: `.primefs/index.sqlite`, a cache of what the session files say, for questions across
sessions (every session's status and usage, a tree, a name; events by text, model, date: eventindex.py).

Never the truth: it can be deleted at any time (`primefs reindex` rebuilds it, and any command
rebuilds what it needs), and a damaged file is replaced by a new one. Each row keeps the stat of the
files it came from (history.jsonl, session.yaml, result.md): bringing a row up to date costs three
`stat` calls when nothing changed; a changed session is read from its summary (summary.py), which
itself reads only what was appended to its history since. Rows of archived sessions (archive.py)
stay, pointing at their archive file. Several processes may use it at once (WAL; writes wait for
each other); a write that cannot get the lock in time is skipped: the answer is still right, only the
next one does the work again.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.index.database import Database, put_state, state_of
from primefs.store import fastjson, journal
from primefs.store import summary as summaries
from primefs.store.fsutil import read_regular
from primefs.store.session import Session, subtree, with_harness
from primefs.store.summary import META, stat_key

COLUMNS = ("id", *META, "turns", "events", "usage", "last", "last_ts", "broken", "result", "keys", "place")
LIGHT = ("id", "parent", "status", "goal", "broken", "place")  # what the runner's start needs
JSON_COLUMNS = ("usage", "last", "marks")
WATCHED = "watched"  # the state key naming the runner whose journal is trusted (runner_token)
HARNESS = "harness"  # the state key holding the sessions with a harness/ folder, kept by that journal
ARCHIVING = "archiving"  # .primefs/archiving/<root>/<id>: a folder on its way into a zip (archive.py)


CYCLE = "its parent is itself or its own descendant: a cycle of parents (session.yaml edited by hand?)"


def read_result(folder: Path) -> str | None:
    try:
        return read_regular(folder / "result.md")
    except OSError:
        return None


def session_ids(sessions_dir: Path) -> list[str]:
    """Folder names under sessions/ that may be sessions (a folder without session.yaml is skipped later)."""
    try:
        with os.scandir(sessions_dir) as it:
            return sorted(e.name for e in it if not e.name.startswith(".") and e.is_dir())
    except FileNotFoundError:
        return []


def moving(root: Path) -> set[str]:
    """Ids of the session folders on their way into an archive (.primefs/archiving/<root>/<id>)."""
    out: set[str] = set()
    try:
        with os.scandir(Path(root) / ".primefs" / ARCHIVING) as stages:
            for stage in stages:
                if stage.is_dir() and not stage.name.startswith("."):  # .done-<root>: already in its zip
                    out.update(session_ids(Path(stage.path)))
    except (FileNotFoundError, NotADirectoryError):
        pass
    return out


def row_of(s: dict, result: str | None, keys: list, place: str = "") -> dict:
    meta = s["meta"]
    last = s["last"] or {}
    return {"id": s["id"], **{k: meta.get(k) for k in META}, "turns": s["turns"], "events": s["events"],
            "usage": summaries.usage(s), "last": s["last"], "last_ts": last.get("ts"), "broken": s["broken"],
            "result": result, "keys": json.dumps(keys), "place": place, "marks": None}


def usage_of(text: str):
    """A row's usage as stored; one stored before cached tokens were counted has them, 0."""
    usage = fastjson.loads(text)
    if isinstance(usage, dict) and summaries.CACHE_FIELDS[0] not in usage:
        for k in summaries.CACHE_FIELDS:
            usage.setdefault(k, 0)
    return usage


class Entry:
    """A session as the index has it: `id`, `meta` (the session.yaml fields status shows), `row`
    (turns, result, usage, last event)."""

    __slots__ = ("id", "_meta", "row")

    def __init__(self, row: dict):
        self.id, self.row, self._meta = row["id"], row, None

    @property
    def meta(self) -> dict:  # made when asked: `status` holds 50,000 entries and reads few of them whole
        if self._meta is None:
            self._meta = {"id": self.id, **{k: self.row.get(k) for k in META}}  # a light row: only some of them
        return self._meta


class Index(Database):
    """The rows of the sessions (from their files), and the questions asked of them."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.sessions_dir = self.root / "sessions"

    # -- sessions -------------------------------------------------------------------------------------
    def trusted(self) -> bool:
        """Whether the change journal (store/journal.py) holds every change since the rows were last complete:
        the runner that made them complete (runner/journalwatch.py) still runs and watches. Then bringing every
        row up to date is looking at the journal's sessions only; otherwise at every session."""
        from primefs.store.control import runner_token
        from primefs.store.workspace import Workspace

        token = runner_token(Workspace(self.root))
        return token is not None and token == self.get_state(WATCHED)

    def sync(self, ids: list[str] | None = None, *, meta_only: bool = False, light: bool = False,
             columns: tuple | None = None, raw: bool = False) -> dict[str, dict] | list[tuple]:
        """Bring the rows of these session folders (default: every folder under sessions/) up to date
        with their files; rows of folders that are gone are dropped. Returns id -> row of the folders
        looked at (those without a session.yaml left out). `meta_only`: only what session.yaml says
        must be current (parent, goal, status: the runner's start), one stat per session; rows with
        only those fields and `marks`. `light`: all brought up to date, rows of unchanged sessions light;
        `columns`: rows of unchanged sessions with these columns only (rows()); `raw` (every folder only): every
        row as stored once up to date, a tuple of these columns (rows()).
        Every folder: through the change journal when it is trusted (only changed sessions looked at)."""
        if ids is None and self._journal():
            return self.rows(None, light=meta_only or light, columns=columns, archived=False, raw=raw)
        if ids is not None or meta_only:  # (meta_only reads no history: it must leave the journal as it is)
            return self._sync(ids, meta_only=meta_only, light=light, columns=columns)
        taken = journal.take(self.root)  # taken before the look at every session, which covers it
        out = self._sync(None, light=light, columns=("id",) if raw else columns)  # (read whole below)
        journal.done(self.root, taken)
        if not raw:
            return out
        return [row for row in self.rows(None, columns=columns, archived=False, raw=True)
                if row[0] in out]  # (not those on their way into an archive)

    def _journal(self) -> bool:
        """If the journal is trusted: the rows of its sessions brought up to date (True); else nothing (False:
        the journal is left for a look at every session to take)."""
        if not self.trusted():
            return False
        taken = journal.take(self.root)
        self._changed(taken)
        if taken or self._held_harness() is None:  # (nothing to write, most of the time: no transaction)
            if not self.write(self._keep_harness, taken):
                return True  # the database stays locked: the next reader takes them again
        journal.done(self.root, taken)
        return True

    def _keep_harness(self, db, ids: list[str]) -> None:
        """The sessions with a harness/ folder (HARNESS), up to date with these journaled ones; under a runner
        it was not made for, looked for in every session once (in the transaction: no one else's update lost)."""
        token = state_of(db, WATCHED)
        held = json.loads(state_of(db, HARNESS) or "{}")
        if held.get("token") != token:
            have = set(with_harness(self.sessions_dir))
        elif not ids:
            return
        else:
            have = (set(held["ids"]) - set(ids)) | set(with_harness(self.sessions_dir, ids))
        put_state(db, HARNESS, json.dumps({"token": token, "ids": sorted(have)}))

    def untrust(self) -> bool:
        """The journal is not to be trusted (a runner's look at every session begins, or events were lost): so
        neither is the harness set it kept, which is made again when it is trusted again."""
        def clear(db) -> None:
            for key in (WATCHED, HARNESS):
                put_state(db, key, None)

        return self.write(clear)

    def harness_sessions(self) -> list[str] | None:
        """Ids of the sessions with a harness/ folder, as the trusted journal keeps them; None when it is not
        trusted (or has not been read since it was): look at every session then."""
        return self._held_harness() if self.trusted() else None

    def _held_harness(self) -> list[str] | None:
        """The harness set, if it was made under the runner whose journal is trusted now."""
        held = json.loads(self.get_state(HARNESS) or "{}")
        return held["ids"] if held.get("token") == self.get_state(WATCHED) else None

    def _changed(self, ids: list[str]) -> None:
        """The rows of these (journaled) sessions brought up to date; those whose session.yaml is gone dropped
        (as a look at every folder drops them)."""
        if not ids:
            return
        out = self._sync(ids)
        lost = [sid for sid in ids if sid not in out and not os.path.isfile(f"{self.sessions_dir}/{sid}/session.yaml")]
        if lost:
            staged = moving(self.root)  # on its way into an archive: still a session (archive.py step 5)
            here = self.rows([sid for sid in lost if sid not in staged], light=True)
            gone = [sid for sid, row in here.items() if row["place"] == ""]
            if gone:
                self.write(self.store, [], gone)

    def _sync(self, ids: list[str] | None, *, meta_only: bool = False, light: bool = False,
              columns: tuple | None = None) -> dict[str, dict]:
        present = session_ids(self.sessions_dir) if ids is None else ids
        query = "SELECT id, keys, place FROM sessions"
        args: tuple = ()
        if ids is not None:
            query, args = query + " WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)
        known = self.run(lambda db: {r[0]: (r[1], r[2]) for r in db.execute(query, args)})
        changed, out = [], {}
        for sid in present:
            row = known.get(sid)
            base = f"{self.sessions_dir}/{sid}/"  # plain strings: pathlib costs more than the stat here
            if row is not None and row[1] != "":
                if ids is not None and not os.path.isdir(base):  # archived: its files do not change
                    out[sid] = None
                    continue
                row = None  # back in sessions/ (unzipped): the folder is what counts
            if meta_only:
                keys = [None, stat_key(base + "session.yaml"), None]
                current = row is not None and keys[1] is not None and json.loads(row[0])[1] == keys[1]
            else:
                keys = [stat_key(base + "history.jsonl"), stat_key(base + "session.yaml"), stat_key(base + "result.md")]
                current = row is not None and row[0] == json.dumps(keys)
            if keys[1] is None:  # not (yet) a session: session.yaml is written last
                continue
            if current:
                out[sid] = None  # filled below from the database
                continue
            keys[2] = stat_key(base + "result.md")
            folder = self.sessions_dir / sid
            s = summaries.fresh(folder)
            keys = [s["history"], s["meta_key"], keys[2]]  # what the summary counted, exactly
            out[sid] = row_of(s, read_result(folder), keys)
            changed.append(out[sid])
        gone = [] if ids is not None else [sid for sid, (_, place) in known.items() if place == "" and sid not in out]
        if gone:  # a folder being archived is still a session: its row waits for its zip (archive.py step 5)
            staged = moving(self.root)
            gone = [sid for sid in gone if sid not in staged]
        if changed or gone:
            self.write(self.store, changed, gone)
            self._mark_cycles(changed, out)
        missing = [sid for sid, row in out.items() if row is None]
        if missing:
            stored = self.rows(None if ids is None else missing, light=meta_only or light, columns=columns)
            out.update((sid, stored[sid]) for sid in missing if sid in stored)
        return out

    def _mark_cycles(self, changed: list[dict], out: dict) -> None:
        """Sessions in a cycle of parents are broken (shown with CYCLE, never run): a tree must end at a
        root, or a result would go round it for ever. Only a row with a parent can be in one, and only a
        marked one can heal, so only those are walked up (a few rows each, not the whole table)."""
        def look(db) -> list[tuple]:
            def stored(sid):  # (parent, broken) of a session in sessions/, or None
                return db.execute("SELECT parent, broken FROM sessions WHERE id = ? AND place = ''", (sid,)).fetchone()

            suspects = {r["id"] for r in changed if r.get("parent")}
            suspects.update(sid for (sid,) in db.execute("SELECT id FROM sessions WHERE broken = ?", (CYCLE,)))
            flips = []
            for sid in suspects:
                row = stored(sid)
                if row is None or row[1] not in (None, CYCLE):  # a broken session.yaml: its parent is unknown
                    continue
                seen, up = {sid}, row[0]
                while up is not None and up not in seen:
                    seen.add(up)
                    above = stored(up)
                    up = above[0] if above is not None and above[1] in (None, CYCLE) else None
                now = CYCLE if up == sid else None  # back at itself (not merely into a cycle above it)
                if now != row[1]:
                    flips.append((now, sid))
            return flips

        flips = self.run(look)
        if flips:
            self.write(lambda db: db.executemany("UPDATE sessions SET broken = ? WHERE id = ?", flips))
            for broken, sid in flips:
                if out.get(sid) is not None:
                    out[sid]["broken"] = broken

    @staticmethod
    def store(db, rows: list[dict], gone: list[str]) -> None:
        for sid in gone:
            key = db.execute("SELECT key FROM sessions WHERE id = ?", (sid,)).fetchone()
            if key:
                db.execute("DELETE FROM events WHERE session = ?", key)
                db.execute("DELETE FROM sessions WHERE key = ?", key)
        names = ", ".join(COLUMNS)
        updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c != "id")
        db.executemany(f"INSERT INTO sessions ({names}) VALUES ({', '.join('?' * len(COLUMNS))}) "
                       f"ON CONFLICT(id) DO UPDATE SET {updates}",
                       [tuple(fastjson.dumps(r[c]) if c == "usage" else json.dumps(r[c]) if c == "last" else r[c]
                              for c in COLUMNS) for r in rows])  # usage compact: status --json prints it as stored

    def rows(self, ids: list[str] | None = None, light: bool = False, columns: tuple | None = None,
             archived: bool = True, raw: bool = False) -> dict[str, dict] | list[tuple]:
        """Rows as stored (no files looked at): these ids, or all (`archived` False: those in sessions/). `light`:
        only LIGHT and marks; `columns`: only these (JSON ones parsed: a row's `last` or `marks` costs as much to
        read as its usage). `raw`: a list of tuples of `columns` as stored (`id` first; nothing parsed: a dict
        per row costs a fifth of `status --json` at 50,000 sessions)."""
        columns = columns or (*(LIGHT if light else COLUMNS), "marks")
        sql = f"SELECT {', '.join(columns)} FROM sessions" + ("" if archived else " WHERE place = ''")
        args: tuple = ()
        if ids is not None:
            sql, args = sql + (" WHERE " if archived else " AND ") + "id IN (SELECT value FROM json_each(?))", \
                (json.dumps(ids),)
        stored = self.run(lambda db: db.execute(sql, args).fetchall())
        if raw:
            return stored
        out = {}
        parsed = [k for k in JSON_COLUMNS if k in columns]  # (`status` asks 50,000 light rows: no per-row search)
        for r in stored:
            row = dict(zip(columns, r))
            for k in parsed:
                if row[k] is not None:
                    row[k] = usage_of(row[k]) if k == "usage" else fastjson.loads(row[k])
            out[row["id"]] = row
        return out

    def data_version(self) -> int:
        """Changes whenever another connection commits (SQLite's `PRAGMA data_version`)."""
        return self.run(lambda db: db.execute("PRAGMA data_version").fetchone()[0])

    def kept_trees(self) -> dict[str, str]:
        """The tree sums kept (database.TREES): id -> usage as JSON text, "" for a session changed since."""
        def read(db) -> dict[str, str]:
            kept = dict(db.execute("SELECT id, usage FROM trees").fetchall())
            kept.update((sid, "") for (sid,) in db.execute("SELECT id FROM trees_changed"))
            return kept

        return self.run(read)

    def keep_trees(self, texts: dict[str, str], dropped: set[str], version: int) -> None:
        """Keep these tree sums (id -> usage as JSON text; database.TREES) and drop those of `dropped` (no longer
        with children), all made from rows read at `version` (data_version() before they were read), with every
        session changed since the last sums were kept: unless another process wrote since, as then some may be
        stale."""
        def put(db) -> None:
            if db.execute("PRAGMA data_version").fetchone()[0] == version:
                db.execute("DELETE FROM trees WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(sorted(dropped)),))
                db.executemany("INSERT OR REPLACE INTO trees (id, usage) VALUES (?, ?)", texts.items())
                db.execute("DELETE FROM trees_changed")

        self.write(put)

    def set_marks(self, marks: dict[str, list]) -> None:
        """Remember when sessions were seen settled (alive.py): the next start need not list their mail."""
        if marks:
            self.write(lambda db: db.executemany("UPDATE sessions SET marks = ? WHERE id = ?",
                                                 [(json.dumps(m), sid) for sid, m in marks.items()]))

    def sync_new(self) -> None:
        """Rows of folders the index does not know, and of broken session.yaml files (mended?): one listing."""
        if self._journal():
            return
        present = session_ids(self.sessions_dir)
        known = dict(self.run(lambda db: db.execute("SELECT id, broken IS NOT NULL FROM sessions").fetchall()))
        todo = [sid for sid in present if known.get(sid, True)]
        if todo:
            self.sync(todo)

    def refresh(self) -> None:
        """Rows of new folders and of sessions whose session.yaml changed (a name or parent edited by hand,
        a broken file mended) brought up to date: one stat per session (0.05 s at 10,000 sessions), or the
        journal's sessions when it is trusted."""
        if self._journal():
            return
        present = session_ids(self.sessions_dir)
        known = dict(self.run(lambda db: db.execute(  # session.yaml's stat as stored, in json.dumps's spelling
            "SELECT id, json_extract(keys, '$[1]') FROM sessions WHERE place = ''").fetchall()))
        changed = []
        for sid in present:
            key = stat_key(f"{self.sessions_dir}/{sid}/session.yaml")
            if key is not None and known.get(sid) != f"[{key[0]},{key[1]},{key[2]}]":
                changed.append(sid)
        if changed:
            self.sync(changed)

    def find(self, name: str, archived: bool = False) -> str | None:
        """The newest readable session with this name in sessions/ (or also archived ones). A hit is checked
        against its session.yaml (renamed by hand since: asked again); a miss asked again after refresh()."""
        self.sync_new()
        where = "" if archived else " AND place = ''"

        def ask():
            return self.run(lambda db: db.execute(f"SELECT id, keys, place FROM sessions WHERE name = ? AND broken "
                                                  f"IS NULL{where} ORDER BY id DESC LIMIT 1", (name,)).fetchone())
        for _ in range(3):
            row = ask()
            if row is None:
                break
            sid, keys, place = row
            key = None if place else stat_key(f"{self.sessions_dir}/{sid}/session.yaml")
            if place or json.loads(keys)[1] == key:
                return sid  # as its file says (an archived one no longer changes)
            gone = key is None and sid not in moving(self.root)  # else edited since it was read: brought up to date
            self.write(self.store, [], [sid]) if gone else self.sync([sid])
        self.refresh()
        row = ask()
        return row[0] if row else None

    def names(self) -> dict[str, str]:
        """id -> name of every readable session (new folders and changed session.yaml files looked at first)."""
        self.refresh()
        return dict(self.run(lambda db: db.execute("SELECT id, name FROM sessions WHERE broken IS NULL").fetchall()))

    def subtree(self, sid: str) -> list[str]:
        """`sid` and its descendants as the index knows them, in store/session.subtree's order (refresh()
        first if it must be now). The index gives the children a generation at a time; the walk is that one."""
        children: dict[str, list[str]] = {}
        seen, frontier = {sid}, [sid]
        while frontier:
            rows = self.run(lambda db: db.execute(
                "SELECT id, parent FROM sessions WHERE parent IN (SELECT value FROM json_each(?)) AND broken IS NULL",
                (json.dumps(frontier),)).fetchall())
            frontier = [k for k, _ in rows if k not in seen]  # a hand-made cycle is cut
            seen.update(frontier)
            for kid, parent in rows:
                children.setdefault(parent, []).append(kid)
        return subtree(children, sid)

    def tree(self, sid: str) -> dict[str, dict]:
        """Current rows of `sid` and all its descendants: new folders, mended session.yaml files and the
        tree's own files looked at (not the session.yaml of every session: `usage` stays fast)."""
        self.sync_new()
        return self.sync(self.subtree(sid))



def descendants(ws, sid: str) -> list[str]:
    """From the index (new session folders looked at first): no session.yaml of the workspace parsed."""
    with Index(ws.root) as index:
        index.refresh()  # a parent edited by hand, a broken session.yaml mended: what the files say
        return [d for d in index.subtree(sid)[1:] if (ws.sessions / d).is_dir()]


def session_names(sessions_dir: Path) -> dict[str, str]:
    """id -> name of every readable session (a broken session.yaml is left out, not fatal), from the index."""
    with Index(Path(sessions_dir).parent) as index:
        return index.names()


def find_session(sessions_dir: Path, key: str) -> Session:
    """By id, else by name (the newest session of that name), through the index."""
    if key and "/" not in key and ".." not in key and (sessions_dir / key / "session.yaml").is_file():
        return Session(sessions_dir / key)
    with Index(Path(sessions_dir).parent) as index:
        sid = index.find(key)
    if sid is None or not (sessions_dir / sid / "session.yaml").is_file():
        raise PrimefsError(f"no session with id or name {key!r} (see `primefs status`)")
    return Session(sessions_dir / sid)
