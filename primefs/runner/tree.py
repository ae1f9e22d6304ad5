"""The session tree: one Session object per session (one history writer, one cached session.yaml)
and the family links from each session.yaml's `parent`."""
from __future__ import annotations

import threading
from pathlib import Path

from primefs.store.session import Session, subtree


class SessionTree:
    def __init__(self, sessions_dir: Path):
        self.dir = Path(sessions_dir)
        self._sessions: dict[str, Session] = {}
        self._parents: dict[str, str | None] = {}
        self._children: dict[str, list[str]] = {}
        self._lock = threading.RLock()

    def session(self, sid: str) -> Session:
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                s = self._sessions[sid] = Session(self.dir / sid)
            return s

    def forget(self, sid: str) -> None:
        """A session the runner has not used for a while: its Session object (its cached session.yaml, its
        open history file) goes; the next use reads it again. Its family links stay."""
        with self._lock:
            s = self._sessions.pop(sid, None)
        if s is not None:
            s.history.close()

    def put(self, session: Session) -> None:
        """Keep a Session object already read (its session.yaml need not be parsed again)."""
        with self._lock:
            self._sessions.setdefault(session.id, session)

    def link(self, sid: str, parent: str | None) -> None:
        with self._lock:
            if sid in self._parents:
                return
            self._parents[sid] = parent
            self._children.setdefault(sid, [])
            if parent:
                self._children.setdefault(parent, []).append(sid)

    def drop(self, sid: str) -> None:
        """A session that left sessions/ (archived with its whole tree)."""
        with self._lock:
            self._sessions.pop(sid, None)
            parent = self._parents.pop(sid, None)
            self._children.pop(sid, None)
            if parent in self._children and sid in self._children[parent]:
                self._children[parent].remove(sid)

    def knows(self, sid: str) -> bool:
        with self._lock:
            return sid in self._parents

    def parent(self, sid: str) -> str | None:
        with self._lock:
            return self._parents.get(sid)

    def children(self, sid: str) -> list[str]:
        with self._lock:
            return list(self._children.get(sid, []))

    def chain(self, sid: str) -> list[str]:
        """The session and its ancestors, nearest first (what its harness lookups see)."""
        out: list[str] = []
        with self._lock:
            while sid and sid not in out:
                out.append(sid)
                sid = self._parents.get(sid)
        return out

    def root(self, sid: str) -> str:
        return self.chain(sid)[-1]

    def subtree(self, sid: str) -> list[str]:
        """`sid` and all its descendants."""
        with self._lock:
            return subtree(self._children, sid)

    def child_named(self, parent: str, name: str) -> str | None:
        """The newest child of `parent` with that name."""
        named = [c for c in self.children(parent) if self.session(c).name == name]
        return named[-1] if named else None
