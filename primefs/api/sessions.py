"""A session seen from a program: `SessionHandle` (wait, events, send, stop, usage) and `Result`.

Everything here reads the session's files or writes the files a person would (mail, a stop request);
the runner doing the work may be in this process (api/local.py) or any other.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from primefs.api import local
from primefs.errors import BudgetExceeded, PrimefsError, SessionFailed, Timeout
from primefs.store.history import latest_events
from primefs.store.mail import new_files, unacked
from primefs.store.session import Session
from primefs.store.settings import FINISHED
from primefs.store.workspace import Workspace

POLL_S = 0.01  # how often a wait looks at session.yaml (a stat; it is read again only when it changed)


@dataclass(frozen=True)
class Result:
    """How a session's work ended: its answer (result.md, None if its last turn gave none), status and
    stop reason, and the exact usage of its whole tree (it and every session it started)."""

    answer: str | None
    status: str
    stop_reason: str | None
    usage: dict = field(repr=False)
    session_id: str = ""
    name: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The session was not failed or stopped (an answer may still be None: e.g. `max_steps`)."""
        return self.status not in ("failed", "stopped")


MARKERS = ("turn_end", "turn_start", "message", "task")  # where a session's work stands, newest first


def ended(s: Session) -> bool:
    """The session has stopped working for now: its turn has ended (`turn_end` written: the status is set
    just before it, and end conditions run between the two) and no mail waits to start another. Mail is
    taken before the next turn's status is set: until then it is new, claimed (unacked) or, acknowledged,
    a `message` event after the `turn_end`. A turn a stopped runner cut off between the two counts as
    ended once the runner up now (if any) started after it: that one leaves an idle session as it is."""
    try:
        status = s.reload().get("status")
    except (PrimefsError, OSError):
        return False
    if status not in FINISHED:
        return False
    if status not in ("idle", "done"):
        return True
    if new_files(s.mail) or unacked(s.mail):
        return False
    marker = next((e for e in latest_events(s.dir / "history.jsonl") if e.get("type") in MARKERS), None)
    if marker is None or marker["type"] == "turn_end":
        return True
    from primefs.store.control import runner_state

    runner = runner_state(Workspace(s.dir.parent.parent))
    return not runner["running"] or (runner["started"] or 0) > (marker.get("ts") or 0)


def tree_usage(ws: Workspace, sid: str) -> dict:
    from primefs.index.accounting import UsageIndex

    return UsageIndex(ws.sessions, root=sid).tree(sid)


