"""Events of every session, archived ones too, from the index: `primefs logs` and `history.search(...,
scope=...)` in a kernel ask the same question here."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.index.archived import read_events
from primefs.index.db import Index
from primefs.index.events import search, sync_events


def find_events(root: Path, index: Index, limit: int | None, *, counts: bool = False, label: str = "--query",
                **filters) -> tuple[list[dict], dict]:
    """The newest `limit` events matching `filters` (index/events.FILTERS; `sessions`: ids, or None for all),
    oldest first, each with `session` and `session_name`; and the counts (`search`). The histories looked
    at are indexed first (the archives: `sync_archives`, by the caller, before it names sessions). A
    full-text `text` the FTS5 syntax refuses is a PrimefsError naming `label`."""
    wanted = filters.get("sessions")
    sync_events(index, [s for s in wanted if (Path(root) / "sessions" / s).is_dir()] if wanted is not None else None)
    text = filters.get("text")
    if text:
        try:
            index.run(lambda db: db.execute("SELECT rowid FROM events_text WHERE events_text MATCH ? LIMIT 1",
                                            (text,)).fetchall())
        except sqlite3.OperationalError as exc:
            raise PrimefsError(f"{label} {text!r}: {exc} (use words, \"a phrase\", prefix*, a OR b)") from None
    hits, found = search(index, limit, counts=counts, **filters)
    return ([] if counts else read_events(Path(root), hits)), found
