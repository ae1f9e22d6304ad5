"""The runner's file watch: watchdog events on goals/ and harness/, and inotify events on sessions/ and
the folders of awake sessions (alive.py), become hints (a path to look at now). Events are hints only:
the runner also looks at everything that is alive every few seconds."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable

from primefs.runner.journalwatch import JournalWatch
from primefs.store.control import REFINE_FILE, STOP_FILE, requests_dir

# What in an awake session's folder can bring it work: not its history or summary, written at every event
LOOKED_AT = ("mail", STOP_FILE, REFINE_FILE, "heartbeats", "session.yaml")


def meaning(ws, path: Path) -> tuple[str, str | None]:
    """What a changed path means to the runner: (kind, session id or None). Kinds: "request" (a file
    of the runtime folder's requests/), "goal" (goals/*.md), "goals" (another file there), "harness" (the harness,
    or a session's own: its id), "session" (what can bring a session work: its id), "sessions"
    (sessions/ itself: events were lost), "" (nothing to do)."""
    if path.parent == requests_dir(ws):
        return "request", None
    try:
        rel = path.relative_to(ws.root).parts
    except ValueError:
        return "", None
    if rel[:1] == ("goals",):
        return ("goal" if path.suffix == ".md" and not path.name.startswith(".") else "goals"), None
    if rel[:1] == ("harness",):
        return "harness", None
    if len(rel) > 2 and rel[0] == "sessions" and rel[2] == "harness":
        return "harness", rel[1]
    if len(rel) >= 2 and rel[0] == "sessions" and (len(rel) == 2 or rel[2] in LOOKED_AT):
        return "session", rel[1]
    if rel == ("sessions",):
        return "sessions", None
    return "", None


class Watch:
    def __init__(self, observer, alive, journal):
        self.observer, self.alive, self.journal = observer, alive, journal

    def stop(self) -> None:
        self.observer.stop()
        self.alive.stop_watch()
        self.journal.stop()


def watch(ws, alive, on_path: Callable[..., None], log: Callable[[str], None]) -> Watch:
    """Start watching, calling `on_path(path, whole)` for every change (`whole`: the file was renamed into
    place or closed after writing; sessions' events say nothing of it); returns the watch (call .stop())."""
    from watchdog.events import (
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileMovedEvent,
        FileSystemEventHandler,
    )
    from watchdog.observers import Observer

    # watchdog warns when a new folder's watch is added twice (harmless: events are hints)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"watchdog\..*")

    class Hint(FileSystemEventHandler):
        def on_any_event(self, event):  # renamed into place or closed after writing: the file is whole
            on_path(Path(os.fsdecode(getattr(event, "dest_path", "") or event.src_path)),
                    isinstance(event, (FileMovedEvent, FileClosedEvent)))

    # Files appearing, renamed, closed after writing or removed: not opens, reads or appends (the
    # runner reads and appends all the time; those events would cost more than the work itself).
    changes = [FileCreatedEvent, FileMovedEvent, FileClosedEvent, FileDeletedEvent, DirCreatedEvent,
               DirMovedEvent, DirDeletedEvent]
    observer = Observer()
    observer.schedule(Hint(), str(ws.goals), recursive=False, event_filter=changes)
    observer.schedule(Hint(), str(ws.harness), recursive=True, event_filter=changes)
    requests = requests_dir(ws)  # `primefs exec`, `kernel`, `archive`
    requests.mkdir(parents=True, exist_ok=True)
    observer.schedule(Hint(), str(requests), recursive=False, event_filter=changes)
    observer.daemon = True
    observer.start()
    alive.start_watch(on_path)  # not watchdog on sessions/: its recursive watch grows with every session
    journal = JournalWatch(ws, log)  # every session folder, for the index's change journal
    journal.start()
    return Watch(observer, alive, journal)
