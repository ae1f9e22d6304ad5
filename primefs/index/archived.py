"""Reading archived sessions (archive.py): their histories, for `primefs log` and `primefs logs`, and
their rows in the index, which is rebuilt from the zips when it lost them (deleted, `reindex`)."""
from __future__ import annotations

import io
import json
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.index.archive import ARCHIVE, MANIFEST
from primefs.index.db import Index, find_session, row_of
from primefs.index.events import EventIndexer
from primefs.store import summary as summaries
from primefs.store.fsutil import open_regular
from primefs.store.history import events_of, parse_event
from primefs.store.summary import stat_key

# What reading a damaged archive raises: not a zip, cut short, bad deflate data, marked encrypted, another
# compression method, a member missing, a manifest that is not ours. Such an archive is skipped, never fatal.
ZIP_PROBLEMS = (OSError, EOFError, KeyError, ValueError, TypeError, RecursionError, RuntimeError, NotImplementedError,
                zipfile.BadZipFile, zlib.error)


@contextmanager
def open_history(root: Path, sid: str, place: str, zips: dict | None = None):
    """A session's history.jsonl, open for reading (binary, seekable), wherever it is. `zips`: archive
    files already open (place -> ZipFile), kept open for the next call."""
    if not place:
        with open_regular(Path(root) / "sessions" / sid / "history.jsonl") as f:
            yield f
        return
    try:
        z = (zips or {}).get(place) or zipfile.ZipFile(Path(root) / place)
        if zips is not None:
            zips[place] = z
        data = z.read(f"sessions/{sid}/history.jsonl")
        if zips is None:
            z.close()
    except ZIP_PROBLEMS as exc:  # damaged: bad data, encrypted, another method, not a zip
        raise OSError(f"{place}: {exc}") from None
    yield io.BytesIO(data)


class ArchivedSession:
    """What `primefs log` needs of a session that is in an archive: id, name, status, events."""

    def __init__(self, root: Path, sid: str, place: str):
        self.id, self.place, self.dir = sid, place, None
        try:
            with zipfile.ZipFile(Path(root) / place) as z:
                self._history = z.read(f"sessions/{sid}/history.jsonl")
                meta = z.read(f"sessions/{sid}/session.yaml").decode("utf-8", "replace")
                names = set(z.namelist())
                self._result = (z.read(f"sessions/{sid}/result.md").decode("utf-8", "replace")
                                if f"sessions/{sid}/result.md" in names else None)
        except ZIP_PROBLEMS as exc:
            raise PrimefsError(f"session {sid} is archived in {place}, which cannot be read: {exc}") from None
        s = summaries.of_contents(sid, self._history, meta)
        self.meta, self.problem = {"id": sid, **s["meta"]}, s["broken"]

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.id

    @property
    def status(self) -> str:
        return f"{self.meta.get('status')} (archived in {self.place})"

    def events(self, type: str | None = None) -> list[dict]:
        path = io.BytesIO(self._history)
        return [e for e in events_of(path) if type is None or e.get("type") == type]

    def read_result(self) -> str | None:
        return self._result


def find_readable(ws, key: str):
    """A session to read: in sessions/ (find_session), else an archived one, by id or name."""
    try:
        return find_session(ws.sessions, key)
    except PrimefsError:
        pass
    with Index(ws.root) as index:
        sync_archives(index)
        row = index.run(lambda db: db.execute(
            "SELECT id, place FROM sessions WHERE place != '' AND (id = ? OR (name = ? AND broken IS NULL)) "
            "ORDER BY id = ? DESC, id DESC LIMIT 1", (key, key, key)).fetchone())
    if row is None:
        raise PrimefsError(f"no session with id or name {key!r} (see `primefs status`, `primefs logs`)")
    return ArchivedSession(ws.root, row[0], row[1])


