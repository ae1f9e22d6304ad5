"""Readable rendering of history events (primefs log)."""
from __future__ import annotations

import json
from datetime import datetime

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax


def _ts(e: dict) -> str:
    return datetime.fromtimestamp(e.get("ts", 0)).strftime("%H:%M:%S")


def print_events(out: Console, session, events: list[dict], names: dict[str, str] | None = None,
                 header: bool = True) -> None:
    names = names or {}

    def who(sid: str) -> str:
        return f"{sid} ({names[sid]})" if sid in names else sid

    if header:
        try:
            out.print(f"[bold]{session.id}[/bold] ({escape(session.name)}) status: {session.status}")
        except Exception as exc:  # noqa: BLE001 - a broken session.yaml: its history is still shown
            out.print(f"[bold]{session.id}[/bold] [red]broken:[/red] {escape(str(exc))}")
    for e in events:
        try:
            _print_event(out, e, who)
        except Exception:  # noqa: BLE001 - an event written by hand or by another version: shown raw
            out.print(escape(json.dumps(e, ensure_ascii=False, default=str)))


def _print_event(out: Console, e: dict, who) -> None:
    """One event, readably."""
    t, ts = e.get("type"), f"[dim]{_ts(e)}[/dim]"
    if t == "task":
        out.print(f"{ts} [bold cyan]task[/bold cyan]\n{escape(e['text'])}")
    elif t == "message":
        how = f" (read by {e['read_by']})" if e.get("read_by") else ""
        out.print(f"{ts} [bold cyan]{escape(e['kind'])} from {escape(who(e['from']))}{how}[/bold cyan]\n"
                  f"{escape(e['text'])}")
    elif t == "notice":
        out.print(f"{ts} [yellow]notice[/yellow] {escape(e['text'])}")
    elif t == "model_call":
        cost = f", ${e['cost_usd']:.6f}" if e.get("cost_known") else ""
        out.print(f"{ts} [dim]model {escape(str(e['model']))} ({e['purpose']}): {e['input_tokens']} in, "
                  f"{e['output_tokens']} out, {e['latency_s']:.2f} s{cost}[/dim]")
    elif t == "model_error":
        out.print(f"{ts} [red]model error (attempt {e['attempt']})[/red] {escape(e['error'])}")
    elif t == "assistant":
        if e.get("text"):
            out.print(f"{ts} [bold green]assistant[/bold green]\n{escape(e['text'])}")
        for c in e.get("calls") or []:
            out.print(f"{ts} [green]tool call[/green] {escape(c['name'])}")
    elif t == "cell":
        out.print(f"{ts} [magenta]cell[/magenta]")
        if e.get("code"):
            out.print(Syntax(e["code"], "python", theme="ansi_dark", background_color="default"))
        out.print(escape(e.get("shown", "")))
    elif t == "result":
        out.print(f"{ts} [bold]result[/bold]\n{escape(e['text'])}")
    elif t == "status":
        reason = f" ({e['stop_reason']})" if e.get("stop_reason") else ""
        out.print(f"{ts} [blue]status[/blue] {e.get('previous')} -> {e['status']}{reason}")
    elif t == "warning":
        out.print(f"{ts} [yellow]warning[/yellow] {escape(e['text'])}")
    elif t == "error":
        out.print(f"{ts} [red]error[/red] {escape(e['error'])}")
    elif t == "spawn":
        out.print(f"{ts} [bold yellow]spawned[/bold yellow] {e['child']} ({escape(str(e['name']))}): "
                  f"{escape(e['task'][:200])}")
    elif t == "sent":
        to = ", ".join(who(x) for x in e["to"])
        out.print(f"{ts} [yellow]sent[/yellow] {e['kind']} to {escape(e['target'])} ({to}): {escape(e['text'][:500])}")
    elif t == "bad_mail":
        out.print(f"{ts} [red]bad mail[/red] {escape(e['file'])}: {escape(e['error'])}")
    elif t == "compaction":
        out.print(f"{ts} [yellow]compaction[/yellow] events up to n={e['upto_n']} ({e['replaced']}) replaced by a "
                  f"summary ({e['tokens_before']} tokens before):\n{escape(e['summary'])}")
    elif t == "kernel":
        out.print(f"{ts} [dim]kernel {e['event']}[/dim]")
    elif t in ("turn_start", "turn_end"):
        extra = f": {e['outcome']} in {e['elapsed_s']:.2f} s" if t == "turn_end" else ""
        out.print(f"{ts} [dim]{t.replace('_', ' ')} {e['turn']}{extra}[/dim]")
    else:
        fields = {k: v for k, v in e.items() if k not in ("ts", "type", "n")}
        out.print(f"{ts} [dim]{t} {escape(str(fields))}[/dim]")
