"""`primefs.Workspace`: a workspace seen from a program. `ask()` runs a task and returns its Result;
`submit()` starts one and returns its SessionHandle. Each is a goal file, taken by a runner as any goal
is (the one up, or one in this process): a program's run is a session like any other.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

from primefs.api import local
from primefs.api.sessions import Result, SessionHandle, adrive, check_ended, drive
from primefs.errors import PrimefsError, Timeout
from primefs.store import workspace as store
from primefs.store.session import Session



class Workspace:
    """A primefs workspace folder (one with primefs.yaml). `Workspace.init(path)` makes a new one."""

    def __init__(self, path: str | os.PathLike):
        root = Path(path).expanduser().resolve()
        if not (root / store.CONFIG).is_file():
            raise PrimefsError(f"no primefs workspace at {root} (no {store.CONFIG}); "
                               f"make one with primefs.Workspace.init({str(path)!r})")
        self.root = root
        self._ws = store.Workspace(root)  # what the rest of primefs is handed
        self._closed = False

    @classmethod
    def init(cls, path: str | os.PathLike, template: str | os.PathLike | None = None) -> Workspace:
        """Make a new workspace at `path` (new or empty), from the default template or `template`."""
        store.init_workspace(Path(path), Path(template) if template else None)
        return cls(path)

    def __repr__(self) -> str:
        return f"primefs.Workspace({str(self.root)!r})"

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop this process's runner of the workspace, if one runs (its cut-off turns resume at the next
        runner start). The object refuses further use."""
        local.stop(self._ws)
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise PrimefsError(f"this primefs.Workspace ({self.root}) is closed")
        if not (self.root / store.CONFIG).is_file():
            raise PrimefsError(f"the workspace {self.root} is gone (no {store.CONFIG})")

    # -- sessions ---------------------------------------------------------------------------------
    def sessions(self) -> list[SessionHandle]:
        """Every session of the workspace, oldest first."""
        from primefs.store.session import list_sessions

        self._check_open()
        return [SessionHandle(self._ws, s) for s in list_sessions(self._ws.sessions)]

    def session(self, name_or_id: str) -> SessionHandle:
        """A session by id or name (PrimefsError if there is none, or the name is not unique)."""
        from primefs.index.db import find_session

        self._check_open()
        return SessionHandle(self._ws, find_session(self._ws.sessions, name_or_id))

    # -- running a task ---------------------------------------------------------------------------
    def submit(self, task: str, *, context=None, model: str | None = None, budget: dict | None = None,
               name: str | None = None, limits: dict | None = None, timeout: float | None = None) -> SessionHandle:
        """Start `task` as a session and return its handle once a runner has taken it.

        context: the session's `context` variable: a str, JSON-able data (dict, list, ...), or a
            pathlib.Path / list of Paths of files inside the workspace. A value is written once to a
            file (never put in a prompt). model: an alias of primefs.yaml or a litellm id (default: the
            workspace's). budget: {turns, tokens, seconds, cost_usd} for the whole tree. limits: the
            session's limits (max_steps_per_turn, max_depth, ...). timeout: how long to wait for a runner to take it.
        """
        return drive(self._submitting(task, context, model, budget, name, limits, timeout))

    async def asubmit(self, task: str, *, context=None, model: str | None = None, budget: dict | None = None,
                      name: str | None = None, limits: dict | None = None,
                      timeout: float | None = None) -> SessionHandle:
        """`submit()` as a coroutine: it never blocks the event loop (the goal is one small file write)."""
        return await adrive(self._submitting(task, context, model, budget, name, limits, timeout))

    def _submitting(self, task, context, model, budget, name, limits, timeout):
        from primefs.store.goals import write_goal

        self._check_open()
        if not isinstance(task, str) or not task.strip():
            raise PrimefsError("the task is empty")
        files, data = _context(context)
        extra = {}
        if budget is not None:
            from primefs.store.settings import check_budget

            extra["budget"] = check_budget(budget, "budget=")
        if limits is not None:
            from primefs.store.settings import check_limits

            extra["limits"] = check_limits(limits, "limits=")
        started = datetime.now(timezone.utc)
        stem = f"{name}" if name else f"ask-{started:%Y%m%d-%H%M%S}-{started.microsecond // 1000:03d}"
        path = write_goal(self._ws, task, model=model, name=stem, context=files, data=data, extra=extra)
        rel = path.relative_to(self.root).as_posix()
        return (yield from self._taking(rel, f"{started:%y%m%d-%H%M%S}", timeout, True))

    def ask(self, task: str, *, context=None, model: str | None = None, budget: dict | None = None,
            name: str | None = None, limits: dict | None = None, timeout: float | None = None) -> Result:
        """Run `task` until its session has answered; its Result (answer, status, tree usage, ...).

        Arguments as `submit()`'s; `timeout` bounds the whole run. Raises SessionFailed (it failed or was
        stopped), BudgetExceeded (a budget ran out) or Timeout (it goes on: `exc.handle`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        handle = self.submit(task, context=context, model=model, budget=budget, name=name, limits=limits,
                             timeout=timeout)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return check_ended(handle.wait(left))

    async def aask(self, task: str, *, timeout: float | None = None, **kwargs) -> Result:
        """`ask()` as a coroutine: it never blocks the event loop (a notebook's, a server's)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        handle = await self.asubmit(task, timeout=timeout, **kwargs)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return check_ended(await handle.await_result(left))

    def taken(self, goal: str, *, since: str = "", timeout: float | None = None, run: bool = True) -> SessionHandle:
        """The session a runner made (or makes) of the goal file `goal` (workspace-relative; made after
        `since`, an id prefix). `run`: with no runner up, this process runs one (else it waits for one).
        Raises PrimefsError if the runner rejected the goal, Timeout after `timeout` seconds."""
        self._check_open()
        return drive(self._taking(goal, since, timeout, run))

    def _taking(self, goal: str, since: str, timeout: float | None, run: bool):
        from primefs.runner.intake import REJECTED
        from primefs.store.fsutil import read_json_dict

        deadline = None if timeout is None else time.monotonic() + timeout
        mine = local.ensure(self._ws) if run else None
        if mine is not None:
            mine.look(self.root / goal)
        seen: set[str] = set()  # folders read: another goal's sessions
        unread: set[str] = set()  # folders made since `since`, not read yet (or without session.yaml yet)
        listed = None  # sessions/'s mtime at the last listing: a new folder changes it
        refusals_looked = 0.0
        while True:
            try:
                mtime = os.stat(self._ws.sessions).st_mtime_ns
            except FileNotFoundError:
                mtime = None
            if mtime != listed and mtime is not None:
                listed = mtime
                unread |= {n for n in os.listdir(self._ws.sessions) if n >= since and n not in seen}
            for name in sorted(unread):
                try:
                    s = Session(self._ws.sessions / name)
                    if s.meta.get("goal") == goal:
                        return SessionHandle(self._ws, s)
                    seen.add(name)
                    unread.discard(name)
                except (PrimefsError, OSError):
                    continue  # being written: looked at again
            if time.monotonic() - refusals_looked > 0.2:
                refusals_looked = time.monotonic()
                refused = read_json_dict(self._ws.state / REJECTED).get(goal)
                if isinstance(refused, dict):
                    raise PrimefsError(f"the runner rejected the goal: {refused.get('error')}")
            if deadline is not None and time.monotonic() > deadline:
                raise Timeout(f"no runner took {goal} within {timeout:g} s (see primefs status)")
            now = local.ensure(self._ws) if run else None
            if now is not None and now is not mine:  # this process's runner ended before taking it: again
                mine = now
                mine.look(self.root / goal)
            yield


def _context(context) -> tuple[list[str] | None, object]:
    """(files, value): Paths are files of the workspace; anything else is the value itself."""
    if context is None:
        return None, None
    if isinstance(context, os.PathLike):
        return [os.fspath(context)], None
    if isinstance(context, (list, tuple)) and context and all(isinstance(c, os.PathLike) for c in context):
        return [os.fspath(c) for c in context], None
    if isinstance(context, (bytes, bytearray)):
        raise PrimefsError("the context must be text, JSON-able data or file paths, not bytes (decode it first)")
    return None, context
