"""Watching sessions as they run: `primefs log -f` (and hidden `tail`), `primefs attach`, `primefs agents`.

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
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from .cliopts import print_table, workspace, ws_option
from .daemon import human_age, runner_state
from .errors import PrimefsError
from .livefeed import StreamTail, stream_path
from .logview import EventPrinter, print_events
from .session import Session, find_session, list_sessions, session_names
from .sessionsview import Row, arrange, table, window

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
    """Print a session's events, then stream new ones as they are appended, and the text of a model
    reply as it streams, until `stop_event` is set.

    from_start: print the events already there first (only the `last` N of them if given);
    otherwise start at the end of the file. The session header line is printed once, at the start
    (when `header`). New sessions appearing in events (spawns) get their names looked up again.
    Ctrl-C propagates as KeyboardInterrupt. Returns the number of events printed.
    """
    reader = HistoryReader(session.dir / "history.jsonl")
    stream = StreamTail(stream_path(session.dir.parent.parent / ".primefs", session.id))
    printer = EventPrinter(console, dict(names) if names is not None else session_names(session.dir.parent))
    if from_start:
        events = reader.read()
        if last is not None:
            events = events[-last:] if last > 0 else []
    else:
        reader.seek_end()
        events = []
    if header:
        printer.header(session)
    printed = 0

    def show(events: list[dict]) -> None:
        nonlocal printed
        if any(e.get("type") in ("spawn", "sent", "message") for e in events):
            printer.names = session_names(session.dir.parent)
        printer.events(events)
        printed += len(events)
        text = stream.read()  # after the history: a reply streaming now comes after the events before it
        if text:
            printer.event({"type": "delta", "ts": time.time(), "text": text})

    show(events)
    while not (stop_event.wait(poll) if stop_event is not None else time.sleep(poll)):
        show(reader.read())
    show(reader.read())  # last look: events written just before the stop
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
    follow_events(s, Console(highlight=False), names=session_names(ws.sessions), last=last, keep=True,
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
    Replies show as they stream. Ctrl-D or Ctrl-C detaches (the session is not stopped).
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
                  "Ctrl-D or Ctrl-C detaches[/dim]", soft_wrap=True)
    if not runner_state(ws)["running"]:
        console.print("[yellow]note:[/yellow] no runner is running: messages wait in the mailbox until "
                      "one starts (`primefs up`)", soft_wrap=True)
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
    console.print(f"detached; {_where_it_stands(ws, s)}", markup=False, soft_wrap=True)


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


# -- primefs agents -----------------------------------------------------------------------------------
class _Track:
    """Per-session running totals, updated from the bytes appended since the last frame."""

    __slots__ = ("reader", "calls", "tokens", "cost", "turns", "last")

    def __init__(self, path: Path):
        self.reader = HistoryReader(path)
        self.calls = self.tokens = self.turns = 0
        self.cost = 0.0
        self.last: dict | None = None

    def update(self) -> None:
        if self.reader.size() < self.reader.pos:  # rewritten: count again from the start
            self.__init__(self.reader.path)
        for e in self.reader.read():
            t = e.get("type")
            if t == "model_call":
                self.calls += 1
                self.tokens += int(e.get("input_tokens") or 0) + int(e.get("output_tokens") or 0)
                self.cost += float(e.get("cost_usd") or 0.0)
            elif t == "turn_start" and not e.get("resumed"):  # a resumed turn is the same turn
                self.turns += 1
            self.last = e


class AgentsView:
    """The session tree as a table, rebuilt from the files; reading only what was appended since."""

    def __init__(self, ws):
        self.ws = ws
        self.offset = self.total = 0  # the first line shown, of how many
        self.sessions: dict[str, Session] = {}
        self.tracks: dict[str, _Track] = {}
        self.readable: set[str] = set()  # sessions whose session.yaml was read at least once

    def refresh(self) -> None:
        present = {s.id for s in list_sessions(self.ws.sessions)}
        for sid in list(self.sessions):
            if sid not in present:
                self.sessions.pop(sid)
                self.tracks.pop(sid, None)
                self.readable.discard(sid)
        for sid in sorted(present - set(self.sessions)):
            self.sessions[sid] = Session(self.ws.sessions / sid)
            self.tracks[sid] = _Track(self.ws.sessions / sid / "history.jsonl")
        for sid, s in list(self.sessions.items()):
            try:
                s.reload()
                self.readable.add(sid)
            except (OSError, PrimefsError, ValueError):
                pass  # keep the last good meta, if any (a file being replaced, a bad edit)
            self.tracks[sid].update()

    def rows(self) -> tuple[list, dict]:
        """The sessions as rows for sessionsview (own tokens and cost), and the runner's state."""
        now = time.time()
        info = runner_state(self.ws)
        state = info["state"] or {}
        waiting = set(state.get("waiting_sessions") or [])
        queued = set(state.get("queued_sessions") or [])
        active = set(state.get("active_sessions") or [])
        rows = []
        for sid in sorted(self.sessions):
            s, tr = self.sessions[sid], self.tracks[sid]
            if sid not in self.readable:  # never readable: shown as broken
                rows.append(Row(id=sid, name=sid, parent=None, status="broken", label="broken",
                                detail="session.yaml cannot be read", turns=tr.turns, tokens=tr.tokens, cost=tr.cost))
                continue
            m = s.meta
            status = m.get("status") or "pending"
            label = status + (" (wait)" if sid in waiting else " (queued)" if sid in queued else "")
            if m.get("stop_reason") not in (None, "", status) and status not in ("done", "running"):
                label += f" ({m['stop_reason']})"
            if status == "running" and not info["running"]:  # cut off by a runner that stopped
                label = "interrupted"
            last = tr.last or {}
            kind = str(last.get("type") or "")
            if kind == "turn_end" and last.get("outcome"):
                kind += f": {last['outcome']}"
            rows.append(Row(id=sid, name=str(m.get("name") or sid), parent=m.get("parent"), status=status,
                            label=label, turns=tr.turns, tokens=tr.tokens, cost=tr.cost, detail=kind,
                            age=human_age(now - last["ts"]) if last.get("ts") else "", node=m.get("node"),
                            busy=sid in active or sid in queued or sid in waiting))
        return rows, info

    def render(self, width: int = 80, height: int | None = None, offset: int = 0):
        """Header, then the table: work first, finished children folded; `height` lines at most, from
        `offset` (the rest is scrolled to)."""
        from rich.console import Group

        rows, info = self.rows()
        state = info["state"] or {}
        if info["running"]:
            head = (f"runner pid {info['pid']}: {len(state.get('active_sessions') or [])} active, "
                    f"{len(state.get('waiting_sessions') or [])} waiting, {len(state.get('queued_sessions') or [])} "
                    f"queued, {state.get('live_kernels', '?')} kernels")
        else:
            head = "no runner (primefs up)"
        tokens, cost = sum(r.tokens for r in rows), sum(r.cost for r in rows)
        head += f" | {len(rows)} sessions, {tokens:,} tokens, ${cost:.4f}"
        if len(head) + 11 <= width:
            head += f" | {time.strftime('%H:%M:%S')}"
        if not rows:
            return Group(Text(head, style="bold"), Text("no sessions yet"))
        items = arrange(rows, fold=True)
        self.total = len(items)
        shown, self.offset, below = window(items, (height - 3) if height else len(items), offset)
        parts = [Text(head, style="bold"), table(shown, width, last="last event", with_age=True)]
        if self.offset or below:
            parts.append(Text(f"{self.offset} above, {below} below: j/k or arrows to scroll, g/G top/bottom, "
                              "q quits", style="dim"))
        return Group(*parts)


