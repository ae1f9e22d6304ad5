"""Watching sessions as they run: `primefs tail`, `primefs attach`, `primefs agents`.

Everything here reads the files the runner writes; nothing talks to the runner. history.jsonl is
append-only with one write per event, so a reader keeps a byte offset just past the last complete
line it has read and polls the file size: a torn (still unterminated) last line is simply read
again once its newline has arrived, and a file that shrank (a restarted runner cut a torn tail
left by a crash) is read on from its new end.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .cliopts import workspace, ws_option
from .daemon import human_age, runner_state
from .errors import PrimefsError
from .logview import print_events
from .index import Entry, Index
from .session import Session, find_session, session_names

POLL_S = 0.2


def line_start(path: Path, size: int) -> int:
    """Offset just past the last newline at or before `size` (0 if none)."""
    if size == 0:
        return 0
    try:
        with open(path, "rb") as f:
            pos = size
            while pos > 0:
                start = max(0, pos - 65536)
                f.seek(start)
                i = f.read(pos - start).rfind(b"\n")
                if i >= 0:
                    return start + i + 1
                pos = start
    except FileNotFoundError:
        pass
    return 0


class HistoryReader:
    """Incremental reader of one history.jsonl: each `read()` returns the complete events appended since."""

    def __init__(self, path: Path, pos: int = 0):
        self.path = Path(path)
        self.pos = pos  # just past the last complete line consumed

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def read(self) -> list[dict]:
        size = self.size()
        if size < self.pos:  # truncated (a torn tail repaired): go on from the new end
            self.pos = self._line_start(size)
        if size == self.pos:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(size - self.pos)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:  # only a torn line so far: wait for its newline
            return []
        self.pos += end + 1
        events = []
        for line in data[: end + 1].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # garbled line: skipped, like history.iter_events
            if isinstance(event, dict):
                events.append(event)
        return events

    def _line_start(self, size: int) -> int:
        return line_start(self.path, size)

    def seek_end(self) -> None:
        """Skip what is there now (a torn last line is kept, to be read when complete)."""
        self.pos = self._line_start(self.size())


def follow(session: Session, console: Console, stop_event: threading.Event | None = None,
           from_start: bool = True, *, last: int | None = None, names: dict[str, str] | None = None,
           poll: float = POLL_S, header: bool = True) -> int:
    """Print a session's events, then stream new ones as they are appended, until `stop_event` is set.

    from_start: print the events already there first (only the `last` N of them if given);
    otherwise start at the end of the file. Each batch goes through logview.print_events; the
    session header line is printed once, at the start (when `header`). New sessions appearing in
    events (spawns) get their names looked up again. Ctrl-C propagates as KeyboardInterrupt.
    Returns the number of events printed.
    """
    reader = HistoryReader(session.dir / "history.jsonl")
    names = dict(names) if names is not None else session_names(session.dir.parent)
    printed = 0
    if from_start:
        events = reader.read()
        if last is not None:
            events = events[-last:] if last > 0 else []
    else:
        reader.seek_end()
        events = []
    if header:
        print_events(console, session, events, names)
    elif events:
        print_events(console, session, events, names, header=False)
    printed += len(events)
    while True:
        if stop_event is not None:
            if stop_event.wait(poll):
                break
        else:
            time.sleep(poll)
        events = reader.read()
        if not events:
            continue
        if any(e.get("type") in ("spawn", "sent", "message") for e in events):
            names = session_names(session.dir.parent)
        print_events(console, session, events, names, header=False)
        printed += len(events)
    # last look: events written just before the stop
    events = reader.read()
    if events:
        print_events(console, session, events, names, header=False)
        printed += len(events)
    return printed


# -- primefs tail -------------------------------------------------------------------------------------
@click.command("tail")
@click.argument("session")
@click.option("-n", "--lines", "last", type=int, default=None, metavar="N",
              help="Show only the last N existing events first (default: all of them).")
@click.option("--new", "only_new", is_flag=True, help="Show no existing events, only new ones.")
@ws_option
@click.pass_context
def follow_log(ctx, session, last, only_new):
    """Show a session's history, then new events as they happen (SESSION: id or name). Ctrl-C quits."""
    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    console = Console(highlight=False)
    try:
        follow(s, console, from_start=not only_new, last=last)
    except KeyboardInterrupt:
        pass


# -- primefs attach -----------------------------------------------------------------------------------
@click.command()
@click.argument("session")
@click.option("-n", "--lines", "last", type=int, default=20, show_default=True, metavar="N",
              help="Existing events to show first (0: none, -1: all).")
