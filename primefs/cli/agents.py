"""`primefs agents`: a live view of the session tree, from the index (each session's summary, current
with its files); scroll keys when stdin is a terminal."""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import click
from rich.text import Text

from primefs.cli.options import print_table, workspace, ws_option
from primefs.index.db import Entry, Index
from primefs.store.control import runner_state
from primefs.views.console import out
from primefs.views.sessions import Row, arrange, table, window
from primefs.views.when import human_age


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
        self.offset = self.total = 0  # the first line shown, of how many
        self.sessions: dict[str, Entry] = {}
        self.tracks: dict[str, _Track] = {}
        self.readable: set[str] = set()  # sessions whose session.yaml was read at least once
        self.widths: dict = {}  # the number columns' widths so far (they grow, never jump)
        self.index = Index(ws.root)

    def refresh(self) -> None:
        rows = self.index.sync()
        for sid in list(self.tracks):
            if sid not in rows:
                self.sessions.pop(sid, None)
                self.tracks.pop(sid, None)
                self.readable.discard(sid)
        for sid, row in rows.items():
            self.tracks[sid] = _Track(row)
            if not row["broken"]:  # else keep the last good meta, if any (a file being replaced, a bad edit)
                self.sessions[sid] = Entry(row)
                self.readable.add(sid)

    def rows(self) -> tuple[list, dict]:
        """The sessions as rows for sessionsview (own tokens and cost), and the runner's state."""
        now = time.time()
        info = runner_state(self.ws)
        state = info["state"] or {}
        waiting = set(state.get("waiting_sessions") or [])
        queued = set(state.get("queued_sessions") or [])
        active = set(state.get("active_sessions") or [])
        rows = []
        for sid in sorted(self.tracks):
            s, tr = self.sessions.get(sid), self.tracks[sid]
            if s is None:  # never readable: shown as broken
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
            elif m.get("approval"):  # a person's yes is needed: primefs approve
                label = f"waiting: approval {m['approval']}"
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
        head = Text(head, style="bold", no_wrap=True, overflow="ellipsis")  # one line, whatever the width
        if not rows:
            return Group(head, Text("no sessions yet"))
        items = arrange(rows, fold=True)
        self.total = len(items)
        # header, the table's own header and the scroll line: what is left of the screen is rows
        shown, self.offset, below = window(items, (height - 3) if height else len(items), offset)
        parts = [head, table(shown, width, last="last event", with_age=True, widths=self.widths)]
        if self.offset or below:
            hint = "j/k, arrows: scroll; g/G: top/bottom; q quits" if width >= 70 else "j/k scroll, q quits"
            parts.append(Text(f"{self.offset} above, {below} below: {hint}", style="dim", no_wrap=True,
                              overflow="ellipsis"))
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
    console = out()
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
