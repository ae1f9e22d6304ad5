"""The change journal: `.primefs/changed/<id>`, an empty file per session whose files changed since the
index last looked at it, so that commands bring only those rows up to date instead of looking at every
session (index/db.py, "Index.catch_up").

Every primefs writer of a session's files (history, session.yaml, result.md, a new session) marks the
session after writing; while a runner runs, its watch of every session folder marks what a person
changes by hand (runner/journalwatch.py). A reader takes a marker before it reads the session's files
(renamed to `.<id>`, removed once the row is stored), so no change is lost between the two: a write after
the rename makes a new marker; a reader killed before storing leaves its `.<id>` for the next one.

The journal is complete only while a runner watches: without one, a hand edit leaves no marker, and
commands look at every session as before (the index remembers which runner's watch it trusts).
"""
from __future__ import annotations

import os
from pathlib import Path

FOLDER = "changed"


def folder(root) -> str:
    return f"{root}/.primefs/{FOLDER}"


def marker_of(session_dir: Path) -> str | None:
    """The marker path of a session folder in a workspace's sessions/ (None elsewhere: an archive's stage,
    an eval's copy)."""
    session_dir = Path(session_dir)
    if session_dir.parent.name != "sessions":
        return None
    return f"{folder(session_dir.parent.parent)}/{session_dir.name}"


def mark(marker: str | None) -> None:
    """Note a change (after writing it). One system call when the marker is there already."""
    if marker is None:
        return
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    except FileExistsError:
        pass
    except FileNotFoundError:  # the first mark of a workspace (or .primefs/ removed): make the folder
        try:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))
        except OSError:
            pass  # a read-only workspace: nothing to journal, and no runner trusts it
    except OSError:
        pass


def mark_session(session_dir: Path) -> None:
    mark(marker_of(session_dir))


def take(root) -> list[str]:
    """The ids marked since the last take (and those a reader took but did not finish): each marker renamed
    to `.<id>` before the caller reads that session's files. `done(ids)` when their rows are stored."""
    base = folder(root)
    ids = set()
    try:
        with os.scandir(base) as it:
            names = [e.name for e in it]
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        if name.startswith("."):
            ids.add(name[1:])
            continue
        try:
            os.replace(f"{base}/{name}", f"{base}/.{name}")  # over a taken one left by a killed reader
        except OSError:
            continue  # another reader took it: it reads the session itself
        ids.add(name)
    return sorted(i for i in ids if i)


def done(root, ids) -> None:
    base = folder(root)
    for sid in ids:
        try:
            os.unlink(f"{base}/.{sid}")
        except OSError:
            pass
