"""Watching sessions as they run: `primefs log -f` (and hidden `tail`), `primefs attach` (`primefs agents`:
agents.py).

Everything here reads the files the runner writes; nothing talks to the runner. history.jsonl is
append-only with one write per event, so a reader keeps a byte offset just past the last complete
line it has read and polls the file size: a torn (still unterminated) last line is simply read
again once its newline has arrived, and a file that shrank (a restarted runner cut a torn tail
left by a crash) is read on from its new end.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

import click
from rich.console import Console
from rich.markup import escape

from primefs.cli.options import workspace, ws_option
from primefs.errors import PrimefsError
from primefs.index.db import find_session, session_names
from primefs.store.control import runner_state
from primefs.store.history import HistoryReader
from primefs.store.livefeed import Feed
from primefs.store.session import Session
from primefs.views.console import err, out
from primefs.views.events import EventPrinter, print_events

POLL_S = 0.2


def follow(session: Session, console: Console, stop_event: threading.Event | None = None,
           from_start: bool = True, *, last: int | None = None, names: dict[str, str] | None = None,
           poll: float = POLL_S, header: bool = True) -> int:
    """Print a session's events, then stream new ones as they are appended, and the text of a model
    reply as it streams, until `stop_event` is set.

    from_start: print the events already there first (only the `last` N of them if given);
    otherwise start at the end of the file. The session header line is printed once, at the start
    (when `header`). New sessions appearing in events (spawns) get their names looked up again.
    Ctrl-C propagates as KeyboardInterrupt. Returns the number of events printed.
    """
    from primefs.store.workspace import Workspace

    feed = Feed(session.dir, Workspace(session.dir.parent.parent).runtime, from_start)
    printer = EventPrinter(console, dict(names) if names is not None else session_names(session.dir.parent))
    events = feed.read()
    if from_start and last is not None:  # the last N events; a reply streaming now is shown still
        delta = [e for e in events[-1:] if e["type"] == "delta"]
        events = events[:len(events) - len(delta)]
        events = (events[-last:] if last > 0 else []) + delta
    if header:
        printer.header(session)
    printed = 0

    def show(events: list[dict]) -> None:
        nonlocal printed
        if any(e.get("type") in ("spawn", "sent", "message") for e in events):
            printer.names = session_names(session.dir.parent)
        printer.events(events)
        printed += sum(e["type"] != "delta" for e in events)

    show(events)
    while not (stop_event.wait(poll) if stop_event is not None else time.sleep(poll)):
        show(feed.read())
    show(feed.read())  # last look: events written just before the stop
    printer.end_line()
    return printed


def follow_events(s: Session, console: Console, *, names: dict, last: int | None = None, keep: bool = False,
                  only_new: bool = False, as_json: bool = False) -> None:
    """`primefs log`: the events (the last N), then, with `follow`, new ones until Ctrl-C."""
    if as_json:
        reader = HistoryReader(s.dir / "history.jsonl")
        if only_new:
            reader.seek_end()
        events = reader.read()
        for e in events[-last:] if last else ([] if last == 0 else events):
            click.echo(json.dumps(e, ensure_ascii=False))
        while keep:  # raw events as they are appended, one JSON object per line
            for e in reader.read():
                click.echo(json.dumps(e, ensure_ascii=False))
            sys.stdout.flush()
            time.sleep(POLL_S)
        return
    if not keep:
        events = s.events()
        print_events(console, s, events[-last:] if last else ([] if last == 0 else events), names)
        return
    follow(s, console, from_start=not only_new, last=last, names=names)


# `primefs tail` was `primefs log -f`; kept, hidden, for scripts that use it.
@click.command("tail", hidden=True)
@click.argument("session")
@click.option("-n", "--count", "--lines", "last", type=int, default=None, metavar="N")
@click.option("--new", "only_new", is_flag=True)
@ws_option
@click.pass_context
def follow_log(ctx, session, last, only_new):
    """Same as `primefs log -f` (kept for scripts)."""
    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    follow_events(s, out(), names=session_names(ws.sessions), last=last, keep=True,
                  only_new=only_new)


# -- primefs attach -----------------------------------------------------------------------------------
@click.command()
@click.argument("session")
@click.option("-n", "--count", "--lines", "last", type=int, default=20, show_default=True, metavar="N",
              help="Existing events to show first (0: none, -1: all).")
@ws_option
@click.pass_context
def attach(ctx, session, last):
    """Watch SESSION (id or name) live and talk to it: each line you type is mailed to it as `kind: user`.

    An idle or finished session takes a turn for each message (a runner must run: `primefs up`).
    Replies show as they stream. A session waiting for your yes is answered with a line `/approve [N]
    [REASON]` or `/deny [N] REASON` (not mailed). Ctrl-D or Ctrl-C detaches (the session is not stopped).
    """
    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    console = out()
    notes = err()
    stop = threading.Event()
    problems: list[str] = []
    _say_attached(console, ws, s)
    reader = threading.Thread(target=_read_typed_lines, args=(_mailer(ws, s, notes), stop, problems),
                              name="primefs-attach-input", daemon=True)
    reader.start()
    try:
        follow(s, console, stop_event=stop, last=None if last < 0 else last)
    except KeyboardInterrupt:
        stop.set()
    for p in problems:
        notes.print(f"[red]error:[/red] reading input: {escape(p)}")
    console.print(f"detached; {_where_it_stands(ws, s)}", markup=False, soft_wrap=True)


def _say_attached(console: Console, ws, s: Session) -> None:
    """What attach does, and what would keep a message from being answered now."""
    console.print(f"[dim]attached to {s.id} ({escape(s.name)}): type a message and press Enter; "
                  "Ctrl-D or Ctrl-C detaches[/dim]", soft_wrap=True)
    if not runner_state(ws)["running"]:
        console.print("[yellow]note:[/yellow] no runner is running: messages wait in the mailbox until "
                      "one starts (`primefs up`)", soft_wrap=True)
    if s.status == "stopped":
        console.print("[yellow]note:[/yellow] this session is stopped: it takes no more turns")
    if s.meta.get("approval"):
        console.print(f"[yellow]note:[/yellow] it waits for your yes to approval {s.meta['approval']}: type "
                      f"/approve {s.meta['approval']} or /deny {s.meta['approval']} REASON", soft_wrap=True)


ANSWER_RE = re.compile(r"/(approve|deny)(?:\s+(\d{1,9}))?(?:\s+(.*\S))?\s*")


def _mailer(ws, s: Session, notes: Console):
    """A function that mails one typed line (bytes) to the session, as `kind: user`; blank lines are not sent.
    `/approve [N] [REASON]` and `/deny [N] REASON` answer an approval the session waits for instead."""
    from primefs.store import approvals
    from primefs.store.mail import deliver

    def send(raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        answer = ANSWER_RE.fullmatch(text.strip())
        if answer:
            verdict, n, reason = answer.groups()
            try:
                done = approvals.answer(ws, s.id, int(n) if n else None, verdict, reason, "attach")
                notes.print(f"approval {done['approval']}: {done['verdict']}", markup=False)
            except PrimefsError as exc:
                notes.print(f"[red]error:[/red] {escape(str(exc))}")
            return
        try:
            deliver(s.mail, sender="user", to=s.id, kind="user", text=text)
        except OSError as exc:
            notes.print(f"[red]error:[/red] could not deliver: {escape(str(exc))}")

    return send


def _read_typed_lines(send, stop: threading.Event, problems: list[str]) -> None:
    """`send` each line typed on stdin until end of input or `stop`; then set `stop` (what went wrong goes in
    `problems`)."""
    # The raw descriptor, not sys.stdin: a daemon thread blocked inside sys.stdin's buffer lock
    # can abort the interpreter at exit. A tty in canonical mode returns one line per read;
    # Ctrl-D on an empty line returns b"" (end of input).
    fd = sys.stdin.fileno()
    pending = b""
    try:
        while not stop.is_set():
            chunk = os.read(fd, 65536)
            if not chunk:
                if pending:
                    send(pending)
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                send(line)
    except Exception as exc:  # never die silently: the main thread reports it
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()


def _where_it_stands(ws, s: Session) -> str:
    """What is true of the session as `attach` leaves it."""
    try:
        status = s.reload().get("status")
    except (PrimefsError, OSError):
        return "its session.yaml cannot be read now"
    if status == "stopped":
        return f"{s.name} is stopped and takes no more turns"
    if not runner_state(ws)["running"]:
        return f"{s.name} is {status}; no runner is running (primefs up starts one)"
    if status in ("running", "pending"):
        return f"{s.name} keeps running"
    return f"{s.name} is {status}; a message (primefs send) starts its next turn"


__all__ = ["follow", "follow_events", "follow_log", "attach"]
