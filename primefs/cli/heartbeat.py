"""`primefs heartbeat SESSION SCHEDULE PROMPT` and its list / pause / resume / rm."""
from __future__ import annotations

import json
from datetime import datetime

import click
from rich.table import Table

from primefs.cli.options import emit, json_option, print_table, workspace, ws_option
from primefs.index.db import find_session
from primefs.store import heartbeat as hbmod
from primefs.store.session import list_sessions


class HeartbeatGroup(click.Group):
    """`primefs heartbeat SESSION ...` (no subcommand) adds a heartbeat."""

    def parse_args(self, ctx, args):
        i = 0
        while i < len(args) and args[i].startswith("-"):  # skip group options (-w DIR) to the first word
            i += 2 if args[i] in ("-w", "--workspace") else 1
        if i < len(args) and args[i] not in self.commands:
            args = [*args[:i], "add", *args[i:]]
        return super().parse_args(ctx, args)


@click.group("heartbeat", cls=HeartbeatGroup)
@ws_option
def heartbeat_group():
    """Re-enter a session on a schedule with a fixed prompt, delivered as `kind: heartbeat` mail.

    \b
      primefs heartbeat SESSION "every 10m" "check the build"
      primefs heartbeat SESSION "*/15 9-17 * * 1-5" "look at the queue"
      primefs heartbeat list [SESSION] | pause SESSION ID | resume SESSION ID | rm SESSION ID
    """


@heartbeat_group.command("add")
@click.argument("session")
@click.argument("schedule")
@click.argument("prompt")
@json_option
@ws_option
@click.pass_context
def add(ctx, session, schedule, prompt, as_json):
    """Add a heartbeat: SCHEDULE is 'every 10m' (s, m, h, d) or 5 cron fields."""
    s = find_session(workspace(ctx).sessions, session)
    hb = hbmod.add(s.dir, schedule, prompt)
    emit(as_json, {**hb, "session": s.id},
         f"{hb['id']}: next at {datetime.fromtimestamp(hb['next_due']):%Y-%m-%d %H:%M:%S}")


@heartbeat_group.command("list")
@click.argument("session", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@ws_option
@click.pass_context
def list_cmd(ctx, session, as_json):
    """Heartbeats of one session, or of all."""
    ws = workspace(ctx)
    sessions = [find_session(ws.sessions, session)] if session else list_sessions(ws.sessions)
    problems: list[str] = []
    rows = [{**hb, "session": s.id} for s in sessions for hb in hbmod.load_all(s.dir, problems)]
    for problem in problems:  # a file the runner skips too: said, not hidden
        click.echo(f"warning: heartbeat skipped: {problem}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for col in ("session", "id", "schedule", "next", "state", "prompt"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["session"], r["id"], r["schedule"], f"{datetime.fromtimestamp(r['next_due']):%m-%d %H:%M:%S}",
                      "paused" if r.get("paused") else "active", r["prompt"])
    print_table(table if rows else "no heartbeats")


def _set(ctx, session, hb_id, as_json, **changes):
    s = find_session(workspace(ctx).sessions, session)
    hb = hbmod.find(s.dir, hb_id)
    hb.update(changes)
    if changes.get("paused") is False:  # ticks missed while paused are not owed
        hb["next_due"] = hbmod.next_after(hbmod.parse_schedule(hb["schedule"]), datetime.now().timestamp())
    hbmod.save(s.dir, hb)
    emit(as_json, {**hb, "session": s.id}, f"{hb_id}: {'paused' if hb['paused'] else 'active'}")


def one_heartbeat(name: str):
    """`primefs heartbeat NAME SESSION ID`: the arguments and options of a command on one heartbeat."""
    def decorate(fn):
        for wrap in (click.pass_context, ws_option, json_option, click.argument("hb_id", metavar="ID"),
                     click.argument("session"), heartbeat_group.command(name)):
            fn = wrap(fn)
        return fn
    return decorate


@one_heartbeat("pause")
def pause(ctx, session, hb_id, as_json):
    """Stop a heartbeat's ticks until `resume`."""
    _set(ctx, session, hb_id, as_json, paused=True)


@one_heartbeat("resume")
def resume(ctx, session, hb_id, as_json):
    """Tick again, from the next scheduled time."""
    _set(ctx, session, hb_id, as_json, paused=False)


@one_heartbeat("rm")
def rm(ctx, session, hb_id, as_json):
    """Delete a heartbeat."""
    s = find_session(workspace(ctx).sessions, session)
    hbmod.find(s.dir, hb_id)
    (hbmod.folder(s.dir) / f"{hb_id}.yaml").unlink()
    emit(as_json, {"id": hb_id, "session": s.id, "removed": True}, f"{hb_id}: removed")
