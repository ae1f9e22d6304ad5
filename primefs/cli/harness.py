"""`primefs harness ...` and `primefs refine`: the continual harness from the command line."""
from __future__ import annotations

import json
import sys

import click
from rich.markup import escape
from rich.table import Table

from primefs.cli.options import emit, json_option, print_table, workspace, ws_option
from primefs.errors import PrimefsError
from primefs.harness.commits import summary
from primefs.harness.entries import KINDS, Harness, session_chain
from primefs.views.console import echo


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
    print_table(table if rows else "the harness is empty")


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
        from primefs.index.db import find_session

        session = find_session(ws.sessions, session).id
    e = Harness(ws).get(kind, name, sessions=session_chain(ws, session) if session else ())
    if e is None:
        raise PrimefsError(f"no {kind} named {name!r} in the harness")
    path = ws.root / e.path
    click.echo(f"# {e.path} ({e.scope})")
    echo((path / "SKILL.md" if path.is_dir() else path).read_text(encoding="utf-8"), nl=False)
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
@json_option
@ws_option
@click.pass_context
def put(ctx, kind, name, body_file, description, scope, session, as_json):
    """Create or update an entry (committed with Primefs-Source: user). Same content: no commit."""
    ws = _ws(ctx)
    if session:
        from primefs.index.db import find_session

        session = find_session(ws.sessions, session).id
    h = Harness(ws)
    sha = h.put(kind, name, body_file.read() if body_file else None, scope=scope, session=session,
                description=description, source="user")
    entry = h.get(kind, name, sessions=[session] if scope == "session" else ())
    emit(as_json, {"commit": sha, "changed": sha is not None, "kind": kind, "name": name, "scope": scope,
                   "session": session if scope == "session" else None, "path": entry.path if entry else None},
         sha or "no change")


@harness_group.command("rm")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option("--scope", type=click.Choice(["global", "session"]), default="global", show_default=True)
@click.option("--session", help="The session (for --scope session).")
@json_option
@ws_option
@click.pass_context
def rm(ctx, kind, name, scope, session, as_json):
    """Delete an entry (committed with Primefs-Source: user)."""
    sha = Harness(_ws(ctx)).delete(kind, name, scope=scope, session=session, source="user")
    emit(as_json, {"commit": sha, "changed": bool(sha), "kind": kind, "name": name, "scope": scope,
                   "session": session}, sha or "no change")


