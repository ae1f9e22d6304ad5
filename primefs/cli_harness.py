"""`primefs harness ...` and `primefs refine`: the continual harness from the command line."""
from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from .errors import PrimefsError
from .cliopts import workspace, ws_option
from .harness import KINDS, Harness, session_chain


def _ws(ctx):
    return workspace(ctx)


@click.group("harness")
def harness_group():
    """Notes, memories, skills and subagent specs: list, show, change, log, revert, judge outcomes."""


@harness_group.command("list")
@click.option("--kind", type=click.Choice(KINDS))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@ws_option
@click.pass_context
def list_cmd(ctx, kind, as_json):
    """Every harness entry, global and session-local; broken files with the reason."""
    entries = Harness(_ws(ctx)).list(kind, all_sessions=True)
    rows = [{"kind": e.kind, "name": e.name, "scope": e.scope, "session": e.session, "path": e.path,
             "description": e.description, "problem": e.problem} for e in entries]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for col in ("kind", "name", "scope", "description / problem"):
        table.add_column(col, overflow="fold")
    for r in rows:
        scope = r["scope"] + (f" {r['session']}" if r["session"] else "")
        table.add_row(r["kind"], r["name"], scope, f"[red]{r['problem']}[/red]" if r["problem"] else r["description"])
    Console(highlight=False).print(table if rows else "the harness is empty")


@harness_group.command("show")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option("--session", help="Look up as this session sees it (its own and its ancestors' entries first).")
@ws_option
@click.pass_context
def show(ctx, kind, name, session):
    """Print one entry: its file, front matter and body."""
    ws = _ws(ctx)
    if session:
        from .session import find_session

        session = find_session(ws.sessions, session).id
    e = Harness(ws).get(kind, name, sessions=session_chain(ws, session) if session else ())
    if e is None:
        raise PrimefsError(f"no {kind} named {name!r} in the harness")
    path = ws.root / e.path
    click.echo(f"# {e.path} ({e.scope})")
    click.echo((path / "SKILL.md" if path.is_dir() else path).read_text(encoding="utf-8"), nl=False)
    for f in e.files:
        click.echo(f"\n# {e.path}/{f}")


@harness_group.command("put")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option("--body", "body_file", type=click.File("r"), default=None,
              help="File with the Markdown body ('-': standard input). Without it an update keeps the body.")
@click.option("--description", "-d", help="One line: what it is, when to use it.")
@click.option("--scope", type=click.Choice(["global", "session"]), default="global", show_default=True)
@click.option("--session", help="The session (for --scope session).")
@ws_option
@click.pass_context
def put(ctx, kind, name, body_file, description, scope, session):
    """Create or update an entry (committed with Primefs-Source: user)."""
    ws = _ws(ctx)
    if session:
        from .session import find_session

        session = find_session(ws.sessions, session).id
    sha = Harness(ws).put(kind, name, body_file.read() if body_file else None, scope=scope, session=session,
                          description=description, source="user")
    click.echo(sha or "no change")


@harness_group.command("rm")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option("--scope", type=click.Choice(["global", "session"]), default="global", show_default=True)
@click.option("--session", help="The session (for --scope session).")
@ws_option
@click.pass_context
def rm(ctx, kind, name, scope, session):
    """Delete an entry (committed with Primefs-Source: user)."""
    click.echo(Harness(_ws(ctx)).delete(kind, name, scope=scope, session=session, source="user") or "no change")


@harness_group.command("log")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, newest first.")
@click.option("-n", "limit", type=int, help="At most this many commits.")
@ws_option
@click.pass_context
def log(ctx, as_json, limit):
    """Harness commits with their provenance (session, source, evidence, intent) and outcome."""
    rows = Harness(_ws(ctx)).log(limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for col in ("commit", "date", "entry", "source", "session", "intent / outcome"):
        table.add_column(col, overflow="fold")
    for r in rows:
        outcome = f" [{'green' if r['outcome'] == 'good' else 'red'}]{r['outcome']}[/]" if r["outcome"] else ""
        table.add_row(r["sha"][:10], r["date"][:19], f"{r['kind']}/{r['name']}", r["source"] or "",
                      r["session"] or "", (r["intent"] or r["subject"]) + outcome)
    Console(highlight=False).print(table if rows else "no harness commits yet")


@harness_group.command("revert")
@click.argument("commit")
@ws_option
@click.pass_context
def revert(ctx, commit):
    """Undo one harness commit with `git revert` (history stays append-only). The next turn uses the result."""
    click.echo(Harness(_ws(ctx)).revert(commit))


@harness_group.command("outcome")
@click.argument("commit")
@click.argument("verdict", type=click.Choice(["good", "bad"]))
@click.option("--note", help="What happened.")
@ws_option
@click.pass_context
def outcome(ctx, commit, verdict, note):
    """Record whether a change had its intended effect (a git note; shown by `harness log`)."""
    Harness(_ws(ctx)).record_outcome(commit, verdict, note)
    click.echo(f"{commit}: {verdict}")


@click.command("refine")
@click.argument("session")
@click.option("--instructions", "-i", help="What to focus on.")
@click.option("--scope", type=click.Choice(["global", "session"]), default="global", show_default=True,
              help="Where new entries go.")
@click.option("--model", "-m", help="Model for the refine call (default: the session's).")
@ws_option
@click.pass_context
def refine_cmd(ctx, session, instructions, scope, model):
    """One model call proposes harness edits from SESSION's recent events; valid ones are committed."""
    import fcntl

    from .fsutil import ring, write_atomic
    from .control import REFINE_FILE
    from .session import find_session

    ws = _ws(ctx)
    s = find_session(ws.sessions, session)
    if model:
        ws.resolve_model(model)
    request = {"instructions": instructions, "scope": scope, "model": model}
    ws.state.mkdir(exist_ok=True)
    with open(ws.state / "runner.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a runner owns the session's history: let it do the work
            write_atomic(s.dir / REFINE_FILE, json.dumps(request))
            ring(s.dir)
            click.echo(f"refine requested; the running runner applies it (see `primefs log {s.id}`)")
            return
        # holding the runner lock: no runner can start and write this history meanwhile
        from .runner import refine_offline

        result = refine_offline(ws, s.id, request, log=lambda m: click.echo(m, err=True))
    for a in result["applied"]:
        click.echo(f"applied {a['op']} {a['kind']}/{a['name']}: {a['commit']}")
    for r in result["rejected"]:
        click.echo(f"rejected {r['edit']}: {r['reason']}")
    if result.get("error"):
        raise PrimefsError(f"refine failed: {result['error']}")
    sys.stdout.flush()