class Keys:
    """Scroll keys from a terminal (cbreak mode, restored at the end); nothing when stdin is no terminal."""

    def __init__(self):
        self.offset, self.quit, self._old = 0, False, None

    def __enter__(self):
        import termios
        import tty

        if sys.stdin.isatty():
            self._old = termios.tcgetattr(sys.stdin.fileno())
            tty.setcbreak(sys.stdin.fileno())
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def __exit__(self, *exc):
        import termios

        if self._old is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._old)

    def _read(self) -> None:
        moves = {b"j": 1, b"\x1b[B": 1, b"k": -1, b"\x1b[A": -1, b" ": 20, b"\x1b[6~": 20, b"b": -20,
                 b"\x1b[5~": -20, b"g": -10**9, b"G": 10**9}
        while not self.quit:
            key = os.read(sys.stdin.fileno(), 8)
            if not key or key in (b"q", b"\x03"):
                self.quit = True
                return
            self.offset = max(0, self.offset + moves.get(key, 0))


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: a JSON list, one object per session (for scripts).")
@click.option("--interval", type=float, default=1.0, show_default=True, metavar="S", help="Seconds between refreshes.")
@ws_option
@click.pass_context
def agents(ctx, once, as_json, interval):
    """A live view of the session tree: status, turns, tokens, cost, last event and its age. Ctrl-C quits.

    Tokens and cost are each session's own (the header sums them over the workspace).
    """
    from rich.live import Live

    ws = workspace(ctx)
    view = AgentsView(ws)
    view.refresh()
    console = Console(highlight=False)
    if as_json:
        rows, _ = view.rows()
        click.echo(json.dumps([{"id": r.id, "name": r.name, "parent": r.parent, "status": r.status, "label": r.label,
                                "turns": r.turns, "tokens": r.tokens, "cost_usd": round(r.cost, 10),
                                "last_event": r.detail, "age": r.age, "node": r.node, "busy": r.busy}
                               for r in rows], indent=1))
        return
    if once:
        width = console.width if console.is_terminal else max(console.width, 160)  # piped: ids and whole names
        print_table(view.render(width), width)
        return
    try:
        with Keys() as keys, Live(view.render(console.width, console.height), console=console, auto_refresh=False,
                                  vertical_overflow="crop") as live:
            while not keys.quit:
                for _ in range(max(1, int(interval / 0.05))):  # keys move the view at once
                    time.sleep(0.05)
                    if keys.offset != view.offset or keys.quit:
                        break
                view.refresh()
                live.update(view.render(console.width, console.height, keys.offset), refresh=True)
                keys.offset = view.offset  # kept in range
    except KeyboardInterrupt:
        pass


__all__ = ["follow", "HistoryReader", "AgentsView", "follow_log", "attach", "agents"]