@harness_group.command("log")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, newest first.")
@click.option("-n", "--count", "limit", type=int, metavar="N", help="At most this many commits.")
@ws_option
@click.pass_context
def log(ctx, as_json, limit):
    """Harness commits with their provenance (session, source, evidence, intent), outcome and reverts."""
    rows = Harness(_ws(ctx)).log()
    shown = rows[:limit] if limit else rows
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    by_sha = {r["sha"]: r for r in rows}  # all of them: what a shown revert reverts may be older than -n
    table = Table(box=None, header_style="bold", collapse_padding=True, pad_edge=False)
    for col in ("commit", "date", "source"):  # never split: a date or a sha in two lines reads as two
        table.add_column(col, no_wrap=True)
    table.add_column("entry", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("session", no_wrap=True, overflow="ellipsis", max_width=12)
    table.add_column("intent / outcome", ratio=1, min_width=16)  # wraps at words
    for r in shown:
        table.add_row(r["sha"][:10], r["date"][:16].replace("T", " "), escape(r["source"] or ("git" if r["reverts"]
                                                                                             else "")),
                      escape(f"{r['kind']}/{r['name']}"), r["session"] or "", _change(r, by_sha))
    print_table(table if shown else "no harness commits yet")


def _change(r: dict, by_sha: dict) -> str:
    """The last column: what the commit did (a revert says of what), its outcome, and who reverted it."""
    if r["reverts"]:
        of = by_sha.get(r["reverts"])
        what = ("" if not of else f"which reverted {of['reverts'][:10]}" if of["reverts"] else
                summary(of["subject"].split("): ", 1)[-1], 50))
        text = f"revert of {r['reverts'][:10]}" + (f" ({what})" if what else "") + (f": {r['intent']}" if r["intent"] else "")
    else:
        text = r["intent"] or r["subject"]
    text = escape(text)
    if r["outcome"]:
        text += f" [{'green' if r['outcome'] == 'good' else 'red'}]{r['outcome']}[/]"
    if r["reverted_by"]:
        text += f" [yellow]reverted by {r['reverted_by'][:10]}[/]"
    return text


@harness_group.command("revert")
@click.argument("commit")
@json_option
@ws_option
@click.pass_context
def revert(ctx, commit, as_json):
    """Undo one harness commit with `git revert` (history stays append-only). The next turn uses the result."""
    h = Harness(_ws(ctx))
    full, _, t = h.git.harness_commit(commit)
    new = h.revert(full)
    emit(as_json, {"commit": new, "reverts": full, "kind": t["Primefs-Kind"], "name": t.get("Primefs-Name"),
                   "path": t.get("Primefs-Path") or None}, new)


@harness_group.command("outcome")
@click.argument("commit")
@click.argument("verdict", type=click.Choice(["good", "bad"]))
@click.option("--note", help="What happened.")
@json_option
@ws_option
@click.pass_context
def outcome(ctx, commit, verdict, note, as_json):
    """Record whether a change had its intended effect (a git note; shown by `harness log`)."""
    Harness(_ws(ctx)).record_outcome(commit, verdict, note)
    emit(as_json, {"commit": commit, "outcome": verdict, "note": note}, f"{commit}: {verdict}")


@click.command("refine")
@click.argument("session")
@click.option("--instructions", "-i", help="What to focus on.")
@click.option("--scope", type=click.Choice(["global", "session"]), default="global", show_default=True,
              help="Where new entries go.")
@click.option("--model", "-m", help="Model for the refine call (default: the session's).")
@click.option("--gate", "gate_bench", metavar="BENCH",
              help="Keep the edits only if benchmark BENCH does not score worse with them (docs/harness.md).")
@click.option("--items", "-n", "gate_n", type=int, help="With --gate: how many items (default 5).")
@click.option("--seed", "gate_seed", type=int, help="With --gate: the items' seed (default 0).")
@click.option("--gate-model", help="With --gate: the model the items run on (default: the workspace's).")
@json_option
@ws_option
@click.pass_context
def refine_cmd(ctx, session, instructions, scope, model, gate_bench, gate_n, gate_seed, gate_model, as_json):
    """One model call proposes harness edits from SESSION's recent events; valid ones are committed.
    With --gate, only if a benchmark run before and after them says they do not hurt."""

    from primefs.index.db import find_session
    from primefs.store.control import REFINE_FILE, runner_lock
    from primefs.store.fsutil import ring, write_atomic

    ws = _ws(ctx)
    s = find_session(ws.sessions, session)
    if model:
        ws.resolve_model(model)
    request = {"instructions": instructions, "scope": scope, "model": model, "gate": _gate(gate_bench, gate_n,
                                                                                          gate_seed, gate_model)}
    with runner_lock(ws) as no_runner:
        if not no_runner:  # a runner owns the session's history: let it do the work
            write_atomic(s.dir / REFINE_FILE, json.dumps(request))
            ring(s.dir)
            emit(as_json, {"session": s.id, "name": s.name, "requested": True},
                 f"refine requested; the running runner applies it (see `primefs log {s.id}`)")
            return
        # holding the runner lock: no runner can start and write this history meanwhile
        from primefs.eval import run_gate
        from primefs.runner.core import refine_offline

        result = refine_offline(ws, s.id, request, log=lambda m: click.echo(m, err=True), gate_runner=run_gate)
    if result.get("error"):  # one line, printed once by the CLI's error handler
        raise PrimefsError(f"refine failed: {result['error']}")
    emit(as_json, {"session": s.id, "name": s.name, "requested": False, "applied": result["applied"],
                   "rejected": result["rejected"], "outcomes": result.get("outcomes", []), "gate": result.get("gate"),
                   "proposal": result.get("proposal")}, "\n".join(_refine_lines(result)))
    sys.stdout.flush()


def _gate(bench, n, seed, model) -> dict | None:
    if bench is None:
        if n is not None or seed is not None or model is not None:
            raise PrimefsError("-n, --seed and --gate-model go with --gate BENCH")
        return None
    if (n is not None and n < 1) or (seed is not None and seed < 0):
        raise PrimefsError("--gate: -n must be at least 1 and --seed at least 0")
    return {k: v for k, v in {"benchmark": bench, "n": n, "seed": seed, "model": model}.items() if v is not None}


def _refine_lines(result: dict) -> list[str]:
    lines = []
    if gate := result.get("gate"):
        verdict = "kept" if gate["kept"] else "rejected"
        lines.append(f"gate {gate['benchmark']}: {verdict} (before {gate['before']:.3f}, after {gate['after']:.3f}, "
                     f"{gate['items']} items; runs {', '.join(gate['runs'])})")
    lines += [f"applied {a['op']} {a['kind']}/{a['name']}: {a['commit'] or 'no change'}" for a in result["applied"]]
    lines += [f"rejected {r['edit']}: {r['reason']}" for r in result["rejected"]]
    if result.get("proposal"):
        lines.append(f"kept as a rejected proposal, not applied: {result['proposal']}")
    return lines