@ws_option
@click.pass_context
def attach(ctx, session, last):
    """Watch SESSION (id or name) live and talk to it: each line you type is mailed to it as `kind: user`.

    An idle or finished session takes a turn for each message (a runner must run: `primefs up`).
    Ctrl-D or Ctrl-C detaches; the session keeps running.
    """
    from .mail import deliver

    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    stop = threading.Event()
    problems: list[str] = []

    def send(raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        try:
            deliver(s.mail, sender="user", to=s.id, kind="user", text=text)
        except OSError as exc:
            err.print(f"[red]error:[/red] could not deliver: {escape(str(exc))}")

    def read_input() -> None:
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

    console.print(f"[dim]attached to {s.id} ({escape(s.name)}): type a message and press Enter; "
                  "Ctrl-D or Ctrl-C detaches[/dim]")
    if not runner_state(ws)["running"]:
        console.print("[yellow]note:[/yellow] no runner is running: messages wait in the mailbox until "
                      "one starts (`primefs up`)")
    if s.status == "stopped":
        console.print("[yellow]note:[/yellow] this session is stopped: it takes no more turns")
    reader = threading.Thread(target=read_input, name="primefs-attach-input", daemon=True)
    reader.start()
    try:
        follow(s, console, stop_event=stop, last=None if last < 0 else last)
    except KeyboardInterrupt:
        stop.set()
    for p in problems:
        err.print(f"[red]error:[/red] reading input: {escape(p)}")
    console.print("detached; the session keeps running")


# -- primefs agents -----------------------------------------------------------------------------------
class _Track:
    """A session's own totals and last event, as its summary has them (summary.py)."""

    __slots__ = ("calls", "tokens", "cost", "turns", "last")

    def __init__(self, row: dict):
        u = row["usage"]
        self.calls, self.tokens, self.cost = u["calls"], u["input_tokens"] + u["output_tokens"], u["cost_usd"]
        self.turns, self.last = row["turns"] or 0, row["last"]


class AgentsView:
    """The session tree as a table, from the index: each session's summary, current with its files
    (a few stats per session and frame; a changed session's summary reads only what was appended)."""

    def __init__(self, ws):
        self.ws = ws
        self.sessions: dict[str, Entry] = {}
        self.tracks: dict[str, _Track] = {}
        self.readable: set[str] = set()  # sessions whose session.yaml was read at least once
        self.index = Index(ws.root)

    def refresh(self) -> None:
        rows = self.index.sync()
        for sid in list(self.sessions):
            if sid not in rows:
                self.sessions.pop(sid)
                self.tracks.pop(sid, None)
                self.readable.discard(sid)
        for sid, row in rows.items():
            self.tracks[sid] = _Track(row)
            if not row["broken"]:  # else keep the last good meta, if any (a file being replaced, a bad edit)
                self.sessions[sid] = Entry(row)
                self.readable.add(sid)

    def order(self) -> list[str]:
        """Roots in creation order, each followed by its descendants (depth first), as in `primefs status`."""
        from .accounting import tree_order

        index = type("Index", (), {})()
        index.sessions = {sid: s for sid, s in self.sessions.items() if sid in self.readable}
        index.children = defaultdict(list)
        for sid, s in index.sessions.items():
            index.children[s.meta.get("parent")].append(sid)
        return tree_order(index)

    def render(self):
        now = time.time()
        info = runner_state(self.ws)
        state = info["state"] or {}
        waiting = set(state.get("waiting_sessions") or [])
        queued = set(state.get("queued_sessions") or [])
        order = self.order()
        table = Table(box=None, header_style="bold", pad_edge=False)
        table.add_column("session", no_wrap=True)
        table.add_column("name", no_wrap=True, max_width=28, overflow="ellipsis")
        table.add_column("status", no_wrap=True)
        nodes = any(self.sessions[sid].meta.get("node") for sid in order)  # kernels on Ray nodes
        if nodes:
            table.add_column("node", no_wrap=True)
        for col in ("turns", "tokens", "cost $"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("last event", no_wrap=True)
        table.add_column("age", justify="right", no_wrap=True)
        colors = {"running": "green", "idle": "cyan", "done": "blue", "failed": "red", "stopped": "yellow",
                  "pending": "magenta"}
        total_tokens, total_cost = 0, 0.0
        for sid in order:
            s, tr = self.sessions[sid], self.tracks[sid]
            m = s.meta
            status = m.get("status") or "pending"
            label = status
            if sid in waiting:
                label += " (wait)"
            elif sid in queued:
                label += " (queued)"
            if m.get("stop_reason") and status not in ("done", "running"):
                label += f" ({m['stop_reason']})"
            last = tr.last or {}
            kind = str(last.get("type") or "")
            if kind == "turn_end" and last.get("outcome"):
                kind += f": {last['outcome']}"
            age = human_age(now - last["ts"]) if last.get("ts") else ""
            total_tokens += tr.tokens
            total_cost += tr.cost
            where = [Text(str(m.get("node") or "local"))] if nodes else []
            table.add_row(Text("  " * int(m.get("depth") or 0) + sid), Text(str(m.get("name") or "")),
                          Text(label, style=colors.get(status, "")), *where, str(tr.turns), f"{tr.tokens:,}",
                          f"{tr.cost:.4f}", Text(kind), age)
        if info["running"]:
            head = (f"runner: pid {info['pid']}, {len(state.get('active_sessions') or [])} active, "
                    f"{len(waiting)} waiting, {len(queued)} queued, {state.get('live_kernels', '?')} kernels")
        else:
            head = "runner: not running (start one with `primefs up`)"
        head += f"  |  {len(order)} sessions, {total_tokens:,} tokens, ${total_cost:.4f}  |  {time.strftime('%H:%M:%S')}"
        from rich.console import Group

        body = table if order else Text("no sessions yet")
        return Group(Text(head, style="bold"), body)


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts).")
@click.option("--interval", type=float, default=1.0, show_default=True, metavar="S", help="Seconds between refreshes.")
@ws_option
@click.pass_context
def agents(ctx, once, interval):
    """A live view of the session tree: status, turns, tokens, cost, last event and its age. Ctrl-C quits.

    Tokens and cost are each session's own (the header sums them over the workspace).
    """
    from rich.live import Live

    ws = workspace(ctx)
    view = AgentsView(ws)
    view.refresh()
    console = Console(highlight=False)
    if once:
        console.print(view.render())
        return
    try:
        with Live(view.render(), console=console, refresh_per_second=4, auto_refresh=False,
                  vertical_overflow="crop") as live:
            while True:
                time.sleep(max(0.05, interval))
                view.refresh()
                live.update(view.render(), refresh=True)
    except KeyboardInterrupt:
        pass


__all__ = ["follow", "HistoryReader", "AgentsView", "follow_log", "attach", "agents"]
