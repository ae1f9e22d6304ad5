"""A session is a folder: sessions/<id>/{session.yaml, task.md, history.jsonl, result.md, mail/}."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from primefs.store import journal, redact
from primefs.store import summary as summaries
from primefs.store.frontmatter import dump_yaml, load_yaml
from primefs.store.fsutil import read_regular, write_atomic
from primefs.store.history import History, read_events
from primefs.store.settings import STATUSES, check_session_meta

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), timezone.utc).isoformat(timespec="milliseconds")


def new_id() -> str:
    """Short, sortable by creation time (UTC, to the millisecond), unique, safe as a file name."""
    now = datetime.now(timezone.utc)
    return f"{now:%y%m%d-%H%M%S}{now.microsecond // 1000:03d}-{''.join(secrets.choice(_ALPHABET) for _ in range(3))}"


class Session:
    def __init__(self, root: Path):
        self.dir = Path(root)
        self.id = self.dir.name
        self._meta: dict | None = None
        self._meta_key: tuple | None = None  # (inode, mtime, size) of the session.yaml we parsed
        self._lock = threading.Lock()
        self.history = History(self.dir / "history.jsonl")
        self._summary: dict | None = None

    # -- files ------------------------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        if self._meta is None:
            self._meta = self.read_meta()
        return self._meta

    def read_meta(self) -> dict:
        label = f"sessions/{self.id}/session.yaml"
        data = load_yaml(self.dir / "session.yaml", safe=True, label=label)  # machine-written: the fast loader
        return check_session_meta(data, label)

    def _stat_key(self) -> tuple:
        st = os.stat(self.dir / "session.yaml")
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def reload(self) -> dict:
        """Fresh from the file, but parsed again only if the file changed (YAML parsing is slow)."""
        key = self._stat_key()
        if self._meta is None or key != self._meta_key:
            self._meta = self.read_meta()
            self._meta_key = key
        return self._meta

    def update(self, **fields) -> dict:
        with self._lock:
            meta = self.meta
            meta.update(redact.value(fields))
            meta["updated"] = iso()
            write_atomic(self.dir / "session.yaml", dump_yaml(meta, safe=True), durable=False)
            self._meta_key = self._stat_key()
            journal.mark(self.history._marker)
            return meta

    def set_status(self, status: str, **fields) -> None:
        """The status and these fields in session.yaml (one write); a `status` event when it changed, with
        `stop_reason` and `error` when not null."""
        assert status in STATUSES, status
        previous = self.meta.get("status")
        self.update(status=status, **fields)
        if previous != status:
            self.history.append("status", status=status, previous=previous,
                                **{k: fields[k] for k in ("stop_reason", "error") if fields.get(k) is not None})
        self.summary()

    def summary(self, write: bool = True) -> dict:
        """This session's summary (summary.py), brought up to date with its files and written back if
        it changed. The copy of session.yaml this object holds is used when it is known to be current."""
        with self._lock:
            known = self._meta is not None and self._meta_key is not None
            self._summary = summaries.fresh(self.dir, self._summary, meta=self._meta if known else None,
                                            meta_key=self._meta_key if known else None, write=write)
            return self._summary

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.id

    @property
    def status(self) -> str:
        return self.meta.get("status", "pending")

    @property
    def task(self) -> str:
        return read_regular(self.dir / "task.md")

    def read_result(self) -> str | None:
        try:
            return read_regular(self.dir / "result.md")
        except OSError:  # none yet (or not a regular file)
            return None

    def write_result(self, text: str) -> None:
        write_atomic(self.dir / "result.md", text)
        journal.mark(self.history._marker)

    def events(self, type: str | None = None) -> list[dict]:
        return read_events(self.dir / "history.jsonl", type)

    @property
    def mail(self) -> Path:
        return self.dir / "mail"


def create_session(sessions_dir: Path, *, task: str, name: str | None, model: str, parent: str | None = None,
                   depth: int = 0, goal: str | None = None, context: list[str] | None = None,
                   extra: dict | None = None, files: dict[str, str | Path] | None = None) -> Session:
    """session.yaml is written last and atomically: a folder without it is an unfinished (ignored) session.

    (Not a temp folder renamed into place: recursive inotify watches would keep the old name.)
    """
    sessions_dir.mkdir(parents=True, exist_ok=True)
    while True:
        sid = new_id()
        try:
            (sessions_dir / sid).mkdir()
            break
        except FileExistsError:
            continue
    final = sessions_dir / sid
    try:
        for sub in ("tmp", "new", "cur"):
            (final / "mail" / sub).mkdir(parents=True)
        now = iso()
        meta = {"id": sid, "name": name or sid, "parent": parent, "depth": depth, "status": "pending",
                "model": model, "goal": goal, "context": list(context or []), "created": now, "updated": now,
                **(extra or {})}
        meta = json.loads(json.dumps(meta, default=str))  # plain data: ruamel's (`name: "x"`) can't be dumped safe
        for fname, text in (files or {}).items():  # a context value: data as files, never prompt text
            if isinstance(text, Path):  # a goal's context_data file: copied (the kernel may write its own folder)
                shutil.copyfile(text, final / fname)
            else:
                write_atomic(final / fname, text, durable=False)
            meta["context_data"] = f"{sessions_dir.name}/{sid}/{fname}"
        write_atomic(final / "task.md", str(task), durable=False)
        (final / "history.jsonl").touch()
        write_atomic(final / "session.yaml", dump_yaml(meta, safe=True))
        journal.mark_session(final)
    except BaseException:  # no half-made folder is left (a goal would leave one at every scan)
        shutil.rmtree(final, ignore_errors=True)
        raise
    session = Session(final)
    # what was just written, known without parsing it back (a runner makes thousands of children)
    session._meta = check_session_meta(meta, f"sessions/{sid}/session.yaml")
    session._meta_key = session._stat_key()
    return session


def with_harness(sessions_dir: Path, ids=None) -> list[str]:
    """Of `ids` (default: every folder under sessions/), the sessions that hold a harness/ folder: one stat
    each (pathlib's glob costs 3-4 times more)."""
    base = str(sessions_dir)
    if ids is None:
        try:
            with os.scandir(base) as it:
                ids = [e.name for e in it if not e.name.startswith(".")]
        except OSError:
            return []
    return sorted(sid for sid in ids if os.path.isdir(f"{base}/{sid}/harness"))


def context_files(context) -> dict[str, str]:
    """A context value as a session's files: str -> context.txt, other data -> context.json (None: none).
    Data that is not JSON-able raises TypeError or ValueError."""
    if context is None:
        return {}
    if isinstance(context, str):
        return {"context.txt": context}
    return {"context.json": json.dumps(context, ensure_ascii=False)}


def list_sessions(sessions_dir: Path) -> list[Session]:
    if not sessions_dir.is_dir():
        return []
    return [Session(p) for p in sorted(sessions_dir.iterdir())
            if p.is_dir() and not p.name.startswith(".") and (p / "session.yaml").is_file()]


def subtree(children: dict, root: str) -> list[str]:
    """`root`, then its descendants depth first, children in creation order (ids sort so), given
    parent -> [children]. The one walk of a tree: iterative, so deep trees are fine; a cycle of
    parents (session.yaml edited by hand) is cut where it comes back."""
    out, seen, stack = [], set(), [root]
    while stack:
        sid = stack.pop()
        if sid in seen:
            continue
        seen.add(sid)
        out.append(sid)
        kids = children.get(sid)
        if kids:  # (most sessions have none: no sort for them)
            stack.extend(sorted(kids, reverse=True))
    return out


def broken_goal_line(path: Path) -> str | None:
    """The `goal:` of a session.yaml too broken to parse, read as a plain line (its goal stays taken)."""
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("goal: ") and line[6:].strip() not in ("", "null"):
                return line[6:].strip().strip("'\"")
    except OSError:
        pass
    return None
