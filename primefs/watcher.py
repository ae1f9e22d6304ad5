"""The runner's file watch: watchdog events on goals/, harness/ and sessions/ become hints (a path to
look at now). Events are hints only: the runner also lists everything every few seconds."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable


def watch(ws, on_path: Callable[[Path], None]):
    """Start an observer calling `on_path(path)` for every change; returns it (call .stop())."""
    from watchdog.events import (DirCreatedEvent, DirDeletedEvent, DirMovedEvent, FileClosedEvent,
                                 FileCreatedEvent, FileDeletedEvent, FileMovedEvent, FileSystemEventHandler)
    from watchdog.observers import Observer

    # watchdog warns when a new folder's watch is added twice (harmless: events are hints)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"watchdog\..*")

    class Hint(FileSystemEventHandler):
        def on_any_event(self, event):
            on_path(Path(os.fsdecode(getattr(event, "dest_path", "") or event.src_path)))

    # Files appearing, renamed, closed after writing or removed: not opens, reads or appends (the
    # runner reads and appends all the time; those events would cost more than the work itself).
    changes = [FileCreatedEvent, FileMovedEvent, FileClosedEvent, FileDeletedEvent, DirCreatedEvent,
               DirMovedEvent, DirDeletedEvent]
    observer = Observer()
    observer.schedule(Hint(), str(ws.goals), recursive=False, event_filter=changes)
    observer.schedule(Hint(), str(ws.harness), recursive=True, event_filter=changes)
    observer.schedule(Hint(), str(ws.sessions), recursive=True, event_filter=changes)
    requests = ws.state / "requests"  # `primefs exec` / `primefs kernel` (liverequests.py)
    requests.mkdir(parents=True, exist_ok=True)
    observer.schedule(Hint(), str(requests), recursive=False, event_filter=changes)
    observer.daemon = True
    observer.start()
    return observer
