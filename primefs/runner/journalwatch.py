"""The runner's watch of every session folder for the change journal (store/journal.py).

primefs's own writers mark what they change; this watch marks what nobody of ours wrote: a person's edit
of a session.yaml, history.jsonl or result.md, a session folder put in sessions/ or taken away. Once it
watches, the index is brought up to date with every session once (in a background thread), and then
trusts the journal for as long as this runner runs (index/db.py, "trusted"): commands look at the
sessions the journal names, not at every session. A watch that cannot be had (over the kernel's limit of
watches, no inotify) or lost events (its queue overflowed) leave the journal untrusted, so commands look
at every session again; an overflow is followed by another complete look.

One inotify watch per session folder: ~1 KiB of kernel memory each; the events of files renamed or
closed after writing, never of appends (the runner appends to histories all the time).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from primefs.index.db import WATCHED, Index, session_ids
from primefs.runner.inotify import IN_CLOSE_WRITE, IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO, Inotify
from primefs.store import journal
from primefs.store.control import runner_token

FILES = ("session.yaml", "history.jsonl", "result.md", "harness")  # what an index row and its harness set come from
FOLDER_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE  # (IN_CREATE: a harness/ made)
SESSIONS_MASK = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
RECHECK_S = 5.0  # how often the index is asked whether it still holds the trust given: `reindex` starts it over


class JournalWatch:
    def __init__(self, ws, log):
        self.ws, self.log = ws, log
        self.sessions = str(ws.sessions)
        self.inotify: Inotify | None = None
        self.again = threading.Event()  # a complete look is due (at start, after an overflow)
        self.given: str | None = None  # the token this watch makes the index trust, while it may
        self.closed = False
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            self.inotify = Inotify(self._on_path, self._on_overflow)
        except (AttributeError, OSError) as exc:  # no inotify here: commands look at every session
            self.log(f"warning: no watch of session folders ({exc}): commands look at every session")
            return
        self.again.set()
        self.thread = threading.Thread(target=self._loop, name="primefs-journal", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.closed:
            due = self.again.wait(RECHECK_S)
            if self.closed:
                return
            try:
                if not due and not self._forgotten():
                    continue
                self.again.clear()
                self._complete()
            except Exception as exc:  # noqa: BLE001 - the journal stays untrusted; commands still answer right
                self.log(f"warning: the index's look at every session failed: {type(exc).__name__}: {exc}")

    def _complete(self) -> None:
        """Watch every session folder, then bring every row up to date, then trust the journal."""
        if not self.inotify.add(self.sessions, SESSIONS_MASK):
            return
        for sid in session_ids(self.ws.sessions):
            if not self.inotify.add(f"{self.sessions}/{sid}", FOLDER_MASK):
                if os.path.isdir(f"{self.sessions}/{sid}"):  # over the limit of watches: not every change is seen
                    self.log("warning: cannot watch every session folder (fs.inotify.max_user_watches): "
                             "commands look at every session")
                    return
        token = runner_token(self.ws)
        self.given = None
        with Index(self.ws.root) as index:
            index.untrust()
            index.sync(columns=("id",))  # untrusted: every folder looked at (a change meanwhile is marked)
            if token is not None and not self.again.is_set():  # no event was lost meanwhile
                index.set_state(WATCHED, token)
                self.given = token  # (if the index was locked all along, it is given again at the next check)

    def _forgotten(self) -> bool:
        """The index no longer holds the trust this watch gave it: built again (`primefs reindex`, or damaged)
        while the watch went on. Without another complete look, commands would look at every session."""
        if self.given is None:
            return False
        with Index(self.ws.root) as index:
            return index.get_state(WATCHED) != self.given

    def _on_path(self, path: Path) -> None:
        parent = str(path.parent)
        if parent == self.sessions:  # a session folder came or went
            if os.path.isdir(path):
                self.inotify.add(path, FOLDER_MASK)
            journal.mark_session(path)
        elif path.name in FILES and str(path.parent.parent) == self.sessions:
            journal.mark_session(path.parent)

    def _on_overflow(self) -> None:
        """Events were lost: a hand edit may not be marked. Untrusted until another complete look."""
        self.given = None
        with Index(self.ws.root) as index:  # untrusted first: a complete look begun after this trusts again
            index.untrust()
        self.again.set()

    def stop(self) -> None:
        self.closed = True
        self.again.set()
        if self.inotify is not None:
            self.inotify.close()
