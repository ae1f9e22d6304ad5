"""Reading archived sessions (archive.py): their histories, for `primefs log` and `primefs logs`, and
their rows in the index, which is rebuilt from the zips when it lost them (deleted, `reindex`)."""
from __future__ import annotations

import io
import json
import zipfile
from contextlib import contextmanager
from pathlib import Path

from . import summary as summaries
from .errors import PrimefsError
from .eventindex import EventIndexer
from .history import events_of
from .index import Index
from .session import find_session

ARCHIVE, MANIFEST = "archive", "primefs-archive.json"


@contextmanager
def open_history(root: Path, sid: str, place: str, zips: dict | None = None):
    """A session's history.jsonl, open for reading (binary, seekable), wherever it is. `zips`: archive
    files already open (place -> ZipFile), kept open for the next call."""
    if not place:
        with open(Path(root) / "sessions" / sid / "history.jsonl", "rb") as f:
            yield f
        return
    try:
        z = (zips or {}).get(place) or zipfile.ZipFile(Path(root) / place)
        if zips is not None:
            zips[place] = z
        data = z.read(f"sessions/{sid}/history.jsonl")
        if zips is None:
            z.close()
    except (KeyError, zipfile.BadZipFile) as exc:
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
        except (OSError, KeyError, zipfile.BadZipFile) as exc:
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
    index = Index(ws.root)
    try:
        sync_archives(index)
        row = index.run(lambda db: db.execute(
            "SELECT id, place FROM sessions WHERE place != '' AND (id = ? OR (name = ? AND broken IS NULL)) "
            "ORDER BY id = ? DESC, id DESC LIMIT 1", (key, key, key)).fetchone())
    finally:
        index.close()
    if row is None:
        raise PrimefsError(f"no session with id or name {key!r} (see `primefs status`, `primefs logs`)")
    return ArchivedSession(ws.root, row[0], row[1])


def sync_archives(index: Index, events: bool = True) -> int:
    """Rows (and events) of the archives the index does not know (e.g. after it was deleted); rows of
    archives that are gone are dropped. One listing of archive/ when nothing changed. Returns sessions added."""
    folder = index.root / ARCHIVE
    present = sorted(f"{ARCHIVE}/{p.name}" for p in folder.glob("*.zip")) if folder.is_dir() else []
    known = set(index.run(lambda db: [r[0] for r in db.execute("SELECT DISTINCT place FROM sessions WHERE place != ''")]))
    gone = sorted(known - set(present))
    if gone:
        def drop(db):
            for place in gone:
                db.execute("DELETE FROM events WHERE session IN (SELECT key FROM sessions WHERE place = ?)", (place,))
                db.execute("DELETE FROM sessions WHERE place = ?", (place,))
        index.write(drop)
    added = 0
    for place in (p for p in present if p not in known):
        added += index_archive(index, place, events)
    return added


def index_archive(index: Index, place: str, events: bool = True) -> int:
    """Rows (and events) of one archive file. Returns its sessions."""
    try:
        with zipfile.ZipFile(index.root / place) as z:
            manifest = json.loads(z.read(MANIFEST))
            contents = {sid: (z.read(f"sessions/{sid}/history.jsonl"), z.read(f"sessions/{sid}/session.yaml").decode(
                "utf-8", "replace"), z.read(f"sessions/{sid}/result.md").decode("utf-8", "replace")
                if f"sessions/{sid}/result.md" in z.namelist() else None) for sid in manifest["sessions"]}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return 0  # not one of ours, or damaged: left alone
    rows = []
    for sid, (history, meta, result) in contents.items():
        if (index.sessions_dir / sid).is_dir():  # unzipped back into sessions/: the folder is what counts
            continue
        rows.append(index.row_of(summaries.of_contents(sid, history, meta), result, [None, None, None], place))
    index.write(index.store, rows, [])
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
                    try:
                        e = json.loads(f.read(h["len"]))
                    except ValueError:
                        continue
                    if isinstance(e, dict):
                        out[h["rowid"]] = {**e, "session": sid, "name": h["name"]}
        except OSError:
            continue
    for z in zips.values():
        z.close()
    return [out[h["rowid"]] for h in hits if h["rowid"] in out]