def sync_archives(index: Index, events: bool = True) -> int:
    """Rows (and events) of archived sessions the index lacks: archives it does not know (e.g. after it
    was deleted), or whose manifest names sessions without their row (dropped while the tree was moving,
    or a step-5 write locked out: archive.py); rows of archives that are gone are dropped. One listing of
    archive/, a stat per archive and one query when nothing changed. Returns sessions added."""
    folder = index.root / ARCHIVE
    present = {f"{ARCHIVE}/{p.name}": stat_key(p) for p in sorted(folder.glob("*.zip"))} if folder.is_dir() else {}

    def read(db):
        have: dict[str, set] = {}
        for sid, place in db.execute("SELECT id, place FROM sessions WHERE place != ''"):
            have.setdefault(place, set()).add(sid)
        known = {place: (json.loads(stat), json.loads(sids))
                 for place, stat, sids in db.execute("SELECT place, stat, sessions FROM archives")}
        return have, known

    have, known = index.run(read)
    gone = sorted((set(have) | set(known)) - set(present))
    if gone:
        def drop(db):
            for place in gone:
                db.execute("DELETE FROM events WHERE session IN (SELECT key FROM sessions WHERE place = ?)", (place,))
                db.execute("DELETE FROM sessions WHERE place = ?", (place,))
                db.execute("DELETE FROM archives WHERE place = ?", (place,))
        index.write(drop)
    added = 0
    for place, stat in present.items():
        if place not in known or known[place][0] != stat:  # new, or another file: its manifest read
            added += index_archive(index, place, events)
            continue
        missing = [sid for sid in known[place][1] if sid not in have.get(place, ())
                   and not (index.sessions_dir / sid).is_dir()]  # a folder unzipped back into sessions/ counts
        if missing:
            added += index_archive(index, place, events, only=missing)
    return added


def index_archive(index: Index, place: str, events: bool = True, only: list[str] | None = None) -> int:
    """Rows (and events) of one archive file (`only`: of these of its sessions); the file and the
    sessions its manifest names are remembered. Returns the sessions stored."""
    stat = stat_key(index.root / place)  # before reading: a file replaced meanwhile is read again next time
    try:
        with zipfile.ZipFile(index.root / place) as z:
            manifest = json.loads(z.read(MANIFEST))
            if not isinstance(manifest, dict) or not isinstance(manifest.get("sessions"), list) or not all(isinstance(x, str) for x in manifest["sessions"]):
                return 0
            names = set(z.namelist())
            contents = {sid: (z.read(f"sessions/{sid}/history.jsonl"), z.read(f"sessions/{sid}/session.yaml").decode(
                "utf-8", "replace"), z.read(f"sessions/{sid}/result.md").decode("utf-8", "replace")
                if f"sessions/{sid}/result.md" in names else None)
                for sid in manifest["sessions"] if only is None or sid in only}
    except ZIP_PROBLEMS:
        return 0  # not one of ours, or damaged: left alone
    rows = []
    for sid, (history, meta, result) in contents.items():
        if (index.sessions_dir / sid).is_dir():  # unzipped back into sessions/: the folder is what counts
            continue
        rows.append(row_of(summaries.of_contents(sid, history, meta), result, [None, None, None], place))

    def store(db):
        index.store(db, rows, [])
        db.execute("INSERT OR REPLACE INTO archives (place, stat, sessions) VALUES (?, ?, ?)",
                   (place, json.dumps(stat), json.dumps(list(manifest["sessions"]))))

    index.write(store)
    if events:
        stored = {r[0]: r[1:] for r in index.run(lambda db: db.execute(
            "SELECT id, key, indexed, indexed_check FROM sessions WHERE place = ?", (place,)).fetchall())}
        indexer = EventIndexer(index)
        for row in rows:
            if row["id"] not in stored:  # the write above was locked out: next time
                continue
            key, indexed, check = stored[row["id"]]
            history = contents[row["id"]][0]  # as far as its row says (another process may be doing the same)
            indexer.session(key, row["model"], io.BytesIO(history), len(history), indexed, check)
        indexer.flush()
    return len(rows)


def read_events(root: Path, hits: list[dict]) -> list[dict]:
    """The events of index hits ({session, place, pos, len}), read from their histories (or archives),
    each history opened once. A line that is no longer what the index says is left out."""
    by_session: dict[tuple, list[dict]] = {}
    for h in hits:
        by_session.setdefault((h["session"], h["place"]), []).append(h)
    out: dict[int, dict] = {}
    zips: dict[str, zipfile.ZipFile] = {}
    for (sid, place), group in by_session.items():
        try:
            with open_history(root, sid, place, zips) as f:
                for h in group:
                    f.seek(h["pos"])
                    e = parse_event(f.read(h["len"]))
                    if e is not None:
                        out[h["rowid"]] = {**e, "session": sid, "session_name": h["name"]}  # an event's own `name` stays
        except OSError:
            continue
    for z in zips.values():
        z.close()
    return [out[h["rowid"]] for h in hits if h["rowid"] in out]
