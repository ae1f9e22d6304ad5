"""`primefs archive`: finished session trees leave sessions/ for one zip file each (archive.py)."""
from __future__ import annotations

import fcntl
import json
import time
from contextlib import contextmanager

import click

from primefs.cli.logs import split_list
from primefs.cli.options import workspace, ws_option
from primefs.errors import PrimefsError
from primefs.index import archive
from primefs.store.control import ask_runner, runner_lock
from primefs.views.when import parse_when


@contextmanager
def one_at_a_time(ws, timeout: float):
    """One `primefs archive` at a time: a second waits for the first (which may hold the runner lock
    without being a runner)."""
    ws.state.mkdir(exist_ok=True)
    with open(ws.state / "archive.lock", "a+") as lock:
        deadline, said = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PrimefsError(f"another primefs archive still runs after {timeout:g} s") from None
                if not said:
                    click.echo("another primefs archive is running: waiting for it", err=True)
                    said = True
                time.sleep(0.1)
        yield


def _in_use(ws) -> set[str]:
    """Sessions a running runner works on now (for a dry run: the runner itself decides at the time)."""
    from primefs.store.control import runner_state

    state = runner_state(ws).get("state") or {}
    return {sid for key in ("active_sessions", "waiting_sessions", "queued_sessions") for sid in state.get(key) or []}


@click.command("archive")
@click.option("--before", metavar="DATE", help="Only trees with no event since DATE: 2026-11-29, '2026-11-29 14:00' "
              "(local), or 30m, 2h, 7d, 1w (ago).")
@click.option("--status", "statuses", metavar="LIST", default=",".join(archive.DEFAULT_STATUSES), show_default=True,
              help="Statuses every session of a tree must have: idle, done, stopped, failed (comma-separated).")
@click.option("--dry-run", is_flag=True, help="Only say what would be archived.")
@click.option("--timeout", type=float, default=600.0, show_default=True, metavar="S",
              help="With a runner running (it does the work): how long to wait for it.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON object.")
@ws_option
@click.pass_context
def archive_cmd(ctx, before, statuses, dry_run, timeout, as_json):
    """Move finished session trees out of sessions/, each into one committed file archive/<root id>.zip.

    A tree goes whole (a root and all its descendants) or not at all: never with a session that is not
    finished, has unread mail or heartbeats, or is in use by a runner. Archived sessions stay searchable
    (`primefs logs`) and readable (`primefs log`); `unzip archive/<id>.zip` brings a tree back.
    """
    ws = workspace(ctx)
    args = {"before": parse_when(before, "--before"),
            "statuses": split_list(statuses, "--status", archive.FINISHED)}
    if dry_run:
        in_use = _in_use(ws)
        result = archive.run(ws, before=args["before"], statuses=tuple(args["statuses"]), dry_run=True,
                             busy=in_use.__contains__)
    else:
        with one_at_a_time(ws, timeout), runner_lock(ws) as held:
            result = (archive.run(ws, before=args["before"], statuses=tuple(args["statuses"])) if held
                      else ask_runner(ws, {"op": "archive", **args}, timeout, busy_hint=(
                          " (it is still archiving, or busy); see `primefs status`, or wait longer with --timeout")))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    verb = "would archive" if dry_run else "archived"
    click.echo(f"{verb} {len(result['trees']):,} tree(s), {result['sessions']:,} session(s)")
    for t in result["trees"]:
        click.echo(f"  {t['root']} ({t['name']}): {t['sessions']:,} session(s) -> {t['file']}")
    if result["skipped"]:
        click.echo("left in sessions/: " + ", ".join(f"{n:,} tree(s) {why}" for why, n in sorted(result["skipped"].items())))
    if result.get("kept_aside"):
        click.echo("kept aside (a session or goal of the same name came back while its tree was put back; "
                   "look, then move or delete): " + ", ".join(result["kept_aside"]))
