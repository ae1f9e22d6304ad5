"""Requests from the command line to a runner that may or may not be running: files again."""
from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager

from .fsutil import ring, write_atomic
from .mail import deliver
from .index import Index
from .session import Session
from .workspace import Workspace

STOP_FILE = "stop.request"  # written by `primefs stop`; the runner applies and removes it
REFINE_FILE = "refine.request"  # written by `primefs refine` while a runner runs


@contextmanager
def runner_lock(ws: Workspace):
    """Hold the runner lock while no runner runs (yields True: none can start meanwhile); yields False
    if a runner holds it."""
    ws.state.mkdir(exist_ok=True)
    with open(ws.state / "runner.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def descendants(ws: Workspace, sid: str) -> list[str]:
    """From the index (new session folders looked at first): no session.yaml of the workspace parsed."""
    index = Index(ws.root)
    try:
        index.refresh()  # a parent edited by hand, a broken session.yaml mended: what the files say
        return [d for d in index.subtree(sid)[1:] if (ws.sessions / d).is_dir()]
    finally:
        index.close()


def request_stop(ws: Workspace, sid: str, tree: bool = False) -> list[tuple[str, str]]:
    """Stop a session (and its descendants). With a runner: a stop.request file it applies at once.
    Without one: mark the sessions stopped directly (holding the runner lock so none starts meanwhile)."""
    targets = [sid] + (descendants(ws, sid) if tree else [])
    ws.state.mkdir(exist_ok=True)
    with open(ws.state / "runner.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            runner_running = False
        except BlockingIOError:
            runner_running = True
        out = []
        for t in targets:
            s = Session(ws.sessions / t)
            if s.status in ("stopped",):
                out.append((t, "already stopped"))
            elif runner_running:
                write_atomic(s.dir / STOP_FILE, "stop\n")
                ring(s.dir)
                out.append((t, "stop requested (the runner applies it)"))
            else:
                s.set_status("stopped", stop_reason="stopped")
                parent = s.meta.get("parent")
                if parent:  # as the runner does: the parent learns of it by mail
                    deliver(ws.sessions / parent / "mail", sender=t, to=parent, kind="result",
                            text="(no result: stopped)", extra={"child": t, "name": s.name, "status": "stopped"})
                out.append((t, "stopped"))
        if not runner_running:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


def take_refine_request(folder) -> dict | None:
    """The request `primefs refine` left for the running runner (instructions, scope, model), removed
    as it is taken; None if there is none or it cannot be read."""
    path = folder / REFINE_FILE
    try:
        request = json.loads(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return None
    if not isinstance(request, dict):
        return None
    return {k: request.get(k) for k in ("instructions", "scope", "model") if request.get(k) is not None}
