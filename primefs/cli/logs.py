"""`primefs logs` (events across sessions, from the index) and `primefs reindex` (rebuild the index)."""
from __future__ import annotations

import json
import time
from datetime import datetime

import click

from primefs.cli.options import progress_bar, workspace, ws_option
from primefs.errors import PrimefsError
from primefs.index.archived import sync_archives
from primefs.index.db import Index
from primefs.index.events import sync_events
from primefs.index.find import find_events
from primefs.views.console import echo, out
from primefs.views.events import cached_text
from primefs.views.sessions import cut_middle
from primefs.views.when import parse_when


def split_list(value: str | None, option: str, allowed: tuple | None = None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if allowed is not None and v not in allowed]
    if not items or bad:
        raise PrimefsError(f"{option}: {', '.join(bad) or repr(value)} is not one of {', '.join(allowed or ())}")
    return items


def _short(text, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def one_line(e: dict) -> str:
    """An event in a line: what `primefs log` says of it, shortened."""
    t = e.get("type")
    if t == "model_call":
        return (f"{e.get('model')} ({e.get('purpose')}): {e.get('input_tokens')} in{cached_text(e)}, "
                f"{e.get('output_tokens')} out"
                + (f", ${e['cost_usd']:.6f}" if e.get("cost_known") and isinstance(e.get("cost_usd"), (int, float)) else ""))
    if t in ("cell", "exec"):
        out = (e.get("error") or e.get("output") or "").strip()
        return _short(e.get("code") or "") + (f" -> {_short(out, 60)}" if out else "")
    if t == "message":
        return f"{e.get('kind')} from {e.get('from')}: {_short(e.get('text') or '')}"
    if t == "status":
        return f"{e.get('previous')} -> {e.get('status')}" + (f" ({e['stop_reason']})" if e.get("stop_reason") else "")
    if t in ("turn_start", "turn_end"):
        return f"turn {e.get('turn')}" + (f": {e.get('outcome')} in {e.get('elapsed_s')} s" if t == "turn_end" else "")
    if t == "spawn":
        return f"{e.get('child')} ({e.get('name')}): {_short(e.get('task') or '')}"
    if t == "assistant":
        calls = ", ".join(str(c.get("name")) for c in e.get("calls") or [] if isinstance(c, dict))
        return _short(e.get("text") or "") + (f" [calls: {calls}]" if calls else "")
    if t == "tool_call":
        return f"{e.get('name')} ({e.get('plugin')}), {e.get('duration_s')} s" + (f": {e['error']}" if e.get("error") else "")
    for key in ("text", "error", "answer", "reason", "event", "name"):
        if e.get(key):
            return _short(e[key])
    return _short(json.dumps({k: v for k, v in e.items() if k not in ("ts", "type", "n", "session", "session_name")},
                             ensure_ascii=False, default=str))


def event_line(e: dict, width: int | None = None, one_session: bool = False) -> str:
    """An event of `logs`: its time, session, type and what it says. Piped (`width` None) whole, ids included,
    for scripts; at a terminal one line of `width`, the session by its name (none if only one is shown)."""
    ts = e.get("ts") if isinstance(e.get("ts"), (int, float)) else None
    name = e["session_name"] or "session.yaml broken"  # (no name can be read of it)
    if width is None:
        when = datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts is not None else "?"
        return f"{when}  {e['session']} ({name})  {e.get('type')}  {one_line(e)}"
    when = datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S") if ts is not None else "?"
    head = f"{when}  {'' if one_session else cut_middle(name, 20) + '  '}{e.get('type')}  "
    return head + _short(one_line(e), max(12, width - len(head)))


def _sessions(index: Index, keys: tuple, tree: bool) -> list[str] | None:
    if not keys:
        if tree:
            raise PrimefsError("--tree needs --session SESSION")
        return None
    index.refresh()  # a name or parent edited by hand counts
    out: list[str] = []
    for key in keys:
        row = index.run(lambda db: db.execute(
            "SELECT id FROM sessions WHERE id = ? OR (name = ? AND broken IS NULL) ORDER BY id = ? DESC, "
            "place = '' DESC, id DESC LIMIT 1", (key, key, key)).fetchone())
        if row is None:
            raise PrimefsError(f"no session with id or name {key!r} (see `primefs status`)")
        out += index.subtree(row[0]) if tree else [row[0]]
    return out


@click.command("logs")
@click.option("-n", "--count", "count", type=int, default=20, show_default=True, metavar="N",
              help="Show the newest N matching events (0: all of them).")
@click.option("-s", "--session", "sessions", multiple=True, metavar="SESSION",
              help="Only this session (id or name; repeatable), archived ones included.")
@click.option("--tree", is_flag=True, help="With --session: its descendants too.")
@click.option("--name", metavar="PATTERN", help="Only sessions whose name matches (a glob: 'report', 'root.*').")
@click.option("--status", "statuses", metavar="LIST", help="Only sessions in these statuses: pending, running, idle, "
              "done, failed, stopped (comma-separated).")
@click.option("-m", "--model", metavar="MODEL", help="Only events of this model: a model call's own, else its "
              "session's (a glob: 'openai/*').")
@click.option("--since", metavar="DATE", help="Only events at or after DATE: 2026-11-29, '2026-11-29 14:00' (local), "
              "or 30m, 2h, 7d, 1w (ago).")
@click.option("--until", metavar="DATE", help="Only events before DATE (same forms).")
@click.option("-t", "--type", "types", metavar="LIST", help="Only these event types (comma-separated): model_call, "
              "cell, message, ... (docs/workspace.md lists them).")
@click.option("-q", "--query", "text", metavar="TEXT", help="Full-text search of the events' text (task, messages, "
              "replies, code, output, errors): words, \"a phrase\", prefix*, a OR b (SQLite FTS5).")
@click.option("--counts", is_flag=True, help="Only the counts: matching events, sessions, per type, model calls per model.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of the events, each with `session` and `session_name` "
              "added; with --counts, the counts as a JSON object.")
@ws_option
@click.pass_context
def logs_cmd(ctx, count, sessions, tree, name, statuses, model, since, until, types, text, counts, as_json):
    """Events of every session (archived ones too), newest last, from the index: filter by session, name,
    status, model, time, type and text."""
    from primefs.store.settings import STATUSES

    if count < 0:
        raise PrimefsError("-n/--count must be 0 (all) or more")
    ws = workspace(ctx)
    filters = {"name": name, "statuses": split_list(statuses, "--status", STATUSES), "model": model,
               "since": parse_when(since, "--since"), "until": parse_when(until, "--until"),
               "types": split_list(types, "--type"), "text": text}
    with Index(ws.root) as index:
        sync_archives(index)  # before _sessions: a name may be an archived session's
        filters["sessions"] = _sessions(index, sessions, tree)
        events, found = find_events(ws.root, index, count or None, counts=counts, **filters)
    if counts:
        click.echo(json.dumps(found, indent=2) if as_json else _counts_text(found))
        return
    if as_json:
        click.echo(json.dumps(events, indent=2, ensure_ascii=False, default=str))
    else:
        console = out()
        width = console.width if console.is_terminal else None
        one = len(filters["sessions"] or ()) == 1
        for e in events:
            echo(event_line(e, width, one))
    shown = len(events)
    tail = "" if shown == found["events"] else f" (the newest {shown}; -n 0 shows all)"
    click.echo(f"{found['events']:,} matching event(s){tail}" if found["events"] else "no matching events", err=True)


def _counts_text(found: dict) -> str:
    lines = [f"{found['events']:,} event(s) in {found['sessions']:,} session(s)"]
    lines += [f"  {t}: {n:,}" for t, n in found["by_type"].items()]
    if found["model_calls"]:
        lines.append("model calls per model:")
        lines += [f"  {m}: {n:,}" for m, n in found["model_calls"].items()]
    return "\n".join(lines)


@click.command("reindex")
@click.option("--summaries", is_flag=True, help="Also count every session's summary again from its history.")
@click.option("--json", "as_json", is_flag=True, help="Print what was indexed as a JSON object.")
@ws_option
@click.pass_context
def reindex_cmd(ctx, summaries, as_json):
    """Rebuild the index (.primefs/index.sqlite) from the files: sessions, their summaries, every event of
    every history and archive. Any command brings the index up to date by itself; this starts it over."""
    from primefs.index.archive import recover
    from primefs.store import summary as summ
    from primefs.store.control import runner_lock

    ws = workspace(ctx)
    started = time.monotonic()
    with runner_lock(ws) as held:
        if held:  # no runner: trees a crash left half archived are put right first
            recover(ws)
    if summaries:
        from primefs.index.db import session_ids

        for sid in session_ids(ws.sessions):
            (ws.sessions / sid / summ.FILE).unlink(missing_ok=True)
    with Index(ws.root) as index:
        index.rebuild()
        rows = index.sync()
        with progress_bar("histories") as progress:
            sync_events(index, progress=progress)
        archived = sync_archives(index)
        total = index.run(lambda db: db.execute("SELECT count(*) FROM events").fetchone()[0])
    out = {"sessions": len(rows), "archived_sessions": archived, "events": total, "seconds": round(time.monotonic() - started, 2)}
    click.echo(json.dumps(out, indent=2) if as_json else
               f"indexed {len(rows):,} session(s), {archived:,} archived session(s), {total:,} event(s) in "
               f"{out['seconds']} s")