class SessionHandle:
    """One session of a workspace. Status, result and usage are read fresh from its files each time."""

    def __init__(self, ws: Workspace, session: Session):
        self._ws, self._session = ws, session

    def __repr__(self) -> str:
        return f"SessionHandle(id={self.id!r}, name={self.name!r}, status={self.status!r})"

    @property
    def id(self) -> str:
        return self._session.id

    @property
    def name(self) -> str:
        return self._session.name

    @property
    def path(self):
        """The session's folder: session.yaml, history.jsonl, result.md, mail/ (docs/workspace.md)."""
        return self._session.dir

    @property
    def session(self) -> Session:
        return self._session

    @property
    def status(self) -> str:
        return self._session.reload().get("status") or "pending"

    @property
    def answer(self) -> str | None:
        """result.md: the answer of its last turn that gave one (None: none yet)."""
        return self._session.read_result()

    @property
    def result(self) -> Result:
        """Where the session stands now, as a Result (it may still be working: see `ended`)."""
        m = self._session.reload()
        return Result(answer=self._session.read_result(), status=m.get("status") or "pending",
                      stop_reason=m.get("stop_reason"), usage=self.usage(), session_id=self.id,
                      name=m.get("name") or self.id, error=m.get("error"))

    @property
    def ended(self) -> bool:
        return ended(self._session)

    def usage(self, tree: bool = True) -> dict:
        """Calls, tokens, cost and time of its model calls: of its whole tree (default), or its own."""
        if tree:
            return tree_usage(self._ws, self.id)
        from primefs.index.accounting import own_usage

        return own_usage(self._session)

    # -- waiting: each wait is a generator that yields while there is nothing yet (drive, adrive) ----------
    def wait(self, timeout: float | None = None, *, run: bool = True) -> Result:
        """Wait until it has ended its work (idle, done, failed or stopped, no mail waiting); its Result.
        Raises Timeout after `timeout` seconds (it goes on). `run`: with no runner up, this process runs
        one (else it waits for one to start)."""
        return drive(self._waiting(timeout, run))

    async def await_result(self, timeout: float | None = None, *, run: bool = True) -> Result:
        """`wait()` as a coroutine: it never blocks the event loop."""
        return await adrive(self._waiting(timeout, run))

    def _waiting(self, timeout: float | None, run: bool):
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ended(self._session):
            if deadline is not None and time.monotonic() > deadline:
                raise Timeout(f"{self.name} is still {self.status} after {timeout:g} s", handle=self)
            if run:
                local.ensure(self._ws)  # the work goes on only with a runner up: this process's, if no other is
            yield
        return self.result

    def events(self, *, from_start: bool = True, timeout: float | None = None) -> Iterator[dict]:
        """Its history events as they are appended (from the first, or from now: where the file ends when
        this is called), with `{"type": "delta", "text": ...}` events carrying a model reply as it streams,
        until the session has ended its work. The event types are docs/workspace.md's. Raises Timeout
        after `timeout` seconds."""
        batches = self._batches(from_start, timeout)

        def each():
            for batch in batches:
                if batch:
                    yield from batch
                else:
                    time.sleep(POLL_S)
        return each()

    def aevents(self, *, from_start: bool = True, timeout: float | None = None) -> AsyncIterator[dict]:
        """`events()` as an async iterator: it never blocks the event loop."""
        batches = self._batches(from_start, timeout)

        async def each():
            for batch in batches:
                if batch:
                    for event in batch:
                        yield event
                else:
                    await asyncio.sleep(POLL_S)
        return each()

    def _batches(self, from_start: bool, timeout: float | None) -> Iterator[list[dict]]:
        """The events appended since the last look (an empty list: nothing yet), until it has ended. The
        file is looked at now (`from_start=False`: what comes after this call), not at the first batch."""
        from primefs.store.livefeed import Feed

        feed = Feed(self.path, self._ws.runtime, from_start)
        return self._looks(feed, None if timeout is None else time.monotonic() + timeout, timeout)

    def _looks(self, feed, deadline: float | None, timeout: float | None) -> Iterator[list[dict]]:
        while True:
            done = ended(self._session)  # looked at first: what was written before the end is read after
            yield feed.read()
            if done:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise Timeout(f"{self.name} is still {self.status} after {timeout:g} s", handle=self)
            local.ensure(self._ws)

    # -- acting on it -----------------------------------------------------------------------------
    @property
    def approval(self) -> int | None:
        """The number of the approval request it waits for (`approvals/<n>.md`), else None."""
        return self._session.reload().get("approval")

    def approve(self, n: int | None = None, reason: str | None = None) -> dict:
        """Say yes to its approval request n (None: the one it waits for), as `primefs approve` does."""
        return self._answer(n, "approve", reason)

    def deny(self, n: int | None = None, reason: str | None = None) -> dict:
        """Say no to its approval request n (None: the one it waits for); the model reads the reason."""
        return self._answer(n, "deny", reason)

    def _answer(self, n: int | None, verdict: str, reason: str | None) -> dict:
        import getpass

        from primefs.store import approvals

        mine = local.current(self._ws)  # this process's runner asked: answered in it, not by a request file
        if mine is not None:
            return mine.runner.approvals.answer(self.id, n, verdict, reason, getpass.getuser(), "api")
        return approvals.answer(self._ws, self.id, n, verdict, reason, "api")

    def send(self, text: str) -> str:
        """Mail it a message (as the user): an idle or finished session takes a new turn. Returns the
        message id. A stopped session takes no more turns (the message stays in its mailbox)."""
        from primefs.store.fsutil import ring
        from primefs.store.mail import deliver

        if not isinstance(text, str) or not text.strip():
            raise PrimefsError("the message is empty")
        msg = deliver(self._session.mail, sender="user", to=self.id, kind="user", text=text)
        ring(self.path)
        local.look(self._ws, self.path)
        return msg.id

    def stop(self, tree: bool = False, timeout: float = 30.0) -> None:
        """Stop it (and every descendant, with `tree`): a running cell is interrupted, no more turns.
        Returns once the runner has taken the stop (at most `timeout` seconds; it is applied then anyway)."""
        from primefs.store.control import STOP_FILE, lock_held, request_stop

        targets = [self.id]
        if tree:
            from primefs.index.db import descendants

            targets += descendants(self._ws, self.id)
        request_stop(self._ws, targets)
        for sid in targets:
            local.look(self._ws, self._ws.sessions / sid)
        deadline = time.monotonic() + timeout
        while (any((self._ws.sessions / sid / STOP_FILE).exists() for sid in targets) and lock_held(self._ws)
               and time.monotonic() < deadline):
            time.sleep(POLL_S)
        left = [sid for sid in targets if (self._ws.sessions / sid / STOP_FILE).exists()]
        if left and timeout and not lock_held(self._ws):  # its runner ended before taking the request: stop here
            for sid, (_, what) in zip(left, request_stop(self._ws, left)):
                if what != "stop requested (the runner applies it)":  # a runner started meanwhile takes it
                    (self._ws.sessions / sid / STOP_FILE).unlink(missing_ok=True)



def drive(waiting):
    """Run a waiting generator (it yields while there is nothing yet) to its return value."""
    while True:
        try:
            next(waiting)
        except StopIteration as done:
            return done.value
        time.sleep(POLL_S)


async def adrive(waiting):
    """`drive()` in an event loop: the looks are quick file reads, the pauses are `asyncio.sleep`."""
    while True:
        try:
            next(waiting)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(POLL_S)


def check_ended(result: Result) -> Result:
    """`ask()`'s rule: a failed or stopped session is an exception, naming why (a budget: BudgetExceeded)."""
    if result.ok:
        return result
    why = f" ({result.stop_reason})" if result.stop_reason else ""
    message = f"{result.name} is {result.status}{why}" + (f": {result.error}" if result.error else "")
    if (result.stop_reason or "").startswith("budget:"):
        raise BudgetExceeded(message, result)
    raise SessionFailed(message, result)
