"""`primefs approve`, `primefs deny`, `primefs approvals`: a person's answers to what sessions ask
(docs/long-running.md, "Approvals")."""
from __future__ import annotations

import json

import click

from primefs.cli.options import emit, json_option, print_table, workspace, ws_option
from primefs.index.db import find_session
from primefs.store import approvals


def _answering(verdict: str, doc: str, reason_help: str):
    """`primefs approve` or `primefs deny`: one request of a session, answered through the runner that asked."""
    @click.command(verdict, help=doc)
    @click.argument("session")
    @click.argument("n", type=int, required=False)
    @click.option("--reason", help=reason_help)
    @json_option
    @ws_option
    @click.pass_context
    def command(ctx, session, n, reason, as_json):
        ws = workspace(ctx)
        s = find_session(ws.sessions, session)
        reply = approvals.answer(ws, s.id, n, verdict, reason, "cli")
        emit(as_json, reply, f"approval {reply['approval']} of {s.name} ({s.id}): {reply['verdict']}")
    return command


approve = _answering("approve", """Say yes to approval N of SESSION (without N: the one it waits for). The session
    goes on; the answer, and who gave it, is recorded in its history, its approvals/N.md and a commit. Needs
    the runner that asked.""", "Why (recorded in its history and the request file).")
deny = _answering("deny", """Say no to approval N of SESSION (without N: the one it waits for). A denied cell or
    tool call fails with the reason as its error; a denied cost mark stops the session. Needs the runner that
    asked.""", "Why: the model sees it as the error of what it asked for.")


@click.command("approvals")
@click.argument("session", required=False)
@click.option("-a", "--all", "show_all", is_flag=True, help="Answered ones too, not only those waiting.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per request.")
@ws_option
@click.pass_context
def approvals_cmd(ctx, session, show_all, as_json):
    """What sessions wait for a person's yes (SESSION: only its requests). Answer with
    `primefs approve SESSION N` or `primefs deny SESSION N --reason ...`."""
    ws = workspace(ctx)
    if session:
        dirs = [find_session(ws.sessions, session).dir]
    else:
        dirs = sorted(p.parent for p in ws.sessions.glob("*/approvals"))
    rows = [{"session": d.name, **r} for d in dirs for r in approvals.listing(d, waiting_only=not show_all)]
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("session", "n", "status", "what", "answer"):
        table.add_column(col, overflow="fold")
    for r in rows:
        said = " ".join(str(x) for x in (r.get("by") and f"by {r['by']}", r.get("reason")) if x)
        table.add_row(r["session"], str(r["n"]), str(r.get("status")), str(r.get("what") or r.get("problem") or ""),
                      said)
    print_table(table if rows else ("no approvals" if show_all else "no session waits for an approval"))
